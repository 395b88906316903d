"""HashKV and snapshots (take, check, restore) of a running engine, while
writes and compactions go on."""

from __future__ import annotations

import json
import os
import threading

import pytest

from brain.engine import Engine
from brain.migrate import snapshot as snaps
from brain.mvcc import errors
from brain.mvcc.kvhash import covered_revisions
from brain.mvcc.key_index import KeyIndex
from brain.mvcc.requests import (
    CompactRequest,
    DeleteRangeRequest,
    LeaseGrantRequest,
    PutRequest,
    RangeRequest,
)
from brain.mvcc.revision import pack
from tests.support.engines import dump, opened_engines

pytestmark = pytest.mark.timeout(120)


def workload(eng: Engine) -> None:
    """Puts, overwrites, deletes, recreations and a lease across shards."""
    eng.lease_grant(LeaseGrantRequest(100, 7))
    for i in range(60):
        eng.put(PutRequest(b"%s%02d" % (b"aqz"[i % 3:i % 3 + 1], i % 17), b"v%d" % i))
    eng.delete_range(DeleteRangeRequest(b"a05", b"a09"))
    eng.put(PutRequest(b"a06", b"again"))
    eng.put(PutRequest(b"leased", b"x", lease=7))
    eng.delete_range(DeleteRangeRequest(b"q00", b"q03"))


@pytest.fixture
def engines(tmp_path):
    with opened_engines(tmp_path) as make:
        yield make


# ---------------------------------------------------------------------------
# which revisions compaction keeps


def test_covered_revisions_follow_compaction_rules():
    ki = KeyIndex(b"k")
    # put 2, put 3, delete 4, put 6, put 7
    for main in (2, 3):
        ki.put(pack(main))
    ki.tombstone(pack(4))
    for main in (6, 7):
        ki.put(pack(main))
    mains = lambda revs: [r >> 32 for r in revs]  # noqa: E731
    assert mains(covered_revisions(ki, -1, 7)) == [2, 3, 4, 6, 7]
    assert mains(covered_revisions(ki, -1, 5)) == [2, 3, 4]
    assert mains(covered_revisions(ki, 3, 7)) == [3, 4, 6, 7]  # 3 kept: a read at 3 finds it
    # a tombstone exactly at the compaction revision is kept (brain keeps it for
    # watches from that revision); below it, the generation is gone
    assert mains(covered_revisions(ki, 4, 7)) == [4, 6, 7]
    assert mains(covered_revisions(ki, 5, 7)) == [6, 7]
    assert mains(covered_revisions(ki, 6, 6)) == [6]
    assert mains(covered_revisions(ki, 6, 7)) == [6, 7]
    assert covered_revisions(ki, -1, -1) == []


# ---------------------------------------------------------------------------
# HashKV


def test_hashkv_is_stable_across_restart_layout_and_physical_compaction(engines, tmp_path):
    a = engines("a", 3)
    b = engines("b", 1)
    for eng in (a, b):
        workload(eng)
    ha, hb = snaps.hash_kv(a), snaps.hash_kv(b)
    assert ha == hb  # same history, different shard layouts
    assert ha.hash_revision == ha.current_revision == a.committed_rev
    assert ha.compact_revision == -1
    # compaction changes the hash (history is dropped) the same way everywhere,
    # whether the physical part is done or not
    a.compact(CompactRequest(30, physical=True))
    b.compact(CompactRequest(30, physical=False))
    ha, hb = snaps.hash_kv(a, 50), snaps.hash_kv(b, 50)
    assert ha == hb and ha.compact_revision == 30 and ha.hash_revision == 50
    a.checkpoint()
    a.close()
    a2 = engines("a", 3)
    assert snaps.hash_kv(a2, 50) == ha
    assert snaps.hash_kv(a2) == snaps.hash_kv(b)


def test_hashkv_revision_rules_are_etcds(engines):
    eng = engines("e")
    empty = snaps.hash_kv(eng)
    assert (empty.hash_revision, empty.current_revision) == (1, 1)
    for i in range(10):
        eng.put(PutRequest(b"k%d" % i, b"v"))
    assert snaps.hash_kv(eng, 1).hash == empty.hash  # nothing at revision 1
    assert snaps.hash_kv(eng, 5) != snaps.hash_kv(eng, 6)
    with pytest.raises(errors.EtcdError) as e:
        snaps.hash_kv(eng, 12)
    assert e.value == errors.ErrFutureRev
    eng.compact(CompactRequest(6))
    with pytest.raises(errors.EtcdError) as e:
        snaps.hash_kv(eng, 5)
    assert e.value == errors.ErrCompacted
    assert snaps.hash_kv(eng, 6).hash_revision == 6  # the compaction revision itself is readable
    neg = snaps.hash_kv(eng, -1)  # etcd: a negative revision hashes nothing
    assert (neg.hash, neg.hash_revision) == (empty.hash, -1)


