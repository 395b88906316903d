"""Packed blocks: a sorted run of keys and their histories in a few flat
arrays instead of a KeyIndex, a Generation and a list per key (issue 17).

A block is immutable.  It holds up to about BLOCK_KEYS keys, in key order:

* `keys`, the keys concatenated, and `ends`, where each one ends;
* per key, the newest put of its live generation as three typed arrays
  (`mods`, `created`, `versions`; mod 0 = the key does not exist now:
  no revision is ever 0.0);
* `live_rank[i]`, how many of the keys before position i exist now, so a
  count of live keys between two positions is a subtraction;
* a history section for the few keys with anything besides that one put
  (older revisions, ended generations, a tombstone): `hist_pos` lists
  their positions, and `hist` holds each one's generations flattened as
  (created, version, revision count, revisions...) per generation, between
  `hist_off[j]` and `hist_off[j + 1]`;
* a lease section for the keys whose newest put (the one in `mods`)
  carries a lease: their positions in `lease_pos`, the lease IDs in
  `leases`.  Sparse, since most keys have none (node leases and events
  do).  No Range reads it since brain answers keys_only from the index
  without leases, as etcd 3.7 does (brain.mvcc.reads.index_only); it is
  kept, with KeyIndex.lease, for the day a keys_only answer carries the
  lease again (as etcd 3.4 and 3.6 answer), without reading records.

Worked example.  "a" put at 4.0; "b" put at 2.0, deleted at 3.0; "c" put at
5.0 and 6.0.  Then keys = b"abc", ends = [1, 2, 3], mods = [4.0, 0, 6.0],
created = [4.0, 0, 5.0], versions = [1, 0, 2], live_rank = [0, 1, 1, 2],
hist_pos = [1, 2]: "b" as (2.0, 1, 2, 2.0, 3.0) (0, 0, 0) (ended, then the
empty live generation), "c" as (5.0, 2, 2, 5.0, 6.0).  "a" has no history
entry: its one revision is all there is.  Had "c"'s put at 6.0 carried
lease 7, lease_pos = [2] and leases = [7].

Reading the newest state of a key costs three array reads; anything older
rebuilds that key's generations and asks KeyIndex, so the rules of
key_index.py stay in one place.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Iterable, Iterator, Union

from .key_index import Generation, KeyIndex
from .revision import SUB_BITS, SUB_MASK

BLOCK_KEYS = 128  # keys per block: small enough to rebuild for one change, large enough to amortize headers

NO_HISTORY = 1 << 62  # `minhist` of a block whose keys all have one revision


class Block:
    __slots__ = ("keys", "ends", "mods", "created", "versions", "live_rank", "hist_pos", "hist_off", "hist",
                 "lease_pos", "leases", "maxrev", "minhist")

    def __init__(self, key_indexes: Iterable[KeyIndex], leases: Iterable[int]) -> None:
        """Pack `key_indexes` (any objects with `key` and `generations`),
        which must come in strictly increasing key order, none empty;
        `leases` gives, in the same order, the lease of each one's newest
        put (0: none, or the key does not exist now)."""
        builder = BlockBuilder()
        for ki, lease in zip(key_indexes, leases, strict=True):
            builder.add_generations(ki.key, ki.generations, lease)
        builder.fill(self)

    def __len__(self) -> int:
        return len(self.ends)

    def key(self, i: int) -> bytes:
        return self.keys[self.ends[i - 1] if i else 0:self.ends[i]]

    @property
    def first(self) -> bytes:
        return self.key(0)

    @property
    def last(self) -> bytes:
        return self.key(len(self.ends) - 1)

    def bisect_left(self, key: bytes) -> int:
        """The first position whose key is >= `key`."""
        lo, hi = 0, len(self.ends)
        keys, ends = self.keys, self.ends
        while lo < hi:
            mid = (lo + hi) >> 1
            if keys[ends[mid - 1] if mid else 0:ends[mid]] < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def is_live(self, i: int) -> bool:
        return self.mods[i] != 0

    def live_before(self, i: int) -> int:
        """How many keys before position `i` exist now."""
        return self.live_rank[i]

    @property
    def live(self) -> int:
        return self.live_rank[-1]

    def has_history(self, i: int) -> bool:
        return self._hist_slot(i) >= 0

    def _hist_slot(self, i: int) -> int:
        pos = self.hist_pos
        lo = bisect_left(pos, i)
        return lo if lo < len(pos) and pos[lo] == i else -1

    def lease(self, i: int) -> int:
        """The lease of key `i`'s newest put (0: none, or the key does not exist now)."""
        pos = self.lease_pos
        j = bisect_left(pos, i)
        return self.leases[j] if j < len(pos) and pos[j] == i else 0

    def generations(self, i: int) -> list[Generation]:
        """A fresh copy of key `i`'s generations."""
        j = self._hist_slot(i)
        if j < 0:
            g = Generation()
            g.created, g.version, g.revs = self.created[i], self.versions[i], [self.mods[i]]
            return [g]
        flat, at, stop = self.hist, self.hist_off[j], self.hist_off[j + 1]
        gens = []
        while at < stop:
            g = Generation()
            g.created, g.version, n = flat[at], flat[at + 1], flat[at + 2]
            g.revs = flat[at + 3:at + 3 + n].tolist()
            gens.append(g)
            at += 3 + n
        return gens

    def key_index(self, i: int, key: bytes | None = None) -> KeyIndex:
        """Key `i` (`key`, when the caller has it) as a fresh KeyIndex (to
        write to it, or compact it)."""
        ki = KeyIndex(self.key(i) if key is None else key)
        ki.lease = self.lease(i)
        pos = self.hist_pos
        j = bisect_left(pos, i)
        if j < len(pos) and pos[j] == i:
            ki.generations = self.generations(i)
        else:  # one revision (most keys): fill the fresh KeyIndex's generation
            g = ki.generations[0]
            g.created, g.version, g.revs = self.created[i], self.versions[i], [self.mods[i]]
        return ki

    def get(self, i: int, at_main: int) -> tuple[int, int, int] | None:
        """KeyIndex.get for key `i`: (mod, created, version) at main
        revision `at_main`, or None."""
        mod = self.mods[i]
        if mod and mod <= (at_main << SUB_BITS | SUB_MASK):  # last_of_main, inline: every listed key passes here
            return mod, self.created[i], self.versions[i]
        if mod and self._hist_slot(i) < 0:
            return None  # its one revision is newer than at_main
        return self.key_index(i).get(at_main)


