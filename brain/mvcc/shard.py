"""One shard: a key range with its own key index and its own record table.

Records (the value of every revision of every key) live in three places, newest
first: `active`, the memtable filling since the last checkpoint cut; `frozen`,
the memtable being written to the value store by a checkpoint in progress;
and the value store itself.  A record is in exactly one of them (a compacted
record in `frozen` stays readable until the checkpoint ends, but nobody can
ask for it: reads below the compaction revision are refused).

The store reaches a shard's key index through these operations only, the
narrow interface a packed index (issue 17) has to offer in place of the
SortedDict of KeyIndex objects: `put` and `delete` (a write at a revision
newer than any indexed), `get` (one key's history), `key_indexes` (the keys
of a range in key order), `live_count` (the live keys of a range without a
scan), `compact` (a bounded walk from a cursor), `load` (the whole index at
once, from a checkpoint's records) and `keys` (how many).  Of a KeyIndex the
store then needs only the operations key_index.py lists.  Outside the
store, the engine's history walk (brain.engine.history) and its tests still
iterate `index` itself; kvhash reads a KeyIndex's generations.

The shard map: shard i holds keys in [boundaries[i-1], boundaries[i]), with
the first shard open below and the last open above.  Shards are contiguous
and ordered, so a range that spans several is their concatenation in shard
order: no k-way merge is needed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterator, Sequence

from sortedcontainers import SortedDict, SortedList

from .codec import decode_record
from .key_index import KeyIndex
from .revision import to_bytes


class Shard:
    __slots__ = ("id", "index", "dead", "active", "frozen", "active_order", "frozen_order", "pending_deletes",
                 "backend")

    def __init__(self, shard_id: int, backend) -> None:
        self.id = shard_id
        self.index: SortedDict = SortedDict()  # key -> KeyIndex
        # Keys of `index` that do not exist at the newest revision (deleted,
        # history kept until compaction).  Invariant: dead == {k in index :
        # not index[k].is_live()}; with it, the live keys in a range are
        # counted by bisection (``live_count``) instead of by a scan.
        self.dead: SortedList = SortedList()
        self.active: dict[int, tuple] = {}
        self.frozen: dict[int, tuple] = {}
        # Revisions of `active` / `frozen` in increasing order (records are
        # added in revision order), for history reads by revision; entries
        # whose record compaction dropped are skipped on read.
        self.active_order: list[int] = []
        self.frozen_order: list[int] = []
        self.pending_deletes: list[int] = []  # revisions to delete from the value store
        self.backend = backend

    def record(self, rev: int) -> tuple:
        rec = self.active.get(rev)
        if rec is not None:
            return rec
        rec = self.frozen.get(rev)
        if rec is not None:
            return rec
        data = self.backend.get(self.id, to_bytes(rev))
        if data is None:
            raise KeyError(f"shard {self.id}: record for revision {rev:#x} is missing")
        return decode_record(data)

    def memtable_history(self, lo: int, hi: int):
        """(rev, record) for memtable records with lo <= rev < hi, in order."""
        for order, table in ((self.frozen_order, self.frozen), (self.active_order, self.active)):
            i = bisect_left(order, lo)
            n = len(order)
            while i < n:
                rev = order[i]
                if rev >= hi:
                    break
                rec = table.get(rev)
                if rec is not None:
                    yield rev, rec
                i += 1

    def history(self, lo: int, hi: int):
        """(rev, record) for every stored record with lo <= rev < hi, in
        revision order, from the value store and the memtables.  A record
        that a finishing checkpoint holds in both places is yielded once."""
        stored = self.backend.scan(self.id, to_bytes(lo), to_bytes(hi))
        mem = self.memtable_history(lo, hi)
        m = next(mem, None)
        for rev_bytes, data in stored:
            rev = int.from_bytes(rev_bytes, "big")
            while m is not None and m[0] < rev:
                yield m
                m = next(mem, None)
            if m is not None and m[0] == rev:
                m = next(mem, None)
            yield rev, decode_record(data)
        while m is not None:
            yield m
            m = next(mem, None)

    def memtable_records(self) -> int:
        return len(self.active) + len(self.frozen)

    def drop(self, rev: int) -> None:
        """Forget a compacted revision's record."""
        if self.active.pop(rev, None) is None:
            self.pending_deletes.append(rev)

    # --- the memtables through a checkpoint (brain.mvcc.checkpoint) -----

    def freeze(self) -> tuple[dict[int, tuple], list[int]]:
        """Start a checkpoint: the active memtable becomes the frozen one
        (new records go to a fresh one); returns it with the deletes the
        value store owes, which are the checkpoint's now."""
        if self.frozen:
            raise RuntimeError("a checkpoint is already in progress")
        self.frozen, self.active = self.active, {}
        self.frozen_order, self.active_order = self.active_order, []
        deletes, self.pending_deletes = self.pending_deletes, []
        return self.frozen, deletes

    def release_frozen(self) -> None:
        """The checkpoint wrote the frozen records: the value store serves them."""
        self.frozen = {}
        self.frozen_order = []

    def thaw(self, deletes: list[int]) -> None:
        """The checkpoint failed: its records go back to the active memtable
        (less those compacted meanwhile) and its `deletes` are owed again."""
        dropped = set(self.pending_deletes)
        merged = {rev: rec for rev, rec in self.frozen.items() if rev not in dropped}
        merged.update(self.active)
        self.active_order = [r for r in self.frozen_order if r in merged] + self.active_order
        self.active = merged
        self.frozen = {}
        self.frozen_order = []
        self.pending_deletes = [r for r in deletes if r not in merged] + [
            r for r in self.pending_deletes if r not in merged]

    # --- the key index (the interface in the module docstring) ----------

    def put(self, rev: int, key: bytes, value: bytes, lease: int) -> tuple[int, int]:
        """Index and record a put at `rev`; returns the key's (created,
        version) after it (version 1: the put created the key)."""
        ki = self.index.get(key)
        if ki is None:
            ki = self.index[key] = KeyIndex(key)
        elif not ki.is_live():  # a deleted key, put again
            self.dead.remove(key)
        created, version = ki.put(rev)
        self.active[rev] = (key, value, created, version, lease)
        self.active_order.append(rev)
        return created, version

    def delete(self, rev: int, key: bytes) -> None:
        """Index and record the tombstone of live `key` at `rev`."""
        self.index[key].tombstone(rev)
        self.dead.add(key)
        self.active[rev] = (key, None, 0, 0, 0)
        self.active_order.append(rev)

    def get(self, key: bytes) -> KeyIndex | None:
        return self.index.get(key)

    def key_indexes(self, key: bytes, end: bytes | None) -> Iterator[KeyIndex]:
        """The KeyIndex of every key in [key, end), in key order; end None
        = no upper bound."""
        index = self.index
        keys = index.irange(key, end, inclusive=(True, False)) if end is not None else index.irange(key)
        return map(index.__getitem__, keys)

    def compact(self, rev: int, cursor: bytes | None, budget: int) -> tuple[bytes | None, int]:
        """Compact at `rev` up to `budget` keys after `cursor` (None: from
        the first); returns the last key done (None: the shard is done) and
        how many keys were done.  Keys left with no history leave the index."""
        index = self.index
        it = index.irange() if cursor is None else index.irange(cursor, inclusive=(False, True))
        batch = []
        for k in it:
            batch.append(k)
            if len(batch) >= budget:
                break
        removed: list[int] = []
        for k in batch:
            ki = index[k]
            ki.compact(rev, removed)
            if ki.is_empty():
                del index[k]
                self.dead.discard(k)
        for r in removed:
            self.drop(r)
        return (batch[-1] if batch and len(batch) >= budget else None), len(batch)

    def load(self, index: dict[bytes, KeyIndex]) -> None:
        """Take a whole index built from stored records (any key order)."""
        self.index = SortedDict(index)
        self.dead = SortedList(key for key, ki in index.items() if not ki.is_live())

    def keys(self) -> int:
        """Keys in the index, live or with history only."""
        return len(self.index)

    def live_count(self, key: bytes, end: bytes | None) -> int:
        """Keys in [key, end) that exist at the newest revision (end None:
        no upper bound), in O(log n)."""
        index, dead = self.index, self.dead
        if end is None:
            return (len(index) - index.bisect_left(key)) - (len(dead) - dead.bisect_left(key))
        return (index.bisect_left(end) - index.bisect_left(key)) - (dead.bisect_left(end) - dead.bisect_left(key))



