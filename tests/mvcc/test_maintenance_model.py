"""Property test: the store against the reference model while its
maintenance interleaves with writes and reads, as the engine runs it
(Engine._maintain: a compaction step of k keys, a merge step of k keys,
checkpoint work, between write batches).

test_store_model.py finishes every compaction before the next operation;
here a compaction is started logically and then advanced a few keys at a
time, with puts, deletes, Txns, lease grants and revokes, merges of the
overlay into packed blocks (with a small overlay floor so that they happen
at this size), a checkpoint cut written later (or abandoned) and restarts
from the value store (a compaction unfinished at the checkpoint starts
again) in between, and a new compaction may replace one still running.
After every operation the reads are compared with the model: every key
alone and the whole key space at the current revision (values, keys_only,
count_only, a limit), counts of sub-ranges (answered from the index's
bookkeeping, not a scan), and reads at the compaction revision, just below
it (refused) and at a past revision.  Each compaction that finishes must
have left no revision in the index that its revision no longer shows.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.backend import MemoryBackend, WriteBatch
from brain.mvcc import errors
from brain.mvcc.requests import (
    CMP_EQUAL,
    CMP_GREATER,
    CMP_LESS,
    CMP_VERSION,
    CompactRequest,
    Compare,
    DeleteRangeRequest,
    KeyValue,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from brain.mvcc.store import Store

from .model import Model
from .test_store_model import check_dead_keys

KEYS = [b"a", b"ab", b"b", b"c", b"k", b"ka", b"m", b"t", b"z"]
LAYOUTS = [[], [b"b"], [b"b", b"k", b"t"]]
LEASES = (1, 2, 3)
COUNTED = [(b"a", b"\x00"), (b"b", b"m"), (b"ab", b"ka"), (b"c", b"l"), (b"ka", b"zz")]

keys = st.sampled_from(KEYS)
values = st.binary(max_size=4)
ends = st.sampled_from([b"", b"", b"\x00", b"c", b"l", b"zz"])
steps = st.integers(1, 4)

OPS = {
    "put": st.tuples(st.just("put"), keys, values, st.sampled_from((0, 0, *LEASES))),
    "del": st.tuples(st.just("del"), keys, ends),
    # compare a key's version; puts to distinct keys, or a delete and a put
    "txn": st.tuples(st.just("txn"), keys, st.sampled_from([CMP_EQUAL, CMP_GREATER, CMP_LESS]), st.integers(0, 3),
                     st.lists(keys, min_size=1, max_size=3, unique=True), keys, values),
    "compact": st.tuples(st.just("compact"), st.integers(0, 8)),  # that many revisions below the current one
    "compaction step": st.tuples(st.just("compaction step"), steps),
    "merge step": st.tuples(st.just("merge step"), steps),
    "range": st.tuples(st.just("range"), keys, ends, st.integers(0, 30), st.integers(0, 3)),
    "grant": st.tuples(st.just("grant"), st.sampled_from(LEASES)),
    "revoke": st.tuples(st.just("revoke"), st.sampled_from(LEASES)),
    "checkpoint cut": st.tuples(st.just("checkpoint cut")),
    "checkpoint written": st.tuples(st.just("checkpoint written")),
    "checkpoint abandoned": st.tuples(st.just("checkpoint abandoned")),
    "restart": st.tuples(st.just("restart")),
}
# How often each kind is drawn: mostly writes and maintenance steps, so
# that steps find work to do and writes land between them.
WEIGHTS = {"put": 8, "del": 2, "txn": 2, "compact": 3, "compaction step": 5, "merge step": 5, "range": 1,
           "grant": 1, "revoke": 1, "checkpoint cut": 1, "checkpoint written": 1, "checkpoint abandoned": 1,
           "restart": 1}
ops = st.sampled_from([kind for kind, weight in WEIGHTS.items() for _ in range(weight)]).flatmap(OPS.__getitem__)


class SmallFloorStore(Store):
    """A store whose merges start at `floor` unmerged keys (the real floor,
    MERGE_FLOOR_KEYS, keeps a store this small in its overlay forever)."""

    floor = 0

    def overlay_floor(self, shard) -> int:
        return self.floor


def new_store(backend, layout: list[bytes], block_size: int, floor: int) -> SmallFloorStore:
    store = SmallFloorStore(backend, layout, block_size=block_size)
    store.floor = floor
    return store


def write_checkpoint(store: Store, cut) -> None:
    """Write a cut's records and deletes to the value store and finish it,
    as the engine's checkpointer does (outside the store lock: writes,
    steps and reads may come between the cut and this)."""
    store.backend.write(WriteBatch(puts=list(cut.records()), deletes=list(cut.deleted())))
    store.checkpoint_done()


def restarted(store: Store, layout: list[bytes], block_size: int, floor: int) -> SmallFloorStore:
    """The store recovered from a checkpoint taken now, as the engine opens
    its data directory: the index packed from the value store's records, a
    compaction the checkpoint records as unfinished started again."""
    cut = store.checkpoint_cut()
    write_checkpoint(store, cut)
    fresh = new_store(store.backend, layout, block_size, floor)
    fresh.load_checkpoint(cut.revision, cut.leases, compact_rev=cut.compact_rev,
                          compaction_finished=cut.compact_done_rev >= cut.compact_rev)
    return fresh


def check_range(store: Store, m: Model, key: bytes, end: bytes, rev: int, limit: int = 0) -> None:
    """Values, keys_only and count_only of one range equal the model's, or
    both refuse it with the same error."""
    try:
        kvs, count, more = m.range(key, end, rev, limit)
    except errors.EtcdError as e:
        try:
            store.range(RangeRequest(key, end, limit=limit, revision=rev), store.revision)
        except errors.EtcdError as got:
            assert got == e, (key, end, rev)
            return
        raise AssertionError(f"expected {e} at revision {rev}") from None
    where = (key, end, rev, limit)
    res = store.range(RangeRequest(key, end, limit=limit, revision=rev), store.revision)
    assert (res.kvs, res.count, res.more, res.revision) == (kvs, count, more, m.rev), where
    bare = store.range(RangeRequest(key, end, limit=limit, revision=rev, keys_only=True), store.revision)
    # keys_only is answered from the index, without leases, as etcd 3.7 does (brain.mvcc.reads.index_only)
    assert bare.kvs == [KeyValue(kv.key, kv.create_revision, kv.mod_revision, kv.version, b"", 0)
                        for kv in kvs], (*where, "keys_only")
    counted = store.range(RangeRequest(key, end, revision=rev, count_only=True), store.revision)
    assert (counted.kvs, counted.count) == ([], count), (*where, "count_only")


def check_reads(store: Store, m: Model, past: int) -> None:
    """Every read the module docstring lists, after one operation."""
    assert store.revision == m.rev
    assert store.keys_live == len(m.state())
    check_dead_keys(store)
    for key in KEYS:
        check_range(store, m, key, b"", 0)
    check_range(store, m, b"a", b"\x00", 0)
    check_range(store, m, b"a", b"\x00", 0, limit=2)
    for key, end in COUNTED:
        got = store.range(RangeRequest(key, end, count_only=True), store.revision).count
        assert got == m.range(key, end)[1], (key, end)
    revs = {m.rev - past}
    if m.compact_rev > 0:
        revs |= {m.compact_rev, m.compact_rev - 1}  # the oldest readable, the newest refused
    for rev in sorted(r for r in revs if r > 0):
        check_range(store, m, b"a", b"\x00", rev)
        check_range(store, m, b"b", b"m", rev, limit=1)


def check_forgotten(store: Store, m: Model) -> None:
    """A finished compaction left no revision below the compaction revision
    in the index but those still visible there."""
    assert store.compact_done_rev == m.compact_rev
    if m.compact_rev <= 1:
        return
    visible = {kv.mod_revision for kv in m.state(m.compact_rev).values()}
    for shard in store.shards:
        for history in shard.index.values():
            for generation in history.generations:
                for rev in generation.revs:
                    assert rev >> 32 >= m.compact_rev or rev >> 32 in visible, (history.key, rev >> 32)


def version_compare(m: Model, key: bytes, result: int, operand: int) -> bool:
    kv = m.state().get(key)
    version = kv.version if kv else 0
    return {CMP_EQUAL: version == operand, CMP_GREATER: version > operand, CMP_LESS: version < operand}[result]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), program=st.lists(ops, min_size=25, max_size=100),
       block_size=st.sampled_from([1, 2, 3, 128]), floor=st.integers(0, 3), past=st.integers(1, 6))
def test_reads_match_the_model_while_maintenance_interleaves(layout, program, block_size, floor, past):
    store = new_store(MemoryBackend(len(layout) + 1), layout, block_size, floor)
    m = Model()
    granted: set[int] = set()
    cut = None  # a checkpoint cut not yet written

    def apply(req):
        return store.apply([req])[0][0]

    for op in program:
        kind = op[0]
        if kind == "put":
            _, key, value, lease = op
            res = apply(PutRequest(key, value, lease))
            if lease and lease not in granted:
                assert res == errors.ErrLeaseNotFound, res
            else:
                w = m.begin()
                w.put(key, value, lease)
                assert res.revision == w.commit()
        elif kind == "del":
            _, key, end = op
            res = apply(DeleteRangeRequest(key, end))
            w = m.begin()
            n = w.delete(key, end)
            assert (res.revision, res.deleted) == (w.commit(), n)
        elif kind == "txn":
            _, ckey, result, operand, puts, dkey, value = op
            alt = next(k for k in KEYS if k != dkey)
            res = apply(TxnRequest([Compare(result, CMP_VERSION, ckey, union="version", operand=operand)],
                                   [PutRequest(k, value) for k in puts],
                                   [DeleteRangeRequest(dkey), PutRequest(alt, value)]))
            ok = version_compare(m, ckey, result, operand)
            assert res.succeeded == ok
            w = m.begin()
            if ok:
                for k in puts:
                    w.put(k, value)
            else:
                w.delete(dkey, b"")
                w.put(alt, value)
            assert res.revision == w.commit()
        elif kind == "compact":  # logical: the physical part waits for the steps
            rev = m.rev - op[1]
            res = apply(CompactRequest(rev))
            try:
                m.compact(rev)
            except errors.EtcdError as e:
                assert res == e
            else:
                assert not isinstance(res, errors.EtcdError), res
        elif kind == "compaction step":
            if store.compacting and store.compaction_step(op[1]):
                check_forgotten(store, m)
        elif kind == "merge step":
            store.merge_step(op[1])
        elif kind == "range":
            _, key, end, rev, limit = op
            check_range(store, m, key, end, rev, limit)
        elif kind == "grant":
            res = apply(LeaseGrantRequest(3600, op[1]))
            if op[1] in granted:
                assert res == errors.ErrLeaseExist, res
            else:
                assert not isinstance(res, errors.EtcdError), res
                granted.add(op[1])
        elif kind == "revoke":
            res = apply(LeaseRevokeRequest(op[1]))
            if op[1] not in granted:
                assert res == errors.ErrLeaseNotFound, res
            else:
                granted.discard(op[1])
                w = m.begin()
                for k in sorted(k for k, kv in m.state().items() if kv.lease == op[1]):
                    w.delete(k, b"")
                assert res.revision == w.commit()
        elif kind == "checkpoint cut":
            if cut is None:
                cut = store.checkpoint_cut()
        elif kind == "checkpoint written":
            if cut is not None:
                write_checkpoint(store, cut)
                cut = None
        elif kind == "checkpoint abandoned":
            if cut is not None:
                store.checkpoint_abort(cut)
                cut = None
        elif kind == "restart":
            if cut is not None:
                write_checkpoint(store, cut)
                cut = None
            store = restarted(store, layout, block_size, floor)
        check_reads(store, m, past)

    # maintenance catches up; then every revision still readable reads right
    while not store.compaction_step(3):
        check_reads(store, m, past)
    while store.merging:
        store.merge_step(3)
        check_reads(store, m, past)
    for rev in range(max(m.compact_rev, 1), m.rev + 1):
        check_range(store, m, b"a", b"\x00", rev)
        for key in KEYS:
            check_range(store, m, key, b"", rev)
    check_forgotten(store, m)
