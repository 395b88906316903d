"""A shard's records: the memtables, and the value store behind them.

Records (the value of every revision of every key) live in three places, newest
first: `active`, the memtable filling since the last checkpoint cut; `frozen`,
the memtable being written to the value store by a checkpoint in progress;
and the value store itself.  A record is in exactly one of them (a compacted
record in `frozen` stays readable until the checkpoint ends, but nobody can
ask for it: reads below the compaction revision are refused).

Through a checkpoint (brain.mvcc.checkpoint) the memtables go: freeze (the
active memtable becomes the frozen one, a fresh one fills), then either
release_frozen (the value store holds the frozen records now) or thaw (the
write failed: they go back to the active memtable).  For example, records
at revisions 5 and 6 in `active`; freeze: `frozen` holds 5 and 6, a put at
7 goes to a fresh `active`; release_frozen: 5 and 6 are read from the value
store, 7 from `active`; had the write failed, thaw would leave 5, 6 and 7
in `active` and the deletes the cut took owed again.

Memtables is a part of a Shard (brain.mvcc.shard), which says why the parts
share one object: it owns the fields in FIELDS and is their only writer,
but for the one write a put or a delete makes: its record, appended to
`active` and `active_order` by TieredIndex.put and delete (brain.mvcc.index)
in the method that indexes it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from .codec import decode_record, decode_value_lease
from .revision import to_bytes


class Memtables:
    """One shard's records, newest first: the active memtable, the frozen
    one, the value store."""

    __slots__ = ()
    # The fields this part owns (Shard declares them as its slots).
    FIELDS = ("id", "backend", "active", "frozen", "active_order", "frozen_order", "pending_deletes")

    def __init__(self, shard_id: int, backend) -> None:
        self.id = shard_id  # the shard's sub-database in the value store
        self.backend = backend
        self.active: dict[int, tuple] = {}  # revision -> record (brain.mvcc.codec.Record)
        self.frozen: dict[int, tuple] = {}
        # Revisions of `active` / `frozen` in increasing order (records are
        # added in revision order), for history reads by revision; entries
        # whose record compaction dropped are skipped on read.
        self.active_order: list[int] = []
        self.frozen_order: list[int] = []
        self.pending_deletes: list[int] = []  # revisions to delete from the value store

    def record(self, rev: int) -> tuple:
        """The record at `rev`, from wherever it is now (KeyError: none)."""
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

    def values_and_leases(self, revs: Sequence[int]) -> tuple[list[bytes], list[int]]:
        """The value and lease of each put in `revs` (every one stored), in
        their order: from the memtables, the rest from the value store in
        one read."""
        values: list[bytes] = []
        leases: list[int] = []
        missing: list[int] = []
        active, frozen = self.active, self.frozen
        for n, rev in enumerate(revs):
            rec = active.get(rev) or frozen.get(rev)
            if rec is None:
                missing.append(n)
                values.append(b"")
                leases.append(0)
            else:
                values.append(rec[1])
                leases.append(rec[4])
        if missing:
            stored = self.backend.get_many(self.id, [to_bytes(revs[n]) for n in missing])
            for n, data in zip(missing, stored):
                if data is None:
                    raise KeyError(f"shard {self.id}: record for revision {revs[n]:#x} is missing")
                values[n], leases[n] = decode_value_lease(data)
        return values, leases

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
