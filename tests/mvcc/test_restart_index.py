"""A restart packs its blocks straight from the stored record heads
(brain.mvcc.packed.pack_stored, through replay.load_records); this checks it
builds exactly the index of the path it replaced: a KeyIndex per key, each
record applied with restore / tombstone in revision order, the keys sorted
and packed with Block(KeyIndex..., leases), the leases those of each live
key's newest put.  Random histories with tombstones, keys
put several times (also within one Txn), leases, compactions (their
tombstones kept alone at the compaction revision) and checkpoints between
them, over one shard and several."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.backend import MemoryBackend, WriteBatch
from brain.mvcc.codec import decode_record_head
from brain.mvcc.key_index import KeyIndex
from brain.mvcc.packed import Block
from brain.mvcc.requests import CompactRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest, TxnRequest
from brain.mvcc.revision import from_bytes
from brain.mvcc.store import Store

KEYS = [b"", b"a", b"ab", b"b", b"c", b"k", b"k\x00", b"ka", b"m", b"t", b"z", b"\xff"]
LAYOUTS = [[], [b"b"], [b"b", b"k", b"t"]]
LEASES = [0, 0, 7, 8]

ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.sampled_from(LEASES)),
    st.tuples(st.just("del"), st.sampled_from(KEYS), st.sampled_from([b"", b"", b"c", b"zz"])),
    st.tuples(st.just("txn"), st.lists(st.sampled_from(KEYS), min_size=2, max_size=4, unique=True)),
    st.tuples(st.just("compact"), st.integers(1, 60)),
    st.tuples(st.just("checkpoint")),
)

BLOCK_FIELDS = ("keys", "ends", "mods", "created", "versions", "live_rank", "hist_pos", "hist_off", "hist",
                "lease_pos", "leases", "maxrev", "minhist")


def checkpoint(store: Store) -> None:
    cut = store.checkpoint_cut()
    store.backend.write(WriteBatch(puts=list(cut.records()), deletes=list(cut.deleted())))
    store.checkpoint_done()


def blocks_one_key_index_per_key(backend, shard_id: int, block_size: int) -> tuple[list[Block], dict, int]:
    """The replaced path: a KeyIndex per key, then Block(KeyIndex..., leases)
    with the newest put's lease of every live key; with those leases and
    the live count."""
    index: dict[bytes, KeyIndex] = {}
    lease_of: dict[bytes, int] = {}
    for rev_bytes, data in backend.scan(shard_id):
        key, deleted, created, version, lease = decode_record_head(data)
        ki = index.setdefault(key, KeyIndex(key))
        if deleted:
            ki.tombstone(from_bytes(rev_bytes))
        else:
            ki.restore(from_bytes(rev_bytes), created, version)
        lease_of[key] = lease
    ordered = [index[k] for k in sorted(index)]
    live = [ki for ki in ordered if ki.is_live()]
    leases = {ki.key: lease_of[ki.key] for ki in live if lease_of[ki.key]}
    lease_list = [leases.get(ki.key, 0) for ki in ordered]
    return [Block(ordered[i:i + block_size], lease_list[i:i + block_size])
            for i in range(0, len(ordered), block_size)], leases, len(live)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), program=st.lists(ops, max_size=80), block_size=st.sampled_from([1, 2, 3, 128]))
def test_restart_packs_the_index_the_key_index_path_packed(layout, program, block_size):
    store = Store(MemoryBackend(len(layout) + 1), layout, block_size=block_size)
    store.apply([LeaseGrantRequest(60, 7), LeaseGrantRequest(60, 8)])
    for op in program:
        kind = op[0]
        if kind == "put":
            store.apply([PutRequest(op[1], b"v", lease=op[2])])
        elif kind == "del":
            store.apply([DeleteRangeRequest(op[1], op[2])])
        elif kind == "txn":
            store.apply([TxnRequest([], [PutRequest(k, b"t") for k in op[1]], [])])
        elif kind == "compact":
            if store.compact_rev < op[1] <= store.revision:
                store.apply([CompactRequest(op[1])])
                while not store.compaction_step(3):
                    pass
        else:
            checkpoint(store)
    checkpoint(store)

    restored = Store(store.backend, layout, block_size=block_size)
    restored.load_records([(7, 60), (8, 60)])

    live_total = 0
    expected_leases: dict[bytes, int] = {}
    for shard in restored.shards:
        blocks, leases, live = blocks_one_key_index_per_key(store.backend, shard.id, block_size)
        live_total += live
        expected_leases.update(leases)
        assert [[getattr(b, f) for f in BLOCK_FIELDS] for b in shard.blocks] == \
            [[getattr(b, f) for f in BLOCK_FIELDS] for b in blocks]
        assert not shard.overlay and not shard.lifted and not shard.rewritten
        assert shard.keys() == sum(map(len, blocks))
        assert shard.live_count(b"", None) == live
        # And it answers like the store that wrote the records, at every
        # revision a read may ask for.
        written = store.shards[shard.id].index
        assert list(shard.index) == list(written)
        for key, ki in shard.index.items():
            for rev in range(max(store.compact_rev, 1), store.revision + 1):
                assert ki.get(rev) == written[key].get(rev), (key, rev)
            assert shard.lease_of(ki) == store.shards[shard.id].lease_of(written[key]), key
    assert restored.keys_live == live_total
    assert restored.lessor.key_lease == expected_leases
