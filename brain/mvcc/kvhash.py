"""Which revisions a HashKV or a snapshot at a revision covers, and their hash.

etcd's HashKV(rev) hashes every stored revision up to `rev` that compaction
at the current compact revision C keeps: all revisions above C, plus, for
each key, its newest revision at or below C when that one is a put (a read at
C must find it; a tombstone there means the key is gone).  That choice
depends only on (rev, C) and the history, not on how far physical compaction
has progressed or what a restart dropped, so the hash of the same data at the
same revision is the same on every server and across restarts.

brain's compaction also keeps a tombstone made exactly at C (so a watch from
C still sees that delete; see key_index.py).  `covered_revisions` includes
it, so snapshots carry it; the hash skips it, as etcd's does (etcd versions
differ on keeping it, so its hash ignores it).

brain hashes in key order (shards are contiguous and ordered, so walking the
shards in order is key order), and per key in revision order, each revision
as its 16-byte big-endian revision followed by its stored record bytes
(codec.encode_record), chained through CRC-32.  The layout of the keyspace
into shards does not enter the hash.  A snapshot file stores exactly these
(revision, record) pairs in this order, so `brain snapshot status` can
recompute the HashKV of the revision the snapshot was taken at.
"""

from __future__ import annotations

import zlib

from .key_index import KeyIndex
from .revision import last_of_main

# Seeds the CRC so an empty store does not hash to 0; bump the suffix if the
# hashed byte layout ever changes.
HASH_SEED = zlib.crc32(b"brain/kv/1")


def covered_revisions(ki: KeyIndex, compact_rev: int, rev: int) -> list[int]:
    """Packed revisions of `ki` with main revision <= `rev` that survive
    compaction at `compact_rev` (-1: none), in increasing order."""
    hi = last_of_main(rev) if rev >= 0 else -1
    lo = last_of_main(compact_rev) if compact_rev >= 0 else -1
    out: list[int] = []
    kept = -1  # newest revision <= lo, when it is a put
    gens = ki.generations
    last_gi = len(gens) - 1
    for gi, g in enumerate(gens):
        revs = g.revs
        n = len(revs)
        for i, r in enumerate(revs):
            if r > hi:
                if kept >= 0:
                    out.append(kept)
                return out
            if r <= lo:
                tombstone = gi != last_gi and i == n - 1
                kept = r if not tombstone or r >> 32 == compact_rev else -1
                continue
            if kept >= 0:
                out.append(kept)
                kept = -1
            out.append(r)
    if kept >= 0:
        out.append(kept)
    return out


def entry_bytes(rev: int, record_bytes: bytes) -> bytes:
    """What the hash covers for one revision."""
    return rev.to_bytes(16, "big") + record_bytes


def hashed(rev: int, record_bytes: bytes, compact_rev: int) -> bool:
    """False for the one kind of covered revision the hash skips: a
    tombstone made exactly at the compaction revision."""
    return not (record_bytes[0] & 1 and rev >> 32 == compact_rev)


class KvHasher:
    """CRC-32 over (revision, record) entries fed in key, then revision order."""

    __slots__ = ("crc", "entries")

    def __init__(self) -> None:
        self.crc = HASH_SEED
        self.entries = 0

    def update(self, data: bytes, entries: int = 1) -> None:
        """Feed the concatenation of `entries` entry_bytes(...) values."""
        self.crc = zlib.crc32(data, self.crc)
        self.entries += entries

    @property
    def value(self) -> int:
        return self.crc & 0xFFFFFFFF
