"""Which keys a read at a revision sees, in bulk: the read of a list.

A read at main revision R sees, of each key, its newest put at or below R
if the key was not deleted between that put and R.  For a block entry that
is three array reads when the key's newest change is a put at or below R
(when the block's `maxrev` is at or below R, every entry's newest state is
the one R sees); an older state goes through the key's generations
(brain.mvcc.key_index has the worked example).
For example, "a" put at 3 and 6, "b" put at 4 and deleted at 7, "c" put at
8, all packed: a read at 5 sees a@3 (its older state) and b@4, a read at
7 sees a@6 only, a read at 8 sees a@6 and c@8.

`visible` appends what it finds to a Found, column by column (the key,
mod and create revisions, version), which reads.py turns into a
RangeColumns: no object per key.  Visibility is a part of a Shard
(brain.mvcc.shard); it writes nothing of it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from .packed import Block, KeyHistory
from .revision import last_of_main


class Found:
    """What Shard.visible collects, column by column: the key, its mod and
    create revisions (packed) and version, all from the index (a value or
    a lease is read from the record at the mod revision)."""

    __slots__ = ("keys", "mods", "created", "versions")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.mods: list[int] = []
        self.created: list[int] = []
        self.versions: list[int] = []

    def add(self, key: bytes, mod: int, created: int, version: int) -> None:
        self.keys.append(key)
        self.mods.append(mod)
        self.created.append(created)
        self.versions.append(version)

    def add_history(self, history: KeyHistory, at_main: int) -> bool:
        """Add the key of `history` if it exists at `at_main`; True if it
        did."""
        found = history.get(at_main)
        if found is None:
            return False
        self.add(history.key, found[0], found[1], found[2])
        return True


class Visibility:
    """The bulk read of a shard's two tiers (brain.mvcc.index.TieredIndex's
    fields, read only)."""

    __slots__ = ()

    def visible(self, start: bytes, end: bytes | None, at_main: int, out: Found, room: int) -> None:
        """Append to `out` the keys in [start, end) (end None: no bound)
        that exist at main revision `at_main`, in key order, until `out`
        holds `room` keys (0: no limit).  The bulk read of a list: a run of
        block entries is taken from the block's arrays, whole slices at a
        time where every entry is live, not lifted and no newer than
        `at_main`; only overlay and lifted keys and entries read at an older
        state go one by one."""
        overlay, blocks = self.overlay, self.blocks
        okeys = overlay.irange(start, end, inclusive=(True, False)) if end is not None else overlay.irange(start)
        ok = next(okeys, None)
        bound = last_of_main(at_main)
        b = max(0, bisect_right(self.firsts, start) - 1)
        i = blocks[b].bisect_left(start) if blocks else 0
        while b < len(blocks):
            block = blocks[b]
            n = len(block)
            stop = n if end is None else block.bisect_left(end)
            while i < stop:
                p = stop if ok is None else min(stop, block.bisect_left(ok))
                if p > i:
                    if self._visible_run(block, i, p, bound, at_main, out, room):
                        return
                    i = p
                if i < stop:  # the overlay key `ok` comes before entry i (the tiers are disjoint)
                    if out.add_history(overlay[ok], at_main) and len(out.keys) == room:
                        return
                    ok = next(okeys, None)
            if stop < n:
                break
            b += 1
            i = 0
        while ok is not None:
            if out.add_history(overlay[ok], at_main) and len(out.keys) == room:
                return
            ok = next(okeys, None)

    def _visible_run(self, block: Block, i: int, j: int, bound: int, at_main: int, out: Found, room: int) -> bool:
        """Entries i..j-1 of `block` for visible(); True when `out` is full."""
        keys, ends, mods = block.keys, block.ends, block.mods
        lifted = self.lifted
        newest = block.maxrev <= bound  # every entry's newest state is visible: dead ones were dead at at_main
        take = j if not room else min(j, i + room - len(out.keys))  # the fast path adds one key per entry
        if newest and block.live_rank[take] - block.live_rank[i] == take - i:
            starts = ends[i - 1:take - 1] if i else array("I", (0,)) + ends[:take - 1]
            run = [keys[a:z] for a, z in zip(starts, ends[i:take])]
            if not lifted or lifted.keys().isdisjoint(run):  # no entry of the run replaced by a lifted key
                out.keys += run
                out.mods += mods[i:take]
                out.created += block.created[i:take]
                out.versions += block.versions[i:take]
                return take < j or len(out.keys) == room
        created, versions = block.created, block.versions
        lo = ends[i - 1] if i else 0
        for pos in range(i, j):
            hi = ends[pos]
            k = keys[lo:hi]
            lo = hi
            if lifted and k in lifted:
                ki = lifted[k]
                if not ki.is_empty() and out.add_history(ki, at_main) and len(out.keys) == room:
                    return True
                continue
            mod = mods[pos]
            if mod and mod <= bound:
                out.add(k, mod, created[pos], versions[pos])
            elif newest:
                continue  # deleted at or before at_main
            else:
                found = block.get(pos, at_main)
                if found is None:
                    continue
                out.add(k, found[0], found[1], found[2])
            if len(out.keys) == room:
                return True
        return False