class BlockBuilder:
    """A block's arrays filled one key at a time, keys in strictly
    increasing order: the one place that writes the layout of the module
    docstring.  `add_put` takes the common key (one put, nothing else)
    without any object per key; `add_generations` takes the rest.  Each
    takes the lease of the key's newest put (0: none), kept only when the
    key exists now."""

    __slots__ = ("keys", "ends", "mods", "created", "versions", "live_rank", "hist_pos", "hist_off", "hist",
                 "lease_pos", "leases", "end", "maxrev", "minhist", "marks")

    def __init__(self, marks: bool = False) -> None:
        """``marks``: also collect each key's fingerprint byte (the low
        byte of its hash: brain.mvcc.index looks keys up by them), so a
        merged block needs none computed on its first look-up."""
        self.marks: bytearray | None = bytearray() if marks else None
        self.keys: list[bytes] = []
        self.ends = array("I")
        self.mods = array("q")
        self.created = array("q")
        self.versions = array("q")
        self.live_rank = array("I", [0])
        self.hist_pos = array("I")
        self.hist_off = array("I", [0])
        self.hist = array("q")
        self.lease_pos = array("I")
        self.leases = array("q")
        self.end = self.maxrev = 0
        self.minhist = NO_HISTORY

    def __len__(self) -> int:
        return len(self.ends)

    def add_put(self, key: bytes, rev: int, created: int, version: int, lease: int = 0) -> None:
        """A key whose whole history is one put at `rev` (with `lease`)."""
        if lease:
            self.lease_pos.append(len(self.ends))
            self.leases.append(lease)
        if self.marks is not None:
            self.marks.append(hash(key) & 0xFF)
        self.keys.append(key)
        self.end += len(key)
        self.ends.append(self.end)
        self.mods.append(rev)
        self.created.append(created)
        self.versions.append(version)
        self.live_rank.append(self.live_rank[-1] + 1)
        if rev > self.maxrev:
            self.maxrev = rev

    def add_generations(self, key: bytes, gens: list[Generation], lease: int = 0) -> None:
        """A key with any history (KeyIndex's invariants: only the last
        generation may be empty), `lease` its newest put's; one put alone
        goes the short way."""
        last = gens[-1]
        if len(gens) == 1 and len(last.revs) == 1:
            self.add_put(key, last.revs[0], last.created, last.version, lease)
            return
        pos = len(self.ends)
        if self.marks is not None:
            self.marks.append(hash(key) & 0xFF)
        self.keys.append(key)
        self.end += len(key)
        self.ends.append(self.end)
        if last.revs:
            self.mods.append(last.revs[-1])
            self.created.append(last.created)
            self.versions.append(last.version)
            self.live_rank.append(self.live_rank[-1] + 1)
            if lease:
                self.lease_pos.append(pos)
                self.leases.append(lease)
        else:
            self.mods.append(0)
            self.created.append(0)
            self.versions.append(0)
            self.live_rank.append(self.live_rank[-1])
        hist = self.hist
        self.hist_pos.append(pos)
        for g in gens:
            hist.append(g.created)
            hist.append(g.version)
            hist.append(len(g.revs))
            hist.extend(g.revs)
        self.hist_off.append(len(hist))
        oldest = gens[0].revs[0]
        if oldest < self.minhist:
            self.minhist = oldest
        newest = last.revs[-1] if last.revs else gens[-2].revs[-1]
        if newest > self.maxrev:
            self.maxrev = newest

    def add_run(self, block: Block, i: int, j: int, marks: bytes | None = None) -> None:
        """Entries i..j-1 of `block` as they are: slices of its arrays, no
        object per key (a merge copies most of a block unchanged);
        ``marks``, the block's fingerprint bytes, when collecting them."""
        if i >= j:
            return
        if self.marks is not None:
            self.marks += marks[i:j]
        base = len(self.ends)
        ends = block.ends
        lo = ends[i - 1] if i else 0
        hi = ends[j - 1]
        self.keys.append(block.keys[lo:hi])
        shift = self.end - lo
        self.ends.extend([e + shift for e in ends[i:j]])
        self.end += hi - lo
        self.mods.extend(block.mods[i:j])
        self.created.extend(block.created[i:j])
        self.versions.extend(block.versions[i:j])
        rank = block.live_rank
        shift = self.live_rank[-1] - rank[i]
        self.live_rank.extend([r + shift for r in rank[i + 1:j + 1]])
        newest = max(block.mods[i:j])
        pos, off, flat = block.hist_pos, block.hist_off, block.hist
        hist = self.hist
        for q in range(bisect_left(pos, i), bisect_left(pos, j)):  # the keys with history
            lo, hi = off[q], off[q + 1]
            self.hist_pos.append(pos[q] - i + base)
            hist.extend(flat[lo:hi])
            self.hist_off.append(len(hist))
            # read off the flat layout, no Generation built: the first
            # generation's first revision, and the last revision (the
            # tombstone's, when the last generation is empty: its count,
            # the slice's last item, is 0, and revisions never are)
            if flat[lo + 3] < self.minhist:
                self.minhist = flat[lo + 3]
            last = flat[hi - 1] or flat[hi - 4]
            if last > newest:
                newest = last
        if newest > self.maxrev:
            self.maxrev = newest
        lease_pos = block.lease_pos
        a, b = bisect_left(lease_pos, i), bisect_left(lease_pos, j)
        if a < b:
            self.lease_pos.extend([p - i + base for p in lease_pos[a:b]])
            self.leases.extend(block.leases[a:b])

    def fill(self, block: Block) -> None:
        """Give `block` the arrays built so far (the builder is spent)."""
        block.keys = b"".join(self.keys)
        block.ends = self.ends
        block.mods = self.mods
        block.created = self.created
        block.versions = self.versions
        block.live_rank = self.live_rank
        block.hist_pos = self.hist_pos
        block.hist_off = self.hist_off
        block.hist = self.hist
        block.lease_pos = self.lease_pos
        block.leases = self.leases
        block.maxrev = self.maxrev  # the newest revision in the block
        block.minhist = self.minhist  # the oldest revision of a key with history: compaction below it is a no-op

    def build(self) -> Block:
        block = Block.__new__(Block)
        self.fill(block)
        return block



