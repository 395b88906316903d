"""Property test: the store against the reference model.

Random sequences of puts, deletes, Txns, compactions, checkpoints,
restarts, merges of the index's overlay into its blocks and reads at random
revisions, with one shard and with several; after
the run the store is rebuilt twice, by replaying its journal payloads and
from a checkpoint, and both rebuilt stores must answer every read exactly
like the original.  A store rebuilt from a checkpoint holds its index in
packed blocks (brain.mvcc.packed) and one that only replayed holds it in the
overlay (unless the program merged), so every read compares the two
tiers; a restart or a merge in the program goes on writing and compacting
over the blocks.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.backend import MemoryBackend, WriteBatch
from brain.mvcc import errors
from brain.mvcc.requests import (
    CMP_EQUAL,
    CMP_GREATER,
    CMP_LESS,
    CMP_MOD,
    CMP_NOT_EQUAL,
    CMP_VALUE,
    CMP_VERSION,
    CompactRequest,
    Compare,
    DeleteRangeRequest,
    KeyValue,
    LeaseGrantRequest,
    PutRequest,
    TARGET_VALUE,
    RangeRequest,
    TxnRequest,
)
from brain.mvcc.store import Store

from .model import Model

KEYS = [b"a", b"ab", b"b", b"c", b"k", b"ka", b"m", b"t", b"z"]
LAYOUTS = [[], [b"b"], [b"b", b"k", b"t"], [b"ab", b"c", b"ka", b"m", b"z"]]

keys = st.sampled_from(KEYS)
values = st.binary(max_size=6)
ends = st.sampled_from([b"", b"", b"\x00", b"c", b"l", b"zz"])

LEASES = (1, 2)  # granted before the program runs; a put carries one or none
leases = st.sampled_from((0, 0, *LEASES))

ops = st.one_of(
    st.tuples(st.just("put"), keys, values, leases),
    st.tuples(st.just("del"), keys, ends),
    st.tuples(st.just("txn"), keys, st.sampled_from([CMP_VERSION, CMP_MOD, CMP_VALUE]),
              st.sampled_from([CMP_EQUAL, CMP_GREATER, CMP_LESS, CMP_NOT_EQUAL]), st.integers(0, 6),
              keys, values, keys),
    st.tuples(st.just("compact"), st.integers(0, 40)),
    st.tuples(st.just("range"), keys, ends, st.integers(0, 40), st.integers(0, 3)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("restart")),  # go on with a store loaded from a checkpoint: its index in packed blocks
    # fold some overlay keys into blocks, above a floor (1-3: rewritten keys get a second chance)
    st.tuples(st.just("merge"), st.integers(1, 5), st.integers(0, 3)),
    st.tuples(st.just("merge everything")),
)


def model_compare(m: Model, key: bytes, target: int, result: int, operand) -> bool:
    kv = m.state().get(key)
    if target == CMP_VALUE:
        if kv is None:
            return False
        a = kv.value
    elif target == CMP_VERSION:
        a = kv.version if kv else 0
    else:
        a = kv.mod_revision if kv else 0
    return {CMP_EQUAL: a == operand, CMP_GREATER: a > operand, CMP_LESS: a < operand,
            CMP_NOT_EQUAL: a != operand}[result]


def check_range(store: Store, m: Model, key: bytes, end: bytes, rev: int, limit: int) -> None:
    try:
        expected = m.range(key, end, rev, limit)
    except errors.EtcdError as e:
        try:
            store.range(RangeRequest(key, end, limit=limit, revision=rev), store.revision)
        except errors.EtcdError as got:
            assert got == e
            return
        raise AssertionError(f"expected {e}")
    res = store.range(RangeRequest(key, end, limit=limit, revision=rev), store.revision)
    assert (res.kvs, res.count, res.more) == expected, (key, end, rev, limit)
    assert res.revision == m.rev
    # keys_only is answered from the index, without the leases (etcd 3.7's
    # FastKeysOnly), unless it is sorted by value
    keys_only = store.range(RangeRequest(key, end, limit=limit, revision=rev, keys_only=True), store.revision)
    assert (keys_only.kvs, keys_only.count, keys_only.more) == (
        [KeyValue(kv.key, kv.create_revision, kv.mod_revision, kv.version, b"", 0) for kv in expected[0]],
        expected[1], expected[2]), (key, end, rev, limit, "keys_only")
    by_value = store.range(RangeRequest(key, end, revision=rev, keys_only=True, sort_target=TARGET_VALUE),
                           store.revision)
    everything = m.range(key, end, rev, 0)[0]
    assert by_value.kvs == [KeyValue(kv.key, kv.create_revision, kv.mod_revision, kv.version, b"", kv.lease)
                            for kv in sorted(everything, key=lambda kv: kv.value)], (key, end, rev, "by value")
    counted = store.range(RangeRequest(key, end, revision=rev, count_only=True), store.revision)
    assert (counted.kvs, counted.count) == ([], expected[1]), (key, end, rev, "count_only")


def check_dead_keys(store: Store) -> None:
    """Shard.dead lists exactly the index's keys that do not exist now, and
    Shard.keys counts the index's keys."""
    for shard in store.shards:
        assert len(list(shard.index)) == shard.keys()
        assert list(shard.dead) == [k for k, ki in shard.index.items() if not ki.is_live()]


