"""One shard: a key range with its own key index and its own record table.

Records (the value of every revision of every key) live in three places, newest
first: `active`, the memtable filling since the last checkpoint cut; `frozen`,
the memtable being written to the value store by a checkpoint in progress;
and the value store itself.  A record is in exactly one of them (a compacted
record in `frozen` stays readable until the checkpoint ends, but nobody can
ask for it: reads below the compaction revision are refused).

The store reaches a shard's key index through these operations only:
`put` and `delete` (a write at a revision newer than any indexed), `get`
(one key's history), `key_indexes` (the keys of a range in key order),
`live_count` (the live keys of a range without a scan), `compact` (a
bounded walk from a cursor), `merge` (a bounded fold of recent writes into
blocks), `load` (the whole index at once, from a checkpoint's records),
`keys` (how many) and `covered` (a bounded step of the engine's history
walk, brain.engine.history).  A key's history comes back as a KeyIndex (an
overlay or lifted key) or a PackedKey (a block entry), which answer the same reads.  The
index has two tiers, packed blocks under an overlay of KeyIndex objects
(the invariants are on the fields in Shard.__init__; docs/architecture.md
has the why and the numbers).  Only tests look at `index` and `dead`, read-only
views of both tiers merged.  Which shard holds a key is brain.mvcc.shard_map's.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from itertools import accumulate, chain, islice, repeat
from typing import Iterable, Iterator, Sequence

from sortedcontainers import SortedDict, SortedList

from .codec import decode_record, decode_value_lease
from .key_index import KeyIndex
from .kvhash import covered_revisions
from .packed import BLOCK_KEYS, Block, BlockBuilder, KeyHistory, PackedKey
from .revision import last_of_main, to_bytes


# A merge leaves rewritten lifted keys in place while a shard's unmerged
# entries are within this many times its floor; past it, it folds them all.
KEEP_REWRITTEN_WITHIN = 2


class Shard:
    __slots__ = ("id", "overlay", "overlay_dead", "blocks", "firsts", "fingerprints", "block_keys", "lifted", "lifted_died",
                 "lifted_revived", "lifted_removed", "rewritten", "_prefix", "block_size", "merge_after", "active",
                 "frozen", "active_order", "frozen_order", "pending_deletes", "backend")

    def __init__(self, shard_id: int, backend, block_size: int = BLOCK_KEYS) -> None:
        self.id = shard_id
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
        # - `rewritten` lists lifted keys written since they were lifted
        #   or since a merge last passed their block: a merge leaves them
        #   lifted once (merge_due).
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
        ki = self.overlay.get(key)
        if ki is None:
            ki = self.lifted.get(key)
            if ki is not None:
                self.rewritten.add(key)
            elif self.blocks:
                ki = self._lift(key)
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
                ki = self._lift(key)
            if key in self.lifted_revived:
                self.lifted_revived.remove(key)
            else:
                self.lifted_died.add(key)
        ki.tombstone(rev)
        self.active[rev] = (key, None, 0, 0, 0)
        self.active_order.append(rev)

    def _lift(self, key: bytes) -> KeyIndex | None:
        """Give block key `key` a KeyIndex in `lifted` before its first
        write since the block was built; None when no block holds it.
        Lifting changes no count: the key is as live as its entry until
        the write the caller makes."""
        found = self._find(key)
        if found is None:
            return None
        ki = self.lifted[key] = found[0].key_index(found[1], key)
        return ki

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
                base = len(out.keys)
                out.keys += run
                out.mods += mods[i:take]
                out.created += block.created[i:take]
                out.versions += block.versions[i:take]
                leases = out.leases
                leases += repeat(0, take - i)
                lease_pos = block.lease_pos
                for q in range(bisect_left(lease_pos, i), bisect_left(lease_pos, take)):
                    leases[base + lease_pos[q] - i] = block.leases[q]
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
                out.add(k, mod, created[pos], versions[pos], block.lease(pos))
            elif newest:
                continue  # deleted at or before at_main
            else:
                found = block.get(pos, at_main)
                if found is None:
                    continue
                out.add(k, found[0], found[1], found[2], None)  # an older put: its record has its lease
            if len(out.keys) == room:
                return True
        return False

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

    def compact(self, rev: int, cursor: bytes | None, budget: int) -> tuple[bytes | None, int]:
        """Compact at `rev` up to `budget` keys after `cursor` (None: from
        the first); returns the key to continue after (None: the shard is
        done) and how many keys were done.  Keys left with no history
        leave the index.  A block counts as one key (plus its lifted
        keys, compacted in place) when nothing in it can be dropped (its
        `minhist` is newer than `rev`), else as all of its keys, since it
        is rebuilt whole, its lifted keys folded back in; overlay keys
        inside a block's range are done before the block."""
        overlay, blocks = self.overlay, self.blocks
        bound = last_of_main(rev)
        removed: list[int] = []
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
        for r in removed:
            self.drop(r)
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

    def merge(self, budget: int, floor: int) -> int:
        """Fold overlay and lifted keys into the blocks while more than
        `floor` entries wait (merge_due), for about `budget` keys of
        rebuilding; returns the keys rebuilt (a block passed over counts
        as one).  Each round takes the block after the last round's (so
        rounds go round the key space; the same block again while overlay
        keys remain in its range after the last round's end): up to the
        rest of the budget of the overlay keys in its range, and its
        lifted keys, but those in `rewritten` it passes over once, while
        the unmerged entries are within KEEP_REWRITTEN_WITHIN times the
        floor (second chance: a lease renewed every few seconds stays
        lifted instead of being folded and lifted again each cycle).  The
        result is split into blocks of `block_size`."""
        done = 0
        while done < budget and self.merge_due(floor):
            keep = self.unmerged() <= KEEP_REWRITTEN_WITHIN * floor
            done += self._merge_round(max(1, budget - done), keep)
        return done

    def unmerged(self) -> int:
        """Index entries out of the blocks: overlay keys, and lifted keys
        (the removed ones among them included)."""
        return len(self.overlay) + len(self.lifted)

    def merge_due(self, floor: int) -> bool:
        """True when merge() has work: more than `floor` unmerged entries,
        and more than `floor` of them not rewritten unless they pass
        KEEP_REWRITTEN_WITHIN times the floor."""
        unmerged = self.unmerged()
        return unmerged > floor and (unmerged - len(self.rewritten) > floor
                                     or unmerged > KEEP_REWRITTEN_WITHIN * floor)

    def _merge_round(self, limit: int, keep_rewritten: bool) -> int:
        """Rebuild the next block with something to fold (at most one
        round of the key space); returns the keys rebuilt plus the blocks
        passed over."""
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
        return passed

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
                    if keep_rewritten and k in rewritten:
                        rewritten.discard(k)  # the entry stays, still lifted
                    else:
                        changes.append((i, 1, k))
        if not changes and not taken:
            return 0
        changes += [(block.bisect_left(k) if block is not None else 0, 0, k) for k in taken]
        changes.sort()
        size = self.block_size
        built: list[Block] = []
        marks: list[bytes] = []
        old_marks = self._marks(b) if block is not None else None
        builder = BlockBuilder(marks=True)

        def close() -> None:
            nonlocal builder
            marks.append(bytes(builder.marks))
            built.append(builder.build())
            builder = BlockBuilder(marks=True)

        def copy(i: int, j: int) -> None:
            while i < j:
                upto = min(j, i + size - len(builder))
                builder.add_run(block, i, upto, old_marks)
                i = upto
                if len(builder) == size:
                    close()

        def add(ki: KeyIndex) -> None:
            if ki.is_empty():
                return
            builder.add_generations(ki.key, ki.generations, ki.lease)
            if len(builder) == size:
                close()

        cursor = 0
        for pos, lifted_entry, k in changes:
            if pos > cursor:
                copy(cursor, pos)
                cursor = pos
            if lifted_entry:
                add(self._unlift(k))
                cursor = pos + 1
            else:
                add(overlay[k])
        copy(cursor, n)
        if len(builder):
            close()
        for k in taken:
            del overlay[k]
            self.overlay_dead.discard(k)
        self._replace(b, 0 if block is None else 1, built, marks)
        if built:
            self.merge_after = built[-1].last
        else:
            self.merge_after = self.blocks[b - 1].last if b else None
        return len(changes) + (n + 15) // 16

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

    def covered(self, cursor: bytes | None, compact_rev: int, upto: int, max_revisions: int,
                max_keys: int) -> tuple[list[int], int, bytes | None]:
        """One bounded step of a history walk: the covered revisions
        (kvhash.covered_revisions at `compact_rev`, up to main revision
        `upto`) of the keys after `cursor` (None: from the first), in key
        then revision order, until `max_revisions` revisions or `max_keys`
        keys; returns them, how many of those keys exist at `upto`, and the
        cursor to continue from (None: the shard is done).  A key's
        revisions are never split between steps."""
        revisions: list[int] = []
        alive = scanned = 0
        for ki in self.entries(cursor, True, None):
            scanned += 1
            revs = covered_revisions(ki, compact_rev, upto)
            if revs:
                revisions.extend(revs)
                if ki.get(upto) is not None:
                    alive += 1
            if len(revisions) >= max_revisions or scanned >= max_keys:
                return revisions, alive, ki.key
        return revisions, alive, None

    # --- read-only views of the index, for tests that look inside -------

    @property
    def index(self) -> Mapping[bytes, KeyHistory]:
        """Every key's history, both tiers merged, as a read-only mapping."""
        return IndexView(self)

    @property
    def dead(self) -> list[bytes]:
        """The index's keys that do not exist at the newest revision, in order."""
        return [ki.key for ki in self.entries(None, False, None) if not ki.is_live()]