def layout_problem(shards: int | None, boundaries: Sequence[bytes]) -> str | None:
    """What makes a shard layout unusable, in the words of the flags that
    give it (--shards, --shard-boundaries), or None when it is usable.

    The one check of a layout: the server's flags, the engine, and every
    command that builds a data directory ask it, and each raises its own
    error with the text.  ``shards`` None: the count follows from the
    boundaries."""
    if any(not key for key in boundaries):
        return "--shard-boundaries: a boundary key must not be empty"
    if any(a >= b for a, b in zip(boundaries, boundaries[1:])):
        return "--shard-boundaries: keys must be strictly increasing (bytewise)"
    if shards is not None and shards != len(boundaries) + 1:
        return f"--shards {shards} needs {shards - 1} boundary keys, --shard-boundaries gives {len(boundaries)}"
    return None


class ShardMap:
    __slots__ = ("boundaries",)

    def __init__(self, boundaries: list[bytes]) -> None:
        problem = layout_problem(None, boundaries)
        if problem is not None:
            raise ValueError(problem)
        self.boundaries = list(boundaries)

    def __len__(self) -> int:
        return len(self.boundaries) + 1

    def shard_of(self, key: bytes) -> int:
        return bisect_right(self.boundaries, key)

    def shards_for(self, key: bytes, end: bytes | None) -> range:
        """Shard ids that can hold keys in [key, end)."""
        first = bisect_right(self.boundaries, key)
        last = len(self.boundaries) if end is None else bisect_left(self.boundaries, end)
        return range(first, max(first, last) + 1)