def rebuild(block: Block | None, marks: bytes | None, edits: list[tuple[int, bool, KeyIndex]],
            size: int) -> tuple[list[Block], list[bytes]]:
    """``block`` (None: no block, an empty one) with ``edits`` applied, as
    blocks of ``size`` keys and the fingerprint bytes of each.  An edit
    (i, False, ki) puts ki before the entry at position i, (i, True, ki) in
    place of it; edits come in position order, and a KeyIndex with no
    history left is left out.  Runs of unchanged entries are copied as
    array slices (BlockBuilder.add_run), with the block's ``marks`` when
    known."""
    n = len(block) if block is not None else 0
    built: list[Block] = []
    built_marks: list[bytes] = []
    builder = BlockBuilder(marks=True)

    def close() -> None:
        nonlocal builder
        built_marks.append(bytes(builder.marks))
        built.append(builder.build())
        builder = BlockBuilder(marks=True)

    def copy(i: int, j: int) -> None:
        while i < j:
            upto = min(j, i + size - len(builder))
            builder.add_run(block, i, upto, marks)
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
    for pos, replaces, ki in edits:
        if pos > cursor:
            copy(cursor, pos)
            cursor = pos
        add(ki)
        if replaces:
            cursor = pos + 1
    copy(cursor, n)
    if len(builder):
        close()
    return built, built_marks

