"""One shard: a key range with its own key index and its own record table.

Records (the value of every revision of every key) live in three places, newest
first: `active`, the memtable filling since the last checkpoint cut; `frozen`,
the memtable being written to the value store by a checkpoint in progress;
and the value store itself.  A record is in exactly one of them (a compacted
record in `frozen` stays readable until the checkpoint ends, but nobody can
ask for it: reads below the compaction revision are refused).

The shard map: shard i holds keys in [boundaries[i-1], boundaries[i]), with
the first shard open below and the last open above.  Shards are contiguous
and ordered, so a range that spans several is their concatenation in shard
order: no k-way merge is needed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Sequence

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

    def drop(self, rev: int) -> None:
        """Forget a compacted revision's record."""
        if self.active.pop(rev, None) is None:
            self.pending_deletes.append(rev)

    def key_index(self, key: bytes) -> KeyIndex:
        ki = self.index.get(key)
        if ki is None:
            ki = KeyIndex(key)
            self.index[key] = ki
        return ki

    def live_count(self, key: bytes, end: bytes | None) -> int:
        """Keys in [key, end) that exist at the newest revision (end None:
        no upper bound), in O(log n)."""
        index, dead = self.index, self.dead
        if end is None:
            return (len(index) - index.bisect_left(key)) - (len(dead) - dead.bisect_left(key))
        return (index.bisect_left(end) - index.bisect_left(key)) - (dead.bisect_left(end) - dead.bisect_left(key))

    def keys_in(self, key: bytes, end: bytes | None):
        """Keys of this shard's index in [key, end); end None = no upper bound."""
        return self.index.irange(key, end, inclusive=(True, False)) if end is not None else self.index.irange(key)


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
