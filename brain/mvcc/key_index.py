"""The history of one key: its generations.

A key's life is a sequence of *generations*.  A generation starts with the put
that creates the key and ends with the delete (tombstone) that removes it; the
key's next put starts a new generation.  Revisions are packed ints (see
revision.py); below they are written main.sub.

Worked example.  Put "k" at 1.0, put at 2.0, delete at 3.0, put at 5.0,
put at 6.0:

    generations = [ {created 1.0, version 2, revs [1.0, 2.0, 3.0]},   (ended by tombstone 3.0)
                    {created 5.0, version 2, revs [5.0, 6.0]} ]        (live)

* get(at=2) finds 2.0 (created 1, version 2); get(at=3) and get(at=4) find
  nothing: the tombstone 3.0 ends the first generation at or before them.
  get(at=5) finds 5.0 (created 5, version 1).
* The last generation is always the live one and may be empty: right after
  the delete at 3.0 the list ended in an empty generation {revs []}.

Compaction at revision R keeps, for reads at R and later, exactly what they
can see:

* every generation whose tombstone is below R is dropped whole (no read at
  >= R can see it, the tombstone included); a generation whose tombstone is
  exactly R keeps only its tombstone, so a watch starting at R still gets
  that delete event (etcd drops it too and the event is lost; we keep it
  one compaction longer);
* in the generation that R falls into, revisions below the newest one <= R
  are dropped; that newest one is kept because a read at R must find it;
* a key left with only an empty generation is gone from the index.

Continuing the example: compact(3) leaves [{3.0}, {5.0, 6.0}] (the
tombstone alone); compact(4) drops the whole first generation (its tombstone
3.0 < 4) and leaves [{5.0, 6.0}]; compact(5) then keeps 5.0; compact(6)
keeps only 6.0.

Invariants: revs within a generation are strictly increasing; every
generation but the last is non-empty and ends with its tombstone; `version`
counts all puts of the generation, including compacted ones, so the version
of revs[i] is version - (len(revs) - 1 - i) for a live generation (the
tombstone of an ended generation does not count as a put).

What its callers need, the interface a packed index (issue 17) keeps: the
shard writes with put (returning the new created revision and version),
tombstone and restore (records read back from storage), and compacts with
compact and is_empty; reads use get, is_live and `key`.  Only kvhash's
covered_revisions and the tests look at `generations` directly.
"""

from __future__ import annotations

from bisect import bisect_right

from .revision import SUB_MASK, last_of_main


class Generation:
    __slots__ = ("created", "version", "revs")

    def __init__(self) -> None:
        # (main, 0) of the creating put's revision, packed (kept after
        # compaction).  Only the main part: that is all etcd stores (a
        # KeyValue's create_revision), so data moved through etcd's format
        # comes back with the same records and the same HashKV.
        self.created = 0
        self.version = 0
        self.revs: list[int] = []

    def __repr__(self) -> str:
        return f"Generation(created={self.created}, version={self.version}, revs={self.revs})"


class KeyIndex:
    __slots__ = ("key", "generations", "lease")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.generations: list[Generation] = [Generation()]
        # The lease of the newest put while the key exists (0: none, or the
        # key is deleted), kept by the shard as it writes: folding the key
        # into a packed block needs it, and reading it from the put's record
        # would read the value store for every key merged.
        self.lease = 0

    # --- writes ----------------------------------------------------------

    def put(self, rev: int) -> tuple[int, int]:
        """Append a put; returns the key's (created, version) after it."""
        g = self.generations[-1]
        if not g.revs:
            g.created = rev & ~SUB_MASK
        g.revs.append(rev)
        g.version += 1
        return g.created, g.version

    def restore(self, rev: int, created: int, version: int) -> None:
        """Append a put read back from storage, whose create revision and
        version are known (the revisions before it may have been compacted)."""
        g = self.generations[-1]
        if not g.revs:
            g.created = created
        g.revs.append(rev)
        g.version = version

    def tombstone(self, rev: int) -> None:
        """End the live generation.  The caller checks the key is live."""
        self.lease = 0
        self.generations[-1].revs.append(rev)
        self.generations.append(Generation())

    # --- reads -----------------------------------------------------------

    def is_live(self) -> bool:
        """True when the key exists at the newest revision."""
        return bool(self.generations[-1].revs)

    def get(self, at_main: int) -> tuple[int, int, int] | None:
        """(mod revision, create revision, version) visible at main revision
        `at_main`, or None when the key does not exist then."""
        gens = self.generations
        last = gens[-1]
        revs = last.revs
        bound = last_of_main(at_main)
        # Fast path: reading the newest state of a live key.
        if revs and revs[-1] <= bound:
            return revs[-1], last.created, last.version
        for gi in range(len(gens) - 1, -1, -1):
            g = gens[gi]
            revs = g.revs
            if not revs:
                continue
            if gi != len(gens) - 1 and revs[-1] <= bound:
                return None  # tombstoned at or before at_main
            if revs[0] <= bound:
                n = bisect_right(revs, bound) - 1
                return revs[n], g.created, g.version - (len(revs) - 1 - n) + (0 if gi == len(gens) - 1 else 1)
        return None

    # --- compaction ------------------------------------------------------

    def compact(self, at_main: int, removed: list[int]) -> None:
        """Drop what no read at `at_main` or later can see; append the dropped
        revisions to `removed` (their records can be deleted)."""
        gens = self.generations
        bound = last_of_main(at_main)
        gi = 0
        while gi < len(gens) - 1 and gens[gi].revs[-1] <= bound:
            revs = gens[gi].revs
            if revs[-1] >> 32 == at_main:
                # Tombstoned exactly at the compaction revision: keep the
                # tombstone alone (see the module docstring).
                removed.extend(revs[:-1])
                del revs[:-1]
                break
            removed.extend(revs)
            gi += 1
        if gi:
            del gens[:gi]
        g = gens[0]
        n = bisect_right(g.revs, bound) - 1
        if n > 0:
            removed.extend(g.revs[:n])
            del g.revs[:n]

    def is_empty(self) -> bool:
        return len(self.generations) == 1 and not self.generations[0].revs

    def __repr__(self) -> str:
        return f"KeyIndex({self.key!r}, {self.generations})"