class IndexView(Mapping):
    """A shard's index as a read-only mapping, key -> history, in key order."""

    __slots__ = ("shard",)

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def __getitem__(self, key: bytes) -> KeyHistory:
        ki = self.shard.get(key)
        if ki is None:
            raise KeyError(key)
        return ki

    def __iter__(self) -> Iterator[bytes]:
        return (ki.key for ki in self.shard.entries(None, False, None))

    def __len__(self) -> int:
        return self.shard.keys()


class Found:
    """What Shard.visible collects, column by column: the key, its mod and
    create revisions (packed) and version, and its lease (None: only the
    record of an older put has it)."""

    __slots__ = ("keys", "mods", "created", "versions", "leases")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.mods: list[int] = []
        self.created: list[int] = []
        self.versions: list[int] = []
        self.leases: list[int | None] = []

    def add(self, key: bytes, mod: int, created: int, version: int, lease: int | None) -> None:
        self.keys.append(key)
        self.mods.append(mod)
        self.created.append(created)
        self.versions.append(version)
        self.leases.append(lease)

    def add_history(self, history: KeyHistory, at_main: int) -> bool:
        """Add the key of `history` if it exists at `at_main`; True if it
        did.  Its lease is known when what is found is the newest put."""
        found = history.get(at_main)
        if found is None:
            return False
        newest = history.generations[-1].revs if type(history) is KeyIndex else None
        lease = history.lease if newest and newest[-1] == found[0] else None
        self.add(history.key, found[0], found[1], found[2], lease)
        return True