def test_hash_covers_leases_too(engines):
    a, b = engines("a"), engines("b")
    for eng in (a, b):
        eng.put(PutRequest(b"k", b"v"))
    assert snaps.hash_all(a) == snaps.hash_all(b)
    a.lease_grant(LeaseGrantRequest(60, 5))
    assert snaps.hash_all(a)[0] != snaps.hash_all(b)[0]


# ---------------------------------------------------------------------------
# snapshots


@pytest.mark.parametrize("target_shards", [3, 1])
def test_snapshot_restore_roundtrip(engines, tmp_path, target_shards):
    src = engines("src", 3)
    workload(src)
    src.compact(CompactRequest(20))
    src.put(PutRequest(b"after", b"compaction"))
    path = str(tmp_path / "snap.db")
    info = snaps.save_snapshot(src, path)
    size = os.path.getsize(path)
    assert size % 512 == 32 and info.size == size - 32 and size % 4096 == 32
    st = snaps.status(path)
    assert st.format == "etcd" and st.revision == src.committed_rev and st.compact_revision == 20
    assert st.total_keys == len(dump(src)) and st.revisions == info.records and st.leases == 1
    assert st.total_size == info.size and st.version == "3.6.0"

    kw = {"boundaries": [b"f", b"p"]} if target_shards == 3 else {"shards": 1, "boundaries": []}
    res = snaps.restore(path, str(tmp_path / "dst"), name="restored", **kw)
    assert (res.revision, res.compact_revision, res.shards) == (src.committed_rev, 20, target_shards)
    dst = engines("dst", target_shards)
    assert (dst.cluster_id, dst.member_id) != (src.cluster_id, src.member_id)
    assert dst.committed_rev == src.committed_rev and dst.store.compact_rev == 20
    for rev in range(20, src.committed_rev + 1):
        assert dump(dst, rev) == dump(src, rev), rev
    with pytest.raises(errors.EtcdError):
        dst.range(RangeRequest(b"a", revision=19))
    assert snaps.hash_kv(dst) == snaps.hash_kv(src)
    assert sorted(dst.store.lessor.leases) == [7]
    assert dst.store.lessor.lease_of(b"leased") == 7
    # the restored server takes writes after the snapshot's revision
    assert dst.put(PutRequest(b"new", b"1")).revision == src.committed_rev + 1


def test_snapshot_is_consistent_while_writes_and_compactions_go_on(engines, tmp_path, monkeypatch):
    from brain.migrate import etcd_export

    monkeypatch.setattr(etcd_export, "KEYS_PER_HOLD", 5)  # many lock releases in both passes
    monkeypatch.setattr(etcd_export, "RECORDS_PER_HOLD", 7)
    src = engines("src", 3)
    workload(src)
    src.compact(CompactRequest(10))
    stop = threading.Event()
    errs = []

    progress = threading.Condition()
    written = [0]

    def writer():
        i = 0
        try:
            while not stop.is_set():
                src.put(PutRequest(b"a%02d" % (i % 17), b"w%d" % i))
                src.delete_range(DeleteRangeRequest(b"q%02d" % (i % 17)))
                i += 1
                with progress:
                    written[0] = i
                    progress.notify_all()
        except Exception as e:  # noqa: BLE001
            errs.append(e)
        finally:
            with progress:
                progress.notify_all()

    def wait_for_writes(n: int) -> None:
        with progress:
            assert progress.wait_for(lambda: written[0] >= n or errs, timeout=30), f"{written[0]} of {n} writes"

    # A compaction (logical and, but for the pin, physical) in the middle of
    # either pass must not take history the export has yet to read.
    covered, records = etcd_export._covered, etcd_export._records
    injected = []

    def covered_with_compaction(pinned):
        rev = pinned.revision
        src.compact(CompactRequest(rev - 3))
        injected.append(rev - 3)
        return covered(pinned)

    def records_with_compaction(pinned, revs, progress):
        for n, item in enumerate(records(pinned, revs, progress)):
            if n == 20:
                rev = max(r >> 48 for r in revs)
                src.compact(CompactRequest(rev - 1))
                injected.append(rev - 1)
            yield item

    monkeypatch.setattr(etcd_export, "_covered", covered_with_compaction)
    monkeypatch.setattr(etcd_export, "_records", records_with_compaction)
    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_for_writes(20)  # the writer is going before the snapshot starts
        # history the snapshot must carry, read before the compaction drops it
        before = {rev: dump(src, rev) for rev in range(10, src.committed_rev + 1)}
        path = str(tmp_path / "snap.db")
        info = snaps.save_snapshot(src, path)
        wait_for_writes(written[0] + 5)  # and goes on after it
    finally:
        stop.set()
        t.join()
    assert not errs
    assert len(injected) == 2 and info.compact_revision == 10
    assert src.committed_rev > info.revision
    st = snaps.status(path)
    snaps.restore(path, str(tmp_path / "dst"), boundaries=[b"f", b"p"])
    dst = engines("dst", 3)
    assert dst.committed_rev == info.revision and dst.store.compact_rev == 10
    assert dump(dst) == dump(src, info.revision)
    for rev in range(src.store.compact_rev, info.revision + 1):
        assert dump(dst, rev) == dump(src, rev)
    for rev, want in before.items():
        assert dump(dst, rev) == want, rev
    assert st.total_keys == len(dump(dst))