# Where the default shard boundaries go, most valuable split first.  Each is
# the start of one Kubernetes resource prefix, so a list of one resource
# never crosses a shard.  Kubernetes' write load is dominated by Events
# (high churn, lease-expired), Leases (node heartbeats: a quarter of the
# lease duration per node) and Pods (status updates); giving each its own
# shard keeps their indexes, record tables and compaction walks apart from
# the quiet bulk of the keyspace.  See docs/architecture.md.
KUBERNETES_SPLIT_PRIORITY = (
    b"/registry/events/",
    b"/registry/leases/",
    b"/registry/pods/",
    b"/registry/configmaps/",
    b"/registry/secrets/",
    b"/registry/minions/",
    b"/registry/services/",
    b"/registry/replicasets/",
    b"/registry/serviceaccounts/",
    b"/registry/endpointslices/",
    b"/registry/deployments/",
    b"/registry/namespaces/",
    b"/registry/jobs/",
    b"/registry/persistentvolumeclaims/",
    b"/registry/roles/",
)

DEFAULT_SHARDS = 4


def default_boundaries(shards: int) -> list[bytes]:
    """Boundaries for `shards` shards, taken from KUBERNETES_SPLIT_PRIORITY."""
    if shards < 1:
        raise ValueError("--shards must be at least 1")
    if shards - 1 > len(KUBERNETES_SPLIT_PRIORITY):
        raise ValueError(
            f"--shards {shards} needs explicit --shard-boundaries "
            f"(the default table has {len(KUBERNETES_SPLIT_PRIORITY) + 1} shards at most)"
        )
    return sorted(KUBERNETES_SPLIT_PRIORITY[: shards - 1])
