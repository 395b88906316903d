"""A leader's batches in flight on a pipelined journal (brain.engine.pipeline):
visible and answered only once acknowledged, in append order; an answer
decided without a record waits behind them; a refusal fails every batch in
flight; the committer waits for room; a checkpoint waits for the drain.
The journal here holds acknowledgements back on the test's word."""

from __future__ import annotations

import time

import pytest

from brain.engine import Engine, EngineConfig
from brain.engine.pipeline import MAX_IN_FLIGHT
from brain.mvcc import errors
from brain.mvcc.requests import CMP_EQUAL, CMP_MOD, Compare, PutRequest, RangeRequest, TxnRequest
from tests.support.memory_journal import WAIT, ClusterStub, PipelinedMemoryJournal, Stream, key_held


@pytest.fixture
def leader(tmp_path):
    stream = Stream()
    stub = ClusterStub()
    eng = Engine.open(EngineConfig(data_dir=str(tmp_path / "lead"), backend="memory"),
                      journal=PipelinedMemoryJournal(stream), cluster_id=1, cluster=stub.hooks())
    assert eng.committer.pipeline is not None
    assert eng.promote(key_held)
    yield eng, stream, stub
    eng.journal.acks.set()
    eng.close()


def _in_flight(eng: Engine, request):
    """Submit and let the committer append it (its own batch)."""
    fut = eng.submit(request)
    time.sleep(0.05)
    return fut


def test_a_batch_in_flight_is_invisible_until_acknowledged_then_answered_in_order(leader):
    eng, stream, _ = leader
    before = eng.committed_rev
    eng.journal.acks.clear()
    first = _in_flight(eng, PutRequest(b"a", b"1"))
    second = _in_flight(eng, PutRequest(b"b", b"2"))
    assert not first.done() and not second.done()
    assert eng.committed_rev == before and eng.range(RangeRequest(b"a")).kvs == []
    assert len(eng.journal._unsynced) == 2  # both published, neither acknowledged
    eng.journal.acks.set()
    assert first.result(WAIT).revision == before + 1 and second.result(WAIT).revision == before + 2
    assert eng.committed_rev == before + 2 and eng.range(RangeRequest(b"b")).kvs[0].value == b"2"


@pytest.mark.parametrize("lease", [True, False], ids=["lease", "barrier"])
def test_a_failed_compare_decided_on_a_batch_in_flight_waits_for_it(leader, lease):
    eng, stream, stub = leader
    stub.lease = lease
    eng.journal.acks.clear()
    put = _in_flight(eng, PutRequest(b"k", b"v"))
    create = _in_flight(eng, TxnRequest([Compare(CMP_EQUAL, CMP_MOD, b"k", b"", "mod_revision", 0)],
                                        [PutRequest(b"k", b"other")], [RangeRequest(b"k")]))
    time.sleep(0.1)
    assert not put.done() and not create.done()  # it saw k, which is not durable yet
    eng.journal.acks.set()
    rev = put.result(WAIT).revision
    res = create.result(WAIT)
    assert not res.succeeded and res.responses[0].kvs[0].mod_revision == rev and res.revision >= rev


def test_a_refusal_fails_every_batch_in_flight_and_the_leader_steps_down(leader):
    eng, stream, _ = leader
    eng.journal.acks.clear()
    futures = [_in_flight(eng, PutRequest(b"k%d" % i, b"v")) for i in range(3)]
    with stream.cv:
        stream.records.append(b"")  # another writer's record: every fence now fails
        stream.cv.notify_all()
    ours = len(stream.records)
    eng.journal.acks.set()
    for fut in futures:
        with pytest.raises(errors.EtcdError) as e:
            fut.result(WAIT)
        assert e.value == errors.ErrLeaderChanged
    deadline = time.monotonic() + WAIT
    while eng.is_leader and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not eng.is_leader and len(stream.records) == ours


def test_the_committer_keeps_at_most_max_in_flight(leader):
    eng, stream, _ = leader
    eng.journal.acks.clear()
    futures = [_in_flight(eng, PutRequest(b"k%d" % i, b"v")) for i in range(MAX_IN_FLIGHT + 3)]
    time.sleep(0.2)
    assert len(eng.journal._unsynced) == MAX_IN_FLIGHT
    eng.journal.acks.set()
    revisions = [f.result(WAIT).revision for f in futures]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)


def test_a_checkpoint_cuts_the_store_only_once_the_pipeline_drained(leader):
    eng, stream, _ = leader
    eng.journal.acks.clear()
    put = _in_flight(eng, PutRequest(b"k", b"v"))
    done = []
    import threading

    t = threading.Thread(target=lambda: (eng.checkpoint(), done.append(True)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not done  # waits for the batch in flight
    eng.journal.acks.set()
    t.join(WAIT)
    assert done and put.result(WAIT).revision == eng.committed_rev
    assert eng.checkpoint_index() == eng.applied_index == len(stream.records)


def test_one_batch_in_flight_while_a_replica_would_apply_stale_messages(leader):
    """A replica of an older brain (its member entry lacks the feature)
    would apply a deposed writer's stale messages: the leader keeps one
    batch in flight, as before the pipeline."""
    eng, stream, stub = leader
    stub.epochs_everywhere = False
    eng.journal.acks.clear()
    futures = [_in_flight(eng, PutRequest(b"k%d" % i, b"v")) for i in range(3)]
    time.sleep(0.2)
    assert len(eng.journal._unsynced) == 1
    eng.journal.acks.set()
    assert [f.result(WAIT).revision for f in futures] == sorted(f.result(WAIT).revision for f in futures)
