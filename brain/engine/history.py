"""Reading the committed history at a pinned revision while writes go on:
what hashes, snapshots, the export to etcd and the mirror need of a running
engine, so that none of them holds the engine's lock or reads its store.

`Engine.history()` hands its lock and store to a History.  `pin()` reads,
under the lock and together, the committed revision, the compaction
revision and the journal index of that revision, and pins physical
compaction; the PinnedHistory it returns walks the key indexes shard by
shard (key order), a bounded chunk per hold of the lock, and reads records,
until it is closed (a `with` block), which unpins.

Why the pin makes a chunked walk consistent: writes meanwhile only add
revisions above the pinned revision, which the walk leaves out; a
compaction requested meanwhile moves the compaction revision logically at
once, but its physical part (dropping records and key-index entries) waits
for the last pin to go, so everything the pinned compaction revision kept
stays readable until the walk is done.

Worked example: key k is put at revisions 2 and 3, deleted at 4, put at 6;
the engine compacted at 3.  pin() gives (revision 6, compaction 3).  walk()
yields k's covered revisions [3, 4, 6] (kvhash.covered_revisions: 3 is kept
because a read at 3 finds it; 2 is gone), and k counts as alive at 6.  If a
put at 7 and a compaction at 6 happen while the walk is between chunks, the
walk still yields [3, 4, 6] for k: 7 is above the pinned revision, and the
records at 3 and 4 are dropped only when the pin is released.  walk(4)
yields [3, 4], and k is not alive at 4.

Lock order: the engine's lock is taken for each chunk and never held while
the caller works on what a chunk returned.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

from ..mvcc.codec import Record
from ..mvcc.store import Store

REVISIONS_PER_HOLD = 4096  # revisions collected per hold of the engine lock
KEYS_PER_HOLD = 4 * REVISIONS_PER_HOLD  # keys looked at per hold (keys newer than the walk cost time too)


class Committed(Protocol):
    """What History needs of the engine besides its lock and store."""

    committed_rev: int  # guarded by the engine's lock

    @property
    def applied_index(self) -> int: ...  # the journal index of committed_rev, guarded by the same lock

    def pin_compaction(self) -> None: ...  # called with the lock held

    def unpin_compaction(self) -> None: ...  # takes the lock itself


@dataclass(frozen=True)
class Chunk:
    """What one hold of the lock walked, all in one shard: the covered
    revisions of consecutive keys, in key then revision order, and how many
    of those keys are alive at the walk's revision."""

    shard: int
    revisions: list[int]
    alive: int


class History:
    """The engine's history as its store holds it now: take a new one (it
    costs nothing) for each read, since a follower rebuilding its store
    replaces the store the engine hands over."""

    def __init__(self, lock: threading.Lock, store: Store, engine: Committed) -> None:
        self._lock = lock
        self._store = store
        self._engine = engine

    def pin(self) -> "PinnedHistory":
        """Pin compaction at the committed state; close the result to unpin."""
        engine = self._engine
        with self._lock:
            engine.pin_compaction()
            return PinnedHistory(self._lock, self._store.shards, engine.unpin_compaction,
                                 engine.committed_rev, self._store.compact_rev, engine.applied_index)

    def leases(self) -> list[tuple[int, int]]:
        """Every lease as (ID, granted TTL), by ID.  The store's leases may
        include those of a batch that is not durable yet; read on the
        committer (Engine.on_committer) for exactly the committed ones."""
        with self._lock:
            return sorted((lease.id, lease.ttl) for lease in self._store.lessor.leases.values())


class PinnedHistory:
    """The history as of `revision`, readable until close()."""

    def __init__(self, lock: threading.Lock, shards: list, unpin: Callable[[], None], revision: int,
                 compact_revision: int, journal_index: int) -> None:
        self.revision = revision
        self.compact_revision = compact_revision
        self.journal_index = journal_index
        self._lock = lock
        self._shards = shards
        self._unpin = unpin
        self._closed = False

    @property
    def shards(self) -> int:
        return len(self._shards)

    def walk(self, upto: int | None = None, *, revisions_per_hold: int = REVISIONS_PER_HOLD,
             keys_per_hold: int = KEYS_PER_HOLD) -> Iterator[Chunk]:
        """The revisions a read at `upto` (default: the pinned revision; at
        most that) or later can see, given the pinned compaction, as Chunks.
        A hold of the lock ends after `revisions_per_hold` revisions or
        `keys_per_hold` keys, whichever comes first."""
        upto = self.revision if upto is None else upto
        if upto > self.revision:
            raise ValueError(f"revision {upto} is above the pinned revision {self.revision}")
        lock, compact = self._lock, self.compact_revision
        for sid, shard in enumerate(self._shards):
            cursor = None
            while True:
                with lock:
                    self._check_open()
                    revisions, alive, cursor = shard.covered(cursor, compact, upto, revisions_per_hold,
                                                             keys_per_hold)
                yield Chunk(sid, revisions, alive)
                if cursor is None:
                    break

    def read(self, refs: Iterable[tuple[int, int]]) -> list[Record]:
        """The records at (shard, packed revision) `refs`, in one hold of
        the lock: pass at most a chunk's worth."""
        shards = self._shards
        with self._lock:
            self._check_open()
            return [shards[sid].record(rev) for sid, rev in refs]

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the history was unpinned")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._unpin()

    def __enter__(self) -> "PinnedHistory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