def restored_from_checkpoint(store: Store, layout: list[bytes], block_size: int) -> Store:
    """A store rebuilt from a checkpoint written to `store`'s value store,
    as the engine recovers: the records plus the revisions the cut itself
    recorded (in the same write), read back, nothing taken from `store`."""
    backend = store.backend
    cut = store.checkpoint_cut()
    meta = {"revision": cut.revision, "compact_rev": cut.compact_rev, "leases": cut.leases}
    backend.write(WriteBatch(puts=list(cut.records()), deletes=list(cut.deleted()),
                             meta={b"checkpoint": json.dumps(meta).encode()}))
    store.checkpoint_done()
    restored = Store(backend, layout, block_size=block_size)
    saved = json.loads(backend.get_meta(b"checkpoint"))
    restored.load_records(saved["leases"])
    restored.revision, restored.compact_rev = saved["revision"], saved["compact_rev"]
    return restored


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), program=st.lists(ops, max_size=60), block_size=st.sampled_from([1, 2, 3, 128]))
def test_store_matches_model(layout, program, block_size):
    store = Store(MemoryBackend(len(layout) + 1), layout, block_size=block_size)
    m = Model()
    payloads = []

    def apply(req):
        results, payload = store.apply([req])
        if payload:
            payloads.append(payload)
        return results[0]

    for lease_id in LEASES:
        apply(LeaseGrantRequest(3600, lease_id))
    for op in program:
        kind = op[0]
        if kind == "put":
            _, key, value, lease = op
            res = apply(PutRequest(key, value, lease, prev_kv=True))
            prev = m.state().get(key)
            w = m.begin()
            w.put(key, value, lease)
            assert res.revision == w.commit()
            assert res.prev_kv == prev
        elif kind == "del":
            _, key, end = op
            res = apply(DeleteRangeRequest(key, end, prev_kv=True))
            prev = sorted((kv for k, kv in m.state().items() if Model.in_range(k, key, end)), key=lambda kv: kv.key)
            w = m.begin()
            n = w.delete(key, end)
            assert (res.revision, res.deleted, res.prev_kvs) == (w.commit(), n, prev)
        elif kind == "txn":
            _, ckey, target, result, num, pkey, value, dkey = op
            operand = value if target == CMP_VALUE else num
            union = {CMP_VALUE: "value", CMP_VERSION: "version", CMP_MOD: "mod_revision"}[target]
            # a limited Range counts keys, including the Txn's own write
            # and a limited Range at the revision before the Txn does not
            before = sorted(m.state().values(), key=lambda kv: kv.key)
            ops_ok = [PutRequest(pkey, value), RangeRequest(b"a", b"\x00", limit=2),
                      RangeRequest(b"a", b"\x00", limit=2, revision=m.rev)]
            ops_else = [DeleteRangeRequest(dkey), RangeRequest(dkey)]
            res = apply(TxnRequest([Compare(result, target, ckey, union=union, operand=operand)], ops_ok, ops_else))
            ok = model_compare(m, ckey, target, result, operand)
            assert res.succeeded == ok
            w = m.begin()
            if ok:
                w.put(pkey, value)
                expect_range = sorted(w.st.values(), key=lambda kv: kv.key)
                rng = res.responses[1]
            else:
                w.delete(dkey, b"")
                expect_range = [kv for k, kv in w.st.items() if k == dkey]
                rng = res.responses[1]
            if ok:
                assert (rng.kvs, rng.count, rng.more) == (expect_range[:2], len(expect_range),
                                                          len(expect_range) > 2)
                old = res.responses[2]
                assert (old.kvs, old.count, old.more) == (before[:2], len(before), len(before) > 2)
            else:
                assert rng.kvs == expect_range
            assert res.revision == w.commit()
        elif kind == "compact":
            rev = op[1]
            res = apply(CompactRequest(rev))
            try:
                m.compact(rev)
            except errors.EtcdError as e:
                assert res == e
            else:
                assert not isinstance(res, errors.EtcdError), res
                while not store.compaction_step(3):
                    pass
        elif kind == "range":
            _, key, end, rev, limit = op
            check_range(store, m, key, end, rev, limit)
        elif kind == "checkpoint":  # moves history out of the memtables
            cut = store.checkpoint_cut()
            store.backend.write(WriteBatch(puts=list(cut.records()), deletes=list(cut.deleted())))
            store.checkpoint_done()
        elif kind == "restart":
            store = restored_from_checkpoint(store, layout, block_size)
        elif kind == "merge":
            for shard in store.shards:
                before, due = shard.unmerged(), shard.merge_due(op[2])
                assert shard.merge(op[1], op[2]) >= (1 if due else 0)
                assert shard.unmerged() < before or not due
        elif kind == "merge everything":
            for shard in store.shards:
                shard.merge(1 << 30, 0)
                assert len(shard.overlay) == 0 and not shard.lifted
        assert store.revision == m.rev
        check_dead_keys(store)

    # Rebuild by replaying the journal payloads.
    replayed = Store(MemoryBackend(len(layout) + 1), layout, block_size=block_size)
    for p in payloads:
        replayed.replay(p)
    # Rebuild from a checkpoint written to a value store, as the engine
    # recovers: the records plus the revisions the cut itself recorded (in
    # the same write), read back from the value store, nothing taken from
    # the live store.
    restored = restored_from_checkpoint(store, layout, block_size)
    assert (restored.revision, restored.compact_rev) == (m.rev, m.compact_rev), \
        "the checkpoint did not record the revision it was cut at"

    for s in (store, replayed, restored):
        check_dead_keys(s)
        assert s.revision == m.rev
        assert s.keys_live == len(m.state())
        for rev in range(max(m.compact_rev, 1), m.rev + 1):
            for key in KEYS:
                check_range(s, m, key, b"", rev, 0)
            check_range(s, m, b"a", b"\x00", rev, 0)
            check_range(s, m, b"b", b"m", rev, 2)
    # Compaction really forgot history: no record below the compaction
    # revision survives unless it is still visible there.
    if m.compact_rev > 1:
        live_at_compact = {kv.mod_revision for kv in m.state(m.compact_rev).values()}
        for shard in store.shards:
            for ki in shard.index.values():
                for g in ki.generations:
                    for r in g.revs:
                        main = r >> 32
                        assert main >= m.compact_rev or main in live_at_compact
