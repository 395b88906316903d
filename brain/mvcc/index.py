"""A shard's key index in two tiers, with its merges: packed blocks under an
overlay of KeyIndex objects (docs/architecture.md, "The key index: packed
blocks under an overlay", has the why and the numbers).

The store reaches it, through its Shard, with these operations only:
`put` and `delete` (a write at a revision newer than any indexed), `get`
(one key's history), `key_indexes` and `entries` (the keys of a range in
key order), `live_count` (the live keys of a range without a scan),
`compact_keys` (a bounded compaction walk from a cursor), `merge` (a
bounded fold of recent writes into blocks), `load` (the whole index at
once, from a checkpoint's records) and `keys` (how many).  A key's history
comes back as a KeyIndex (an overlay or lifted key) or a PackedKey (a block
entry), which answer the same reads.  The invariants are on the fields in
TieredIndex.__init__, with a worked example.

TieredIndex is a part of a Shard (brain.mvcc.shard, which says why the
parts share one object): it owns the fields in FIELDS and is their only
writer.  Of the records part (brain.mvcc.memtable) it writes one thing:
put and delete append the record of each write to the active memtable,
in the method that indexes it.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, chain, islice
from typing import Iterable, Iterator

from sortedcontainers import SortedDict, SortedList

from .key_index import KeyIndex
from .packed import Block, KeyHistory, PackedKey, rebuild
from .revision import SUB_BITS, last_of_main


# A merge leaves rewritten lifted keys in place while a shard's unmerged
# entries are within this many times its floor; past it, it folds them all.
KEEP_REWRITTEN_WITHIN = 2
# Hot keys: a block key written again within HOT_WINDOW_PER_KEY revisions per
# key of its shard (at least HOT_WINDOW_MIN) of its last write is hot when it
# is lifted, and stays lifted, off the merges, while it is written that
# often, up to HOT_KEYS_MIN hot keys or one in HOT_KEYS_SHARE of the shard's
# keys, whichever is more.  A node Lease renewed every 10 s is such a key:
# 100k of them at 23k writes/s come back every 230k revisions, within a
# window of 400k, and each renewal appends a revision to a KeyIndex instead
# of lifting the key from its block and folding it back (measured: see
# docs/architecture.md, "Hot keys").  A bulk load writes each key once and
# makes none hot; past the cap a merge folds hot keys too, as before.
HOT_WINDOW_PER_KEY = 4
HOT_WINDOW_MIN = 1 << 16
HOT_KEYS_MIN = 1 << 18
HOT_KEYS_SHARE = 50


class TieredIndex:
    """One shard's key index: blocks, overlay, lifted keys, and the merges
    that fold the last two back into blocks."""

    __slots__ = ()
    # The fields this part owns (Shard declares them as its slots).
    FIELDS = ("block_size", "overlay", "overlay_dead", "blocks", "firsts", "fingerprints", "block_keys", "lifted",
              "lifted_died", "lifted_revived", "lifted_removed", "rewritten", "_prefix", "merge_after", "newest")
    # The records part's active memtable (brain.mvcc.memtable), which put
    # and delete append each write's record to.
    active: dict[int, tuple]
    active_order: list[int]

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size  # keys per block that merges and a restart (packed.pack_stored) build
        # The key index in two tiers (module docstring of packed.py):
        # `blocks`, immutable packed runs in key order whose first keys are
        # `firsts`, under an overlay of KeyIndex objects for the keys
        # written since.  A key the blocks hold is written in `lifted`, an
        # unordered dict keyed by its block entry, which the KeyIndex
        # replaces for reads (the entry's position gives it its place in
        # key order, so the first write to a block key costs no sorted
        # insert); every other written key is in `overlay`, sorted.
        # Invariants:
        # - overlay keys are in no block; lifted keys are each in one block;
        # - a lifted KeyIndex that compaction emptied stays (the key is
        #   gone, its entry still hidden) until a rebuild of its block
        #   drops both; `lifted_removed` counts them;
        # - `overlay_dead` lists the overlay keys that do not exist at the
        #   newest revision;
        # - a lifted key exists now exactly when its block entry is live,
        #   except for the keys in `lifted_died` (entry live, key dead or
        #   removed now) and `lifted_revived` (entry dead, key live now);
        #   a write that keeps a key live (a lease renewal) touches neither;
        # - `rewritten` marks the hot lifted keys: written again while
        #   lifted, or lifted within the hot window of their last write; a
        #   merge leaves them lifted while they are written that often
        #   (merge, HOT_WINDOW_PER_KEY).
        # With these the live keys in a range are counted by bisection
        # (``live_count``).
        # For example: block entry "a" live; a put to "a" lifts it (nothing
        # else changes); a delete adds it to lifted_died; a put again takes
        # it out; a compaction that empties a deleted "a" bumps
        # lifted_removed, and the next rebuild of its block forgets it.
        self.overlay: SortedDict = SortedDict()  # key -> KeyIndex
        self.overlay_dead: SortedList = SortedList()
        self.blocks: list[Block] = []
        self.firsts: list[bytes] = []
        # fingerprints[b]: None, or a byte per key of blocks[b] (the low
        # byte of the key's hash), made on the first look-up in the block,
        # so finding a key there is a memchr and about one key compare
        # instead of a bisection in Python (_find).  In memory only: hash()
        # of bytes differs between processes.
        self.fingerprints: list[bytes | None] = []
        self.block_keys = 0  # keys in all blocks, the lifted ones' entries included
        self.lifted: dict[bytes, KeyIndex] = {}
        self.lifted_died: SortedList = SortedList()
        self.lifted_revived: SortedList = SortedList()
        self.lifted_removed = 0
        self.rewritten: set[bytes] = set()
        self._prefix: list[int] | None = None  # live keys in blocks[:b], rebuilt when blocks change
        self.merge_after: bytes | None = None  # merge() goes round the key space from the block holding this key
        self.newest = 0  # the revision of the newest write indexed (the hot window counts back from it)

    def put(self, rev: int, key: bytes, value: bytes, lease: int) -> tuple[int, int]:
        """Index and record a put at `rev`; returns the key's (created,
        version) after it (version 1: the put created the key)."""
        ki = self.overlay.get(key)
        if ki is None:
            ki = self.lifted.get(key)
            if ki is not None:
                self.rewritten.add(key)
            elif self.blocks:
                ki = self._lift(key, rev)
            if ki is None:
                ki = self.overlay[key] = KeyIndex(key)
            elif not ki.generations[-1].revs:  # a lifted key deleted (or removed), put again
                if ki.is_empty():
                    self.lifted_removed -= 1
                if key in self.lifted_died:
                    self.lifted_died.remove(key)
                else:
                    self.lifted_revived.add(key)
        elif not ki.generations[-1].revs:  # a deleted key, put again
            self.overlay_dead.remove(key)
        created, version = ki.put(rev)
        ki.lease = lease
        self.newest = rev
        self.active[rev] = (key, value, created, version, lease)
        self.active_order.append(rev)
        return created, version

    def delete(self, rev: int, key: bytes) -> None:
        """Index and record the tombstone of live `key` at `rev`."""
        ki = self.overlay.get(key)
        if ki is not None:
            self.overlay_dead.add(key)
        else:
            ki = self.lifted.get(key)
            if ki is not None:
                self.rewritten.add(key)
            else:
                ki = self._lift(key, rev)
            if key in self.lifted_revived:
                self.lifted_revived.remove(key)
            else:
                self.lifted_died.add(key)
        ki.tombstone(rev)
        self.newest = rev
        self.active[rev] = (key, None, 0, 0, 0)
        self.active_order.append(rev)

    def _lift(self, key: bytes, rev: int) -> KeyIndex | None:
        """Give block key `key` a KeyIndex in `lifted` before its first
        write since the block was built (the write at `rev`); None when no
        block holds it.  Lifting changes no count: the key is as live as
        its entry until the write the caller makes.  A key whose last write
        is within the hot window of this one is marked hot (``rewritten``):
        merges leave it lifted while it stays hot."""
        found = self._find(key)
        if found is None:
            return None
        ki = self.lifted[key] = found[0].key_index(found[1], key)
        if (rev >> SUB_BITS) - (_last_rev(ki) >> SUB_BITS) <= self._hot_window():
            self.rewritten.add(key)
        return ki

    def _hot_window(self) -> int:
        """How many main revisions back a write makes a key hot."""
        return max(HOT_WINDOW_MIN, HOT_WINDOW_PER_KEY * self.keys())

    def _hot_cap(self, floor: int) -> int:
        """How many unmerged entries a shard keeps while merges leave hot
        keys lifted; past it they fold them too.  A floor of 0 keeps none
        (a merge of everything, as before a repack)."""
        if not floor:
            return 0
        return max(KEEP_REWRITTEN_WITHIN * floor, HOT_KEYS_MIN, self.keys() // HOT_KEYS_SHARE)

    def _is_hot(self, ki: KeyIndex) -> bool:
        return (self.newest >> SUB_BITS) - (_last_rev(ki) >> SUB_BITS) <= self._hot_window()

    def _find(self, key: bytes) -> tuple[Block, int] | None:
        """The block entry of `key`, lifted or not."""
        b = bisect_right(self.firsts, key) - 1
        if b < 0:
            return None
        block = self.blocks[b]
        marks = self._marks(b)
        mark = hash(key) & 0xFF
        i = marks.find(mark)
        if i >= 0:
            keys, ends = block.keys, block.ends
            while i >= 0:
                if keys[ends[i - 1] if i else 0:ends[i]] == key:
                    return block, i
                i = marks.find(mark, i + 1)
        return None

    def _marks(self, b: int) -> bytes:
        """The fingerprint bytes of blocks[b], made on the first call."""
        marks = self.fingerprints[b]
        if marks is None:
            keys, ends = self.blocks[b].keys, self.blocks[b].ends
            marks = self.fingerprints[b] = bytes([hash(keys[lo:hi]) & 0xFF for lo, hi in zip(chain((0,), ends), ends)])
        return marks

    def get(self, key: bytes) -> KeyHistory | None:
        ki = self.overlay.get(key)
        if ki is not None or not self.blocks:
            return ki
        ki = self.lifted.get(key)
        if ki is not None:
            return None if ki.is_empty() else ki
        found = self._find(key)
        return None if found is None else PackedKey(found[0], found[1], key)

    def key_indexes(self, key: bytes, end: bytes | None) -> Iterator[KeyHistory]:
        """The history of every key in [key, end), in key order; end None
        = no upper bound."""
        if not self.blocks:
            overlay = self.overlay
            keys = overlay.irange(key, end, inclusive=(True, False)) if end is not None else overlay.irange(key)
            return map(overlay.__getitem__, keys)
        return self.entries(key, False, end)

    def entries(self, start: bytes | None, after: bool, end: bytes | None) -> Iterator[KeyHistory]:
        """The history of every key from `start` (None: the first; `after`:
        excluding start itself) up to `end` (exclusive; None: no bound), in
        key order: the overlay merged with the blocks' entries, each lifted
        one replaced by its KeyIndex (the two tiers are disjoint)."""
        overlay, lifted, blocks = self.overlay, self.lifted, self.blocks
        okeys = overlay.irange(start, end, inclusive=(not after, False)) if end is not None else \
            overlay.irange(start, None, inclusive=(not after, True))
        ok = next(okeys, None)
        first = 0 if start is None else max(0, bisect_right(self.firsts, start) - 1)
        for b in range(first, len(blocks)):
            block = blocks[b]
            keys, ends = block.keys, block.ends
            n = len(ends)
            i = 0
            if b == first and start is not None:
                i = block.bisect_left(start)
                if after and i < n and block.key(i) == start:
                    i += 1
            stop = n if end is None else block.bisect_left(end)
            lo = ends[i - 1] if i else 0
            for i in range(i, stop):
                hi = ends[i]
                k = keys[lo:hi]
                lo = hi
                while ok is not None and ok < k:
                    yield overlay[ok]
                    ok = next(okeys, None)
                ki = lifted.get(k) if lifted else None
                if ki is None:
                    yield PackedKey(block, i, k)
                elif not ki.is_empty():
                    yield ki
            if stop < n:
                break
        while ok is not None:
            yield overlay[ok]
            ok = next(okeys, None)

    def load(self, blocks: Iterable[Block]) -> None:
        """Take a whole index packed at start-up (brain.mvcc.packed.pack_stored:
        blocks in key order, each key in one of them, each with its keys'
        leases), with an empty overlay."""
        self.overlay = SortedDict()
        self.overlay_dead = SortedList()
        self.lifted = {}
        self.lifted_died = SortedList()
        self.lifted_revived = SortedList()
        self.lifted_removed = 0
        self.rewritten = set()
        self.merge_after = None
        self.blocks, self.firsts, self.fingerprints, self.block_keys = [], [], [], 0
        self._replace(0, 0, list(blocks))

    @staticmethod
    def lease_of(history: KeyHistory) -> int:
        """The lease of a key's newest put (0: none, or the key does not
        exist now), which both kinds of history keep: no record is read."""
        return history.lease

    def keys(self) -> int:
        """Keys in the index, live or with history only."""
        return len(self.overlay) + self.block_keys - self.lifted_removed

    def live_count(self, key: bytes, end: bytes | None) -> int:
        """Keys in [key, end) that exist at the newest revision (end None:
        no upper bound), in O(log n)."""
        overlay, dead = self.overlay, self.overlay_dead
        if end is None:
            n = (len(overlay) - overlay.bisect_left(key)) - (len(dead) - dead.bisect_left(key))
        else:
            n = (overlay.bisect_left(end) - overlay.bisect_left(key)) - (dead.bisect_left(end) - dead.bisect_left(key))
        if not self.blocks:
            return n
        flips = 0
        for keys, sign in ((self.lifted_revived, 1), (self.lifted_died, -1)):
            if keys:
                flips += sign * ((len(keys) if end is None else keys.bisect_left(end)) - keys.bisect_left(key))
        return n + self._live_before(end) - self._live_before(key) + flips

    def _live_before(self, key: bytes | None) -> int:
        """Live block entries (lifted ones' included) with keys below `key`
        (None: all of them)."""
        prefix = self._prefix
        if prefix is None:
            prefix = self._prefix = [0, *accumulate(blk.live for blk in self.blocks)]
        if key is None:
            return prefix[-1]
        b = bisect_right(self.firsts, key) - 1
        if b < 0:
            return 0
        block = self.blocks[b]
        return prefix[b] + block.live_before(block.bisect_left(key))

    # --- block rebuilds, for compaction and merges ----------------------

    def _unlift(self, key: bytes) -> KeyIndex:
        """Take `key` out of `lifted` (its block is being rebuilt with the
        KeyIndex returned in place of its entry), with its bookkeeping."""
        ki = self.lifted.pop(key)
        self.rewritten.discard(key)
        if ki.is_live():
            self.lifted_revived.discard(key)
        else:
            self.lifted_died.discard(key)
            if ki.is_empty():
                self.lifted_removed -= 1
        return ki

    def _replace(self, b: int, count: int, new: list[Block], marks: list[bytes] | None = None) -> int:
        """Put `new` in place of blocks[b:b + count] (with their fingerprint
        bytes `marks`, when known); returns len(new)."""
        self.block_keys += sum(map(len, new)) - sum(map(len, self.blocks[b:b + count]))
        self.blocks[b:b + count] = new
        self.firsts[b:b + count] = [blk.first for blk in new]
        self.fingerprints[b:b + count] = marks if marks is not None else [None] * len(new)
        self._prefix = None
        return len(new)

    # --- compaction -----------------------------------------------------

    def compact_keys(self, rev: int, cursor: bytes | None, budget: int,
                     removed: list[int]) -> tuple[bytes | None, int]:
        """Compact at `rev` up to `budget` keys after `cursor` (None: from
        the first); returns the key to continue after (None: the shard is
        done) and how many keys were done, and appends to `removed` the
        revisions whose records no read can ask for now (Shard.compact
        drops them).  Keys left with no history leave the index.  A block counts as one key (plus its lifted
        keys, compacted in place) when nothing in it can be dropped (its
        `minhist` is newer than `rev`), else as all of its keys, since it
        is rebuilt whole, its lifted keys folded back in; overlay keys
        inside a block's range are done before the block."""
        overlay, blocks = self.overlay, self.blocks
        bound = last_of_main(rev)
        done = 0
        b = 0 if cursor is None else max(0, bisect_right(self.firsts, cursor) - 1)
        if b < len(blocks) and cursor is not None and blocks[b].last <= cursor:
            b += 1
        while True:
            upto = blocks[b].last if b < len(blocks) else None
            batch = list(islice(overlay.irange(cursor, upto, inclusive=(False, True)), budget - done))
            for k in batch:
                ki = overlay[k]
                ki.compact(rev, removed)
                if ki.is_empty():
                    del overlay[k]
                    self.overlay_dead.discard(k)
            done += len(batch)
            if batch:
                cursor = batch[-1]
            if b >= len(blocks) or (done >= budget and cursor != upto):
                break  # (at the block's last key the block is still to do: the cursor would skip it)
            block = blocks[b]
            cursor = block.last
            if block.minhist <= bound:
                done += len(block)
                b += self._compact_block(b, rev, removed)
            else:
                done += 1 + self._compact_lifted(block, rev, removed)
                b += 1
            if done >= budget:
                break
        return (cursor if done >= budget else None), done

    def _compact_block(self, b: int, rev: int, removed: list[int]) -> int:
        """Rebuild block `b` compacted at `rev`, its lifted keys' histories
        folded back in place of their entries (those compaction empties
        are gone); returns how many blocks replace it (0 or 1)."""
        block = self.blocks[b]
        lifted = self.lifted
        kept: list[KeyHistory] = []
        leases: list[int] = []  # compaction never drops a key's newest put: its lease stays
        for i in range(len(block)):
            k = block.key(i)
            if k in lifted:
                ki = self._unlift(k)
            elif block.has_history(i):
                ki = block.key_index(i)
            else:
                kept.append(PackedKey(block, i, k))
                leases.append(block.lease(i))
                continue
            ki.compact(rev, removed)
            if not ki.is_empty():
                kept.append(ki)
                leases.append(ki.lease)
        return self._replace(b, 1, [Block(kept, leases)] if kept else [])

    def _compact_lifted(self, block: Block, rev: int, removed: list[int]) -> int:
        """Compact the lifted keys of a block that is not rebuilt; returns
        how many there were."""
        lifted = self.lifted
        if not lifted:
            return 0
        n = 0
        for i in range(len(block)):
            ki = lifted.get(block.key(i))
            if ki is not None:
                n += 1
                if not ki.is_empty():
                    ki.compact(rev, removed)
                    if ki.is_empty():
                        self.lifted_removed += 1
        return n

    # --- merges ---------------------------------------------------------

    def merge(self, budget: int, floor: int, compacting: bytes | None = None) -> int:
        """Fold overlay and lifted keys into the blocks while more than
        `floor` entries wait (merge_due), for about `budget` keys of
        rebuilding; returns the keys rebuilt (a block passed over counts
        as one).  Each round takes the block after the last round's (so
        rounds go round the key space; the same block again while overlay
        keys remain in its range after the last round's end): up to the
        rest of the budget of the overlay keys in its range, and its
        lifted keys, but not the hot ones (marked in `rewritten` and
        written within the hot window) while the unmerged entries are
        within the hot cap: a lease renewed every few seconds stays lifted
        instead of being folded and lifted again each cycle.  The result is
        split into blocks of `block_size`.

        ``compacting``: the cursor of a compaction walking this shard.  The
        block it stopped inside is left as it is: the walk has compacted
        the overlay keys up to the cursor but not the block, which it knows
        is still to do because the block's last key is past the cursor.
        Folded with those overlay keys, the block could end at or before
        the cursor, and the walk would skip it with its keys uncompacted."""
        done = 0
        pending = self._pending_block(compacting)
        while done < budget and self.merge_due(floor):
            keep = self.unmerged() <= self._hot_cap(floor)
            rebuilt = self._merge_round(max(1, budget - done), keep, pending)
            if not rebuilt:
                break  # nothing to fold but the pending block
            done += rebuilt
        return done

    def _pending_block(self, cursor: bytes | None) -> Block | None:
        """The block a compaction stopped inside at ``cursor`` (compact_keys
        continues there: the block whose range holds the cursor, when its
        last key is past it), or None."""
        if cursor is None or not self.blocks:
            return None
        block = self.blocks[max(0, bisect_right(self.firsts, cursor) - 1)]
        return block if block.last > cursor else None

    def unmerged(self) -> int:
        """Index entries out of the blocks: overlay keys, and lifted keys
        (the removed ones among them included)."""
        return len(self.overlay) + len(self.lifted)

    def merge_due(self, floor: int) -> bool:
        """True when merge() has work: more than `floor` unmerged entries,
        and more than `floor` of them not marked hot unless they pass the
        hot cap."""
        unmerged = self.unmerged()
        return unmerged > floor and (unmerged - len(self.rewritten) > floor or unmerged > self._hot_cap(floor))

    def _merge_round(self, limit: int, keep_rewritten: bool, pending: Block | None = None) -> int:
        """Rebuild the next block with something to fold (at most one
        round of the key space), never ``pending`` (merge); returns the keys
        rebuilt plus the blocks passed over, 0 when only ``pending`` had
        something to fold."""
        overlay, blocks, firsts = self.overlay, self.blocks, self.firsts
        if not blocks:
            return self._fold(0, list(islice(overlay, limit)), False)
        b = 0
        if self.merge_after is not None:
            b = max(0, bisect_right(firsts, self.merge_after) - 1)
            hi = firsts[b + 1] if b + 1 < len(blocks) else None
            if next(overlay.irange(self.merge_after, hi, inclusive=(False, False)), None) is None:
                b = (b + 1) % len(blocks)
        passed = 0
        while passed <= len(blocks):
            if blocks[b] is not pending:
                lo = firsts[b] if b else None
                hi = firsts[b + 1] if b + 1 < len(blocks) else None
                taken = list(islice(overlay.irange(lo, hi, inclusive=(True, False)) if hi is not None
                                    else overlay.irange(lo), limit))
                rebuilt = self._fold(b, taken, keep_rewritten)
                if rebuilt:
                    return rebuilt + passed
            passed += 1
            self.merge_after = blocks[b].last
            b = (b + 1) % len(blocks)
        return 0 if pending is not None else passed

    def _fold(self, b: int, taken: list[bytes], keep_rewritten: bool) -> int:
        """Rebuild block `b` (none: there are no blocks) with the overlay
        keys `taken` (in its range, in order) and its lifted keys folded
        in, those in `rewritten` left lifted once when `keep_rewritten`;
        returns the work done in keys: each key folded, and a sixteenth of
        each entry copied (runs of unchanged entries are copied as array
        slices, BlockBuilder.add_run), 0 when there was nothing to fold
        (the block is left as it was, its rewritten marks spent)."""
        overlay, lifted, rewritten = self.overlay, self.lifted, self.rewritten
        block = self.blocks[b] if self.blocks else None
        n = len(block) if block is not None else 0
        # What changes, by position in the block: (position, 0, overlay
        # key) goes before the entry at that position (the tiers are
        # disjoint), (position, 1, key) replaces a lifted entry.
        changes: list[tuple[int, int, bytes]] = []
        if lifted and block is not None:
            keys, lo = block.keys, 0
            for i, hi in enumerate(block.ends):
                k = keys[lo:hi]
                lo = hi
                if k in lifted:
                    if not (keep_rewritten and k in rewritten and self._is_hot(lifted[k])):
                        changes.append((i, 1, k))  # (a hot key's entry stays, still lifted)
        if not changes and not taken:
            return 0
        changes += [(block.bisect_left(k) if block is not None else 0, 0, k) for k in taken]
        changes.sort()
        old_marks = self._marks(b) if block is not None else None
        edits = [(pos, bool(lifted_entry), self._unlift(k) if lifted_entry else overlay[k])
                 for pos, lifted_entry, k in changes]
        built, marks = rebuild(block, old_marks, edits, self.block_size)
        for k in taken:
            del overlay[k]
            self.overlay_dead.discard(k)
        self._replace(b, 0 if block is None else 1, built, marks)
        if built:
            self.merge_after = built[-1].last
        else:
            self.merge_after = self.blocks[b - 1].last if b else None
        return len(changes) + (n + 15) // 16


def _last_rev(ki: KeyIndex) -> int:
    """The revision of a key's last write (its tombstone's, when deleted;
    0 for a key compaction emptied, which is never hot)."""
    gens = ki.generations
    if gens[-1].revs:
        return gens[-1].revs[-1]
    return gens[-2].revs[-1] if len(gens) > 1 else 0
