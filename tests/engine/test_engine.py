"""The engine: group commit, recovery from checkpoint + journal tail,
compaction scheduling, quota, and what happens when the journal fails."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from brain.backend import BackendFullError
from brain.engine import DataDirLocked, Engine, EngineConfig
from brain.engine.alarms import ALARM_NOSPACE
from brain.mvcc import errors
from brain.mvcc.requests import (
    CompactRequest,
    DeleteRangeRequest,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)


@pytest.fixture(params=[1, 3], ids=["1shard", "3shards"])
def config(request, tmp_path):
    boundaries = [] if request.param == 1 else [b"f", b"p"]
    return EngineConfig(str(tmp_path / "data"), shards=request.param, shard_boundaries=boundaries)


def dump(engine: Engine) -> list:
    res = engine.range(RangeRequest(b"\x00", b"\x00"))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in res.kvs]


def test_concurrent_writers_share_batches_and_revisions_are_dense(config):
    eng = Engine.open(config)
    revs = []
    lock = threading.Lock()

    def writer(i):
        for j in range(50):
            r = eng.put(PutRequest(b"k%02d-%02d" % (i, j), b"v"))
            with lock:
                revs.append(r.revision)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(revs) == list(range(2, 402))
    st = eng.statistics()
    assert st.requests == 400 and st.batches <= 400
    eng.close()


def test_recovery_from_journal_only_and_from_checkpoint_plus_tail(config):
    eng = Engine.open(config)
    for i in range(30):
        eng.put(PutRequest(b"key%d" % i, b"v%d" % i))
    eng.delete_range(DeleteRangeRequest(b"key1", b"key2"))
    before = dump(eng)
    rev = eng.committed_rev
    eng.close(checkpoint=False)  # as a crash leaves it: the journal's tail to replay

    eng = Engine.open(config)
    assert dump(eng) == before and eng.committed_rev == rev
    eng.checkpoint()
    for i in range(5):
        eng.put(PutRequest(b"tail%d" % i, b"t"))
    after = dump(eng)
    eng.close()
    eng = Engine.open(config)
    assert dump(eng) == after
    assert eng.statistics().journal_bytes_since_checkpoint == 0  # close checkpointed
    eng.close()


def test_history_and_compaction_survive_restart(config):
    eng = Engine.open(config)
    for i in range(10):
        eng.put(PutRequest(b"a", b"%d" % i))
    assert eng.range(RangeRequest(b"a", revision=5)).kvs[0].value == b"3"
    eng.compact(CompactRequest(6, physical=True))
    eng.close()
    eng = Engine.open(config)
    with pytest.raises(errors.EtcdError) as e:
        eng.range(RangeRequest(b"a", revision=5))
    assert e.value == errors.ErrCompacted
    assert eng.range(RangeRequest(b"a", revision=6)).kvs[0].value == b"4"
    assert eng.range(RangeRequest(b"a")).kvs[0].version == 10
    with pytest.raises(errors.EtcdError) as e:
        eng.compact(CompactRequest(6))
    assert e.value == errors.ErrCompacted
    eng.close()


def test_physical_compaction_waits_for_completion(tmp_path):
    cfg = EngineConfig(str(tmp_path / "d"), shards=1, shard_boundaries=[], compaction_step_keys=10)
    eng = Engine.open(cfg)
    for i in range(200):
        eng.put(PutRequest(b"k%03d" % i, b"1"))
        eng.put(PutRequest(b"k%03d" % i, b"2"))
    rev = eng.committed_rev
    eng.compact(CompactRequest(rev, physical=True))
    assert not eng.store.compacting and eng.store.compact_done_rev == rev
    # Every superseded revision is gone from memory.
    assert all(len(ki.generations[0].revs) == 1 for ki in eng.store.shards[0].index.values())
    eng.close()


def test_data_dir_is_locked(config):
    eng = Engine.open(config)
    with pytest.raises(DataDirLocked):
        Engine.open(config)
    eng.close()


def test_shard_layout_cannot_change(tmp_path):
    cfg = EngineConfig(str(tmp_path / "d"), shards=2, shard_boundaries=[b"m"])
    Engine.open(cfg).close()
    with pytest.raises(ValueError, match="resharding"):
        Engine.open(EngineConfig(str(tmp_path / "d"), shards=2, shard_boundaries=[b"n"]))


def test_quota_refuses_puts_but_allows_deletes(tmp_path):
    cfg = EngineConfig(str(tmp_path / "d"), shards=1, shard_boundaries=[], quota_backend_bytes=64 << 10)
    eng = Engine.open(cfg)
    with pytest.raises(errors.EtcdError) as e:
        for i in range(1000):
            eng.put(PutRequest(b"k%d" % i, b"x" * 1024))
    assert e.value == errors.ErrNoSpace
    eng.delete_range(DeleteRangeRequest(b"k", b"l"))
    assert eng.range(RangeRequest(b"k", b"l", count_only=True)).count == 0
    eng.close()


def test_nospace_alarm_refuses_what_etcd_costs_above_zero(tmp_path):
    """etcd 3.6 under NOSPACE (apply.applierV3Capped) refuses a Put, a
    LeaseGrant and a Txn whose costTxn is above 0: one with a Put directly in
    its success or failure branch.  Deletes, a Txn that only deletes and a
    Txn whose Puts sit in a nested Txn (costTxn does not look into those)
    are applied."""
    from brain.engine.alarms import ALARM_NOSPACE

    eng = Engine.open(EngineConfig(str(tmp_path / "d"), shards=1, shard_boundaries=[]))
    eng.put(PutRequest(b"a", b"1"))
    eng.put(PutRequest(b"b", b"1"))
    eng.alarm_activate(eng.member_id, ALARM_NOSPACE)
    refused = [
        PutRequest(b"c", b"1"),
        LeaseGrantRequest(60, 7),
        TxnRequest([], [PutRequest(b"c", b"1")], []),
        TxnRequest([], [DeleteRangeRequest(b"a")], [PutRequest(b"c", b"1")]),
    ]
    for req in refused:
        with pytest.raises(errors.EtcdError) as e:
            eng.submit(req).result()
        assert e.value == errors.ErrNoSpace, req
    assert eng.txn(TxnRequest([], [DeleteRangeRequest(b"a")], [])).succeeded
    assert eng.txn(TxnRequest([], [TxnRequest([], [PutRequest(b"n", b"1")], [])], [])).succeeded
    assert eng.delete_range(DeleteRangeRequest(b"b")).deleted == 1
    assert [kv.key for kv in eng.range(RangeRequest(b"\x00", b"\x00")).kvs] == [b"n"]
    eng.close()


def test_journal_failure_stops_writes_but_reads_stay_at_committed_state(config, monkeypatch):
    eng = Engine.open(config)
    eng.put(PutRequest(b"a", b"1"))

    def broken(payload):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eng.journal, "append", broken)
    with pytest.raises(errors.EtcdError) as e:
        eng.put(PutRequest(b"b", b"2"))
    assert e.value == errors.ErrNoSpace
    # The unjournaled write is invisible: reads are served at the committed revision.
    assert [kv.key for kv in eng.range(RangeRequest(b"a", b"\x00")).kvs] == [b"a"]
    with pytest.raises(errors.EtcdError):
        eng.put(PutRequest(b"c", b"3"))
    assert eng.statistics().failed


def test_checkpoint_without_space_raises_nospace_and_backs_off(config, monkeypatch):
    """Issue 27: a checkpoint that finds the disk full raises the NOSPACE
    alarm (in memory when it cannot be stored either): puts are refused
    with etcd's error, deletes still go to the journal, and the checkpoint
    is not retried after every batch; nothing acknowledged is lost."""
    config.checkpoint_journal_bytes = 1  # due after every batch
    eng = Engine.open(config)
    eng.put(PutRequest(b"a", b"1"))
    eng.checkpoint()
    checkpoints = []

    def full(batch):
        if batch.puts or batch.deletes:
            checkpoints.append(time.monotonic())
        raise BackendFullError("no space left")

    monkeypatch.setattr(eng.backend, "write", full)
    eng.put(PutRequest(b"b", b"2"))  # journaled: acknowledged
    deadline = time.monotonic() + 10
    while not eng.alarms.has(ALARM_NOSPACE):
        assert time.monotonic() < deadline, "no NOSPACE alarm"
        time.sleep(0.02)
    with pytest.raises(errors.EtcdError) as e:
        eng.put(PutRequest(b"c", b"3"))
    assert e.value == errors.ErrNoSpace
    for i in range(10):  # each journaled, each making a checkpoint due
        eng.delete_range(DeleteRangeRequest(b"x%d" % i))
        time.sleep(0.02)
    assert eng.delete_range(DeleteRangeRequest(b"a")).deleted == 1
    assert len(checkpoints) == 1, checkpoints  # the next try waits a second
    eng.close()
    monkeypatch.undo()
    eng = Engine.open(config)
    assert [kv.key for kv in eng.range(RangeRequest(b"\x00", b"\x00")).kvs] == [b"b"]
    assert not eng.alarms.has(ALARM_NOSPACE)  # it could not be stored
    eng.close()


def test_leases_are_durable(config):
    eng = Engine.open(config)
    eng.lease_grant(LeaseGrantRequest(ttl=30, id=7))
    eng.put(PutRequest(b"leased", b"v", lease=7))
    with pytest.raises(errors.EtcdError) as e:
        eng.put(PutRequest(b"x", b"v", lease=8))
    assert e.value == errors.ErrLeaseNotFound
    eng.close()
    eng = Engine.open(config)
    assert eng.range(RangeRequest(b"leased")).kvs[0].lease == 7
    eng.lease_revoke(LeaseRevokeRequest(7))
    assert eng.range(RangeRequest(b"leased")).kvs == []
    eng.close()
    eng = Engine.open(config)
    assert eng.range(RangeRequest(b"leased")).kvs == []
    with pytest.raises(errors.EtcdError) as e:
        eng.lease_revoke(LeaseRevokeRequest(7))
    assert e.value == errors.ErrLeaseNotFound
    eng.close()


def test_readonly_txn_does_not_go_through_the_journal(config):
    eng = Engine.open(config)
    eng.put(PutRequest(b"a", b"1"))
    batches = eng.statistics().batches
    res = eng.txn(TxnRequest([], [RangeRequest(b"a")], []))
    assert res.succeeded and res.responses[0].kvs[0].value == b"1"
    assert eng.statistics().batches == batches
    eng.close()
