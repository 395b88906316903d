"""A compaction walk and merges interleaved, as the engine runs them
(a compaction step, writes, a merge step, ...): the block a walk stopped
inside keeps its keys to compact even when overlay keys up to the walk's
cursor could be folded into it."""

from __future__ import annotations

from brain.backend.memory import MemoryBackend
from brain.mvcc.requests import PutRequest
from brain.mvcc.store import Store


class NoFloorStore(Store):
    """Merges fold every unmerged key: no overlay floor."""

    def overlay_floor(self, shard) -> int:
        return 0


def _revs(store: Store, key: bytes) -> list[int]:
    history = store.shards[0].get(key)
    return [r for g in history.generations for r in g.revs]


def test_a_block_the_walk_stopped_inside_is_compacted_after_a_merge():
    """Block [a, ab, c] (a has an old revision), overlay key b in its
    range.  A walk with a budget of one compacts b and stops there, the
    block still to do.  A merge that folded b in would leave [a, ab, b]
    and [c] (blocks of three): the first block would end at the cursor and
    the walk would skip it, keeping a's old revision forever."""
    store = NoFloorStore(MemoryBackend(1), [], block_size=3)
    for key in (b"a", b"ab", b"c"):
        store.apply([PutRequest(key, b"1")])
    store.apply([PutRequest(b"a", b"2")])
    store.merge_step(100)
    assert not store.shards[0].unmerged() and len(_revs(store, b"a")) == 2
    old = _revs(store, b"a")[0]
    store.apply([PutRequest(b"b", b"1")])  # an overlay key inside the block's range
    store.start_compaction(store.revision)
    assert not store.compaction_step(1)  # b done; the block is still to do
    store.merge_step(100)
    while not store.compaction_step(1):
        store.merge_step(100)
    assert old not in _revs(store, b"a")
