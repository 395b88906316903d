"""Compaction, in two parts as in etcd: the logical one happens at once (a
Compact request, journaled, moves `compact_rev`; reads below it are refused
from then on) and the physical one in bounded steps that the engine runs
between write batches (dropping what no read at or after `compact_rev` can
see from the key indexes, the memtables and the value store).

The store holds the pending physical compaction (Store.start_compaction,
Store.compaction_step); a replica replays a Compact record the same way
(brain.mvcc.replay).  What one key keeps is key_index.py's worked example.
"""

from __future__ import annotations

from . import errors
from .codec import BatchEncoder
from .requests import CompactRequest, CompactResult
from .store_core import StoreCore


def apply_compact(store: StoreCore, c: CompactRequest, enc: BatchEncoder) -> CompactResult:
    if c.revision <= store.compact_rev:
        raise errors.ErrCompacted.fresh()
    if c.revision > store.revision:
        raise errors.ErrFutureRev.fresh()
    enc.compact(c.revision)
    store.start_compaction(c.revision)
    return CompactResult(store.revision)


class Compaction:
    """A compaction in bounded steps: walks each shard's keys in order from a
    cursor, so keys created meanwhile are either visited or need no work
    (their revisions are newer than the compaction revision)."""

    __slots__ = ("store", "rev", "shard_pos", "cursor")

    def __init__(self, store: StoreCore, rev: int) -> None:
        self.store = store
        self.rev = rev
        self.shard_pos = 0
        self.cursor: bytes | None = None

    def step(self, budget: int) -> bool:
        """Compact up to `budget` keys; True when every shard is done."""
        shards = self.store.shards
        while self.shard_pos < len(shards):
            cursor, done = shards[self.shard_pos].compact(self.rev, self.cursor, budget)
            budget -= done
            if cursor is not None:
                self.cursor = cursor
                return False
            self.shard_pos += 1
            self.cursor = None
        return True
