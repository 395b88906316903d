"""bbolt's file layout: the facts its reader and writer share.

A bbolt file is an array of fixed-size pages (the page size is the OS page
size of the machine that created it, 4096 on x86-64, and is written in the
meta page).  Integers are little-endian.  Every page starts with a 16-byte
header:

    id:u64  flags:u16  count:u16  overflow:u32

`id` is the page's own number, `flags` its kind (branch 0x01, leaf 0x02,
meta 0x04, freelist 0x10), `count` its number of elements, and `overflow`
how many further pages it spans (a node bigger than a page occupies
`overflow + 1` consecutive pages).

Pages 0 and 1 are the two meta pages.  After the header each holds

    magic:u32 (0xED0CDAED)  version:u32 (2)  page_size:u32  flags:u32
    root:u64  sequence:u64              the root bucket (a page, never inline)
    freelist:u64                        page of the freelist (all ones: none stored)
    pgid:u64                            high water mark: pages in use are < pgid
    txid:u64                            the transaction that wrote this meta
    checksum:u64                        FNV-1a 64 over the 56 bytes before it

A transaction writes its meta to page `txid % 2`, so the two alternate and a
torn write of one leaves the other intact: a reader uses the valid meta with
the higher txid.

Branch and leaf pages hold `count` fixed-size elements right after the
header, then the keys and values they point to.  `pos` is the distance from
the element itself to its data:

    branch element:  pos:u32  ksize:u32  pgid:u64     key = first key of the child page
    leaf element:    flags:u32  pos:u32  ksize:u32  vsize:u32   key, then value

A leaf element with flag 0x01 is a bucket: its value is the bucket header
(`root:u64 sequence:u64`).  A bucket whose root is 0 is *inline*: its root
leaf page follows the header inside the value (page id 0); bbolt inlines a
bucket holding only a few bytes (at most a quarter page) and no sub-buckets.

The freelist page lists free page ids as u64s; a count of 0xFFFF means the
real count is the first u64.

Worked example: a fresh database (bbolt's init) is four pages: metas 0 and 1
(txid 0 and 1, root 3, freelist 2, pgid 4), an empty freelist page 2 and an
empty leaf page 3 (the root bucket, no buckets yet).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0xED0CDAED
VERSION = 2
DEFAULT_PAGE_SIZE = 4096

PAGE_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
BRANCH_ELEMENT = struct.Struct("<IIQ")  # pos, ksize, pgid
LEAF_ELEMENT = struct.Struct("<IIII")  # flags, pos, ksize, vsize
BUCKET_HEADER = struct.Struct("<QQ")  # root pgid, sequence
META = struct.Struct("<IIIIQQQQQQ")  # see the module docstring
PGID = struct.Struct("<Q")

BRANCH_PAGE = 0x01
LEAF_PAGE = 0x02
META_PAGE = 0x04
FREELIST_PAGE = 0x10
PAGE_KINDS = {BRANCH_PAGE: "branch", LEAF_PAGE: "leaf", META_PAGE: "meta", FREELIST_PAGE: "freelist"}

BUCKET_LEAF_FLAG = 0x01  # a leaf element whose value is a bucket

NO_FREELIST = 0xFFFF_FFFF_FFFF_FFFF
FREELIST_COUNT_OVERFLOW = 0xFFFF

MAX_KEY_SIZE = 32768  # bbolt refuses longer keys
MAX_ELEMENTS = 0xFFFE  # a node's count must fit in u16 (0xFFFF is reserved)

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bits: the meta page checksum."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return h


@dataclass(frozen=True)
class Meta:
    page_size: int
    root: int
    freelist: int
    pgid: int
    txid: int
    sequence: int = 0
    flags: int = 0
    magic: int = MAGIC
    version: int = VERSION
    checksum: int = 0

    def pack(self) -> bytes:
        """The 64 meta bytes with their checksum filled in."""
        body = META.pack(self.magic, self.version, self.page_size, self.flags, self.root, self.sequence,
                         self.freelist, self.pgid, self.txid, 0)[:-8]
        return body + struct.pack("<Q", fnv1a64(body))

    @classmethod
    def unpack(cls, data: bytes) -> "Meta":
        magic, version, page_size, flags, root, seq, freelist, pgid, txid, checksum = META.unpack_from(data)
        return cls(page_size=page_size, root=root, freelist=freelist, pgid=pgid, txid=txid, sequence=seq,
                   flags=flags, magic=magic, version=version, checksum=checksum)

    def problem(self, raw: bytes) -> str | None:
        """Why this meta (read from `raw`, its 64 bytes) is unusable, or None."""
        if self.magic != MAGIC:
            return "not a bbolt file (bad magic)"
        if self.version != VERSION:
            return f"bbolt format version {self.version} (expected {VERSION})"
        if fnv1a64(bytes(raw[: META.size - 8])) != self.checksum:
            return "meta page checksum mismatch"
        if self.page_size < 1024 or self.page_size & (self.page_size - 1):
            return f"bad page size {self.page_size}"
        if self.root >= self.pgid or (self.freelist != NO_FREELIST and self.freelist >= self.pgid):
            return "root or freelist page beyond the high water mark"
        return None


def page_header(pgid: int, flags: int, count: int, overflow: int = 0) -> bytes:
    return PAGE_HEADER.pack(pgid, flags, count, overflow)
