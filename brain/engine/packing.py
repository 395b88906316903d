"""The whole key index packed once writes stop.

Merges (brain.mvcc.index) leave two kinds of keys out of the packed blocks
on purpose: a floor of recent writes (a hundredth of a shard's keys), and
the hot keys, written again within a window of revisions of their last
write, which stay lifted so that a node Lease renewed every 10 s is not
folded and lifted again on every renewal.  The window is counted in
revisions, so when writes stop, the keys written last stay hot for good:
after a bulk load of 1,000,000 keys whose last fifth overwrote keys, those
stayed lifted (a KeyIndex object each) and every read over them took the
slow path: a keys_only Range over every key cost 2.0-2.7 s of server CPU,
0.80-0.85 s once packed.  A store that applied no write for QUIET_SECONDS is folded
whole (a merge with a floor of 0), step by step between the committer's
turns, and its memory handed back; the next write lifts what it touches.

Everything here runs on the committer thread.
"""

from __future__ import annotations

import time
from typing import Callable

from .memory import release_free_memory

# No write applied for this long: nothing is hot any more.  Longer than a
# pause between bursts of a small cluster's writes, shorter than a reader
# of a store just loaded waits for its reads to be fast.
QUIET_SECONDS = 5.0


class QuietPacker:
    """Watches the store's revision; packs its index once it stays put."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._revision = -1
        self._since = 0.0

    def due(self, store) -> bool:
        """No write applied for QUIET_SECONDS, and some key is still out of
        the blocks (``store`` is brain.mvcc.store.Store)."""
        now = self._clock()
        if store.revision != self._revision:
            self._revision, self._since = store.revision, now
            return False
        return now - self._since >= QUIET_SECONDS and not store.packed

    def step(self, store, lock, budget: int) -> None:
        """Fold about ``budget`` keys, hot ones and the floor included.  A
        step that folds nothing (the only keys left are in the block a
        compaction paused inside: brain.mvcc.index, merge) waits another
        quiet period instead of spinning the committer."""
        with lock:
            before = store.unmerged()
            store.merge_step(budget, everything=True)
            left = store.unmerged()
            if not left:
                release_free_memory()
        if left and left >= before:
            self._since = self._clock()