def test_snapshot_damage_is_detected(engines, tmp_path):
    src = engines("src")
    workload(src)
    path = str(tmp_path / "snap.db")
    snaps.save_snapshot(src, path)
    data = bytearray(open(path, "rb").read())

    bad = tmp_path / "flipped.db"
    flipped = bytearray(data)
    flipped[5000] ^= 1
    bad.write_bytes(bytes(flipped))
    with pytest.raises(snaps.SnapshotError, match="sha256 mismatch"):
        snaps.status(str(bad))
    with pytest.raises(snaps.SnapshotError, match="sha256 mismatch"):
        snaps.restore(str(bad), str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()

    # without its digest the file is a plain database: still readable
    cut = tmp_path / "cut.db"
    cut.write_bytes(bytes(data[:-32]))
    assert snaps.status(str(cut)).revision == src.committed_rev

    # a damaged page with a recomputed digest still fails bbolt's checks
    import hashlib
    body = bytearray(data[:-32])
    body[3 * 4096] ^= 0xFF  # the id of the first data page
    forged = tmp_path / "forged.db"
    forged.write_bytes(bytes(body) + hashlib.sha256(body).digest())
    with pytest.raises(snaps.SnapshotError, match="page 3"):
        snaps.status(str(forged))

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("x")
    with pytest.raises(snaps.SnapshotError, match="not brain's"):
        snaps.restore(path, str(occupied))
    assert (occupied / "file").read_text() == "x"

    notsnap = tmp_path / "other.db"
    notsnap.write_bytes(b"\0" * 4096 + b"\1" * 32)
    with pytest.raises(snaps.SnapshotError):
        snaps.status(str(notsnap))


def test_legacy_snapshots_are_still_read(engines, tmp_path):
    """A snapshot in brain's earlier format (written here by hand, as that
    writer did) restores with its layout, leases and compaction."""
    import hashlib
    import json
    import struct

    from brain.mvcc.codec import encode_record

    src = engines("src")
    workload(src)
    src.compact(CompactRequest(20, physical=True))
    rev, compact = src.committed_rev, src.store.compact_rev
    entries = []
    for shard in src.store.shards:
        for key in shard.index:
            for r in covered_revisions(shard.index[key], compact, rev):
                entries.append((r, encode_record(shard.record(r))))
    header = {"format": 1, "revision": rev, "compact_revision": compact, "leases": [[7, 100]],
              "boundaries": ["66", "70"], "cluster_id": 1, "member_id": 2, "storage_version": "3.6.0"}
    head = json.dumps(header).encode()
    body = struct.pack("<8sII", b"BRAINSNP", 1, len(head)) + head
    h = snaps.KvHasher()
    for r, data in entries:
        body += struct.pack("<cI", b"R", 16 + len(data)) + r.to_bytes(16, "big") + data
        if snaps.hashed(r, data, compact):
            h.update(r.to_bytes(16, "big") + data)
    live = len(dump(src))
    body += struct.pack("<cQQI", b"E", len(entries), live, h.value)
    body += b"\0" * (-len(body) % 512)
    path = tmp_path / "old.snap"
    path.write_bytes(body + hashlib.sha256(body).digest())

    st = snaps.status(str(path))
    assert (st.format, st.revision, st.total_keys, st.hash) == ("brain-1", rev, live, snaps.hash_kv(src).hash)
    res = snaps.restore(str(path), str(tmp_path / "dst"))
    assert res.format == "brain-1" and res.shards == 3
    dst = engines("dst", 3)
    for at in range(compact, rev + 1):
        assert dump(dst, at) == dump(src, at)
    assert dst.store.lessor.lease_of(b"leased") == 7


def test_tombstone_at_the_compaction_revision_travels_in_snapshots(engines, tmp_path):
    src = engines("src", 1)
    src.put(PutRequest(b"k", b"v"))  # 2
    src.delete_range(DeleteRangeRequest(b"k"))  # 3
    src.put(PutRequest(b"j", b"v"))  # 4
    before = snaps.hash_kv(src, 4)
    src.compact(CompactRequest(3, physical=True))
    path = str(tmp_path / "s.db")
    info = snaps.save_snapshot(src, path)
    assert info.records == 2  # the tombstone at 3 and j's put
    assert snaps.hash_kv(src).hash != before.hash
    snaps.restore(path, str(tmp_path / "dst"), shards=1, boundaries=[])
    dst = engines("dst", 1)
    assert b"k" in dst.store.shards[0].index  # a watch from 3 can still see the delete
    assert snaps.hash_kv(dst) == snaps.hash_kv(src)
    assert dump(dst) == dump(src) == [(b"j", b"v", 4, 4, 1, 0)]


def test_a_snapshot_can_start_a_replica_at_its_journal_position(engines, tmp_path):
    """A peer's snapshot carries its journal index (etcd's consistent_index)
    and epoch (etcd's term): restored as a replica, the directory keeps the
    cluster ID and that journal position; restored plainly, neither."""
    src = engines("src", 1)
    workload(src)
    path = str(tmp_path / "s.db")
    info = snaps.save_snapshot(src, path)
    assert info.journal_index == src.journal.last_index > 0
    snaps.restore(path, str(tmp_path / "replica"), shards=1, boundaries=[], replica_of=src.cluster_id)
    snaps.restore(path, str(tmp_path / "plain"), shards=1, boundaries=[])
    from brain import backend as backend_mod
    from brain.engine.checkpoint_meta import META_CHECKPOINT
    from brain.engine.datadir import META_IDENTITY

    def meta(name):
        be = backend_mod.open_backend("lmdb", str(tmp_path / name / "values"), 1)
        try:
            return json.loads(be.get_meta(META_CHECKPOINT)), json.loads(be.get_meta(META_IDENTITY))
        finally:
            be.close()

    (cp, ident), (cp2, ident2) = meta("replica"), meta("plain")
    assert (cp["journal_index"], cp["epoch"], ident["cluster_id"]) == (info.journal_index, src.term,
                                                                       src.cluster_id)
    assert cp2["journal_index"] == 0 and "epoch" not in cp2 and ident2["cluster_id"] != src.cluster_id


def test_a_sha256_refusal_suggests_skip_hash_check_only_where_the_command_has_it(engines, tmp_path, capsys):
    """`brain snapshot status` of a damaged file said "--skip-hash-check
    reads it anyway", a flag status refuses; restore and import have it."""
    from brain.cli import import_etcd as import_cli
    from brain.cli import snapshot as snapshot_cli

    src = engines("src")
    workload(src)
    path = tmp_path / "snap.db"
    snaps.save_snapshot(src, str(path))
    data = bytearray(path.read_bytes())
    data[5000] ^= 1
    flip = tmp_path / "flip.db"
    flip.write_bytes(bytes(data))

    def run(main, *argv) -> str:
        capsys.readouterr()
        assert main(list(argv)) == 1
        return capsys.readouterr().err

    err = run(snapshot_cli.main, "status", str(flip))
    assert "sha256 mismatch" in err and "skip-hash-check" not in err, err
    with pytest.raises(SystemExit):  # what it must not suggest: status has no such flag
        snapshot_cli.build_parser().parse_args(["status", str(flip), "--skip-hash-check"])
    capsys.readouterr()

    for main, argv in ((snapshot_cli.main, ["restore", str(flip), "--data-dir", str(tmp_path / "r")]),
                       (import_cli.main, [str(flip), "--data-dir", str(tmp_path / "i")])):
        err = run(main, *argv)
        assert "sha256 mismatch" in err and "(--skip-hash-check reads it anyway)" in err, err
        parser = snapshot_cli.build_parser() if main is snapshot_cli.main else import_cli.build_parser()
        assert parser.parse_args([*argv, "--skip-hash-check"]).skip_hash_check is True
