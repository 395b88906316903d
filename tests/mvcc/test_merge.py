"""A store loaded by writes alone ends up in packed blocks: merge steps
between batches (Store.merge_step) fold the overlay into blocks down to its
floor, and every read answers as before."""

from __future__ import annotations

from brain.backend import MemoryBackend
from brain.mvcc.requests import DeleteRangeRequest, PutRequest, RangeRequest
from brain.mvcc.store import MERGE_FLOOR_KEYS, Store


def test_merge_steps_fold_the_overlay_into_blocks():
    store = Store(MemoryBackend(2), [b"k006000"])
    n = 3 * MERGE_FLOOR_KEYS
    for i in range(n):
        store.apply([PutRequest(b"k%06d" % (i * 7919 % n), b"v")])
    store.apply([DeleteRangeRequest(b"k000100", b"k000200")])
    expected = store.range(RangeRequest(b"k", b"l", limit=50, revision=n), store.revision)
    assert store.merging
    steps = 0
    while store.merging:
        store.merge_step(1000)
        steps += 1
    assert steps > 1  # bounded steps, not one pass
    for shard in store.shards:
        assert shard.blocks and shard.unmerged() <= store.overlay_floor(shard)
        made = list(shard.fingerprints)
        shard.fingerprints[:] = [None] * len(made)
        for b in range(len(shard.blocks)):  # the fingerprints a merge built are those a look-up makes
            assert made[b] is None or made[b] == shard._marks(b)
    assert store.keys_total() == n
    assert store.range(RangeRequest(b"k", b"l", limit=50, revision=n), store.revision) == expected
    now = store.range(RangeRequest(b"k", b"l", count_only=True), store.revision)
    assert now.count == n - 100
    store.apply([PutRequest(b"k000150", b"back")])  # a key whose tombstone is in a block, put again
    assert store.range(RangeRequest(b"k000150"), store.revision).kvs[0].version == 1
    assert store.range(RangeRequest(b"k", b"l", count_only=True), store.revision).count == n - 99
