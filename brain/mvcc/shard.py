"""One shard: a key range's records and its key index, in one object.

A Shard is made of three parts, each in its own module, and adds what
joins two of them (`compact`: the index's walk, then the records it
removed) and what walks the whole index (`covered`, the views for tests):

    memtable.py    Memtables: the records (active and frozen memtables, the
                   value store behind them), through a checkpoint
    index.py       TieredIndex: the key index in two tiers (packed blocks
                   under an overlay of KeyIndex objects), its writes,
                   counts, compaction and merges
    visibility.py  Visibility: the bulk read of a list, which keys a read
                   at a revision sees (Found)

Why parts of one object rather than objects a Shard holds: a put or a
delete indexes the key and appends its record in one method
(TieredIndex.put and delete, which append to Memtables' `active`), and
get, record and visible are one call on the shard; parts held as objects
would make a write two calls (the index's, then the memtable's) and add
a call or an attribute hop to every read of a key.  Each part initialises
and writes its own fields (its FIELDS, which Shard declares as its slots),
with that one exception: the record a put or a delete appends to the
active memtable.

The store reaches a shard through these operations only: of the index,
`put` and `delete` (a write at a revision newer than any indexed, its record
recorded), `get` (one key's history), `key_indexes` (the keys of a range in
key order), `live_count` (the live keys of a range without a scan),
`visible` (a range's keys at a revision, in columns), `compact` (a bounded
walk from a cursor, the records it removes dropped), `merge` (a bounded
fold of recent writes into blocks), `load` (the whole index at once, from a
checkpoint's records), `keys` (how many) and `covered` (a bounded step of
the engine's history walk, brain.engine.history); of the records, `record`,
`values_and_leases`, `memtable_history` and `history` (reads), `freeze`,
`release_frozen` and `thaw` (a checkpoint), `memtable_records` (how many).
Only tests look at `index` and `dead`, read-only views of both tiers
merged.  Which shard holds a key is brain.mvcc.shard_map's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator

from .index import TieredIndex
from .kvhash import covered_revisions
from .memtable import Memtables
from .packed import BLOCK_KEYS, KeyHistory
from .visibility import Visibility


class Shard(TieredIndex, Visibility, Memtables):
    """One key range: its records, its key index and their bulk read, one
    object made of the three parts (the module docstring says why)."""

    __slots__ = TieredIndex.FIELDS + Memtables.FIELDS

    def __init__(self, shard_id: int, backend, block_size: int = BLOCK_KEYS) -> None:
        Memtables.__init__(self, shard_id, backend)
        TieredIndex.__init__(self, block_size)

    def compact(self, rev: int, cursor: bytes | None, budget: int) -> tuple[bytes | None, int]:
        """Compact at `rev` up to `budget` keys after `cursor` (None: from
        the first), then drop the records of the revisions that left the
        index (TieredIndex.compact_keys); returns the key to continue after
        (None: the shard is done) and how many keys were done."""
        removed: list[int] = []
        cursor, done = self.compact_keys(rev, cursor, budget, removed)
        for r in removed:
            self.drop(r)
        return cursor, done

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