StoredHead = tuple[int, bool, int, int, int]  # a stored record's (revision, is_delete, create, version, lease)


def pack_stored(heads: dict[bytes, Union[StoredHead, list[StoredHead]]], block_size: int) -> Iterator[Block]:
    """Blocks of `block_size` keys from a restart's record heads: for each
    key its one head, or the list of its heads in revision order.  Entries
    are popped as they are packed, so the heads' memory goes while the
    blocks grow.  A key whose only record is a put (most keys) costs one
    `add_put`; any other history is rebuilt through KeyIndex.restore and
    tombstone, the same rules as a key read back one record at a time.  A
    key's lease is its newest record's, when that record is a put."""
    builder = BlockBuilder()
    pop = heads.pop
    for key in sorted(heads):
        head = pop(key)
        if type(head) is tuple:
            if not head[1]:
                builder.add_put(key, head[0], head[2], head[3], head[4])
                if len(builder) == block_size:
                    yield builder.build()
                    builder = BlockBuilder()
                continue
            head = [head]
        ki = KeyIndex(key)
        for rev, deleted, created, version, _lease in head:
            if deleted:
                ki.tombstone(rev)  # may stand alone: a tombstone kept at the compaction revision
            else:
                ki.restore(rev, created, version)
        newest = head[-1]
        builder.add_generations(key, ki.generations, 0 if newest[1] else newest[4])
        if len(builder) == block_size:
            yield builder.build()
            builder = BlockBuilder()
    if len(builder):
        yield builder.build()


class PackedKey:
    """One key of a block, read in place: what readers of a KeyIndex use
    (`key`, `get`, `is_live`, `generations`), without building one.  A
    block never changes, so the view stays the state it was taken at."""

    __slots__ = ("block", "pos", "key")

    def __init__(self, block: Block, pos: int, key: bytes) -> None:
        self.block = block
        self.pos = pos
        self.key = key

    def get(self, at_main: int) -> tuple[int, int, int] | None:
        return self.block.get(self.pos, at_main)

    def is_live(self) -> bool:
        return self.block.mods[self.pos] != 0

    @property
    def lease(self) -> int:
        return self.block.lease(self.pos)

    @property
    def generations(self) -> list[Generation]:
        return self.block.generations(self.pos)

    def __repr__(self) -> str:
        return f"PackedKey({self.key!r}, {self.generations})"


KeyHistory = Union[KeyIndex, PackedKey]  # one key's history as reads get it: an overlay key or a block's
