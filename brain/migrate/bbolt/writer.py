"""Writing a bbolt file in one pass, as bbolt's own compaction would lay it out.

The writer takes each bucket's keys already sorted and streams them into
leaf pages, filling every page (a bucket being built from scratch never
needs the slack bbolt leaves for later inserts: bbolt splits full pages
itself when the file is written to later).  Each finished level of pages
yields (first key, page id) pairs for the branch level above it, until one
root page remains.  A bucket small enough for bbolt's inline rule (no
sub-buckets, at most a quarter page) is stored inside its parent's value.

Pages are allocated in the order they are written, from page 3 on, so the
output is a sequential write; the two meta pages and the (empty) freelist
page at 0-2 are written last, once the root bucket's page is known.  The
result is a database that bbolt (and `bbolt check`) finds consistent: every
page below the high water mark is reachable exactly once.

    with open(path, "w+b") as f:
        w = BoltWriter(f)
        key_bucket = w.bucket([(b"k1", b"v1"), (b"k2", b"v2")])
        w.finish([(b"key", key_bucket)])
"""

from __future__ import annotations

from typing import BinaryIO, Iterable

from .layout import (
    BRANCH_ELEMENT,
    BRANCH_PAGE,
    BUCKET_HEADER,
    BUCKET_LEAF_FLAG,
    DEFAULT_PAGE_SIZE,
    FREELIST_PAGE,
    LEAF_ELEMENT,
    LEAF_PAGE,
    MAX_ELEMENTS,
    MAX_KEY_SIZE,
    META_PAGE,
    PAGE_HEADER,
    Meta,
)

FIRST_DATA_PAGE = 3  # 0, 1: metas; 2: freelist


class BucketValue(bytes):
    """A bucket as its parent stores it (header, plus the page if inline)."""


class BoltWriter:
    def __init__(self, f: BinaryIO, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        self.f = f
        self.page_size = page_size
        self.inline_limit = page_size // 4
        self.next_pgid = FIRST_DATA_PAGE
        self.bytes_written = 0
        f.seek(FIRST_DATA_PAGE * page_size)
        self._finished = False

    # -- pages --------------------------------------------------------------

    def _emit(self, data: bytes) -> int:
        """Write one node (already laid out, header id 0) at the next page(s)."""
        pgid = self.next_pgid
        pages = -(-len(data) // self.page_size)
        _, flags, count, _ = PAGE_HEADER.unpack_from(data)
        header = PAGE_HEADER.pack(pgid, flags, count, pages - 1)
        pad = pages * self.page_size - len(data)
        self.f.write(header + data[PAGE_HEADER.size:] + (b"\0" * pad if pad else b""))
        self.next_pgid += pages
        self.bytes_written += pages * self.page_size
        return pgid

    @staticmethod
    def _leaf_node(items: list[tuple[bytes, bytes, int]]) -> bytes:
        n = len(items)
        elems = bytearray(n * LEAF_ELEMENT.size)
        data = []
        # pos counts from each element to its data: elements first, data after.
        pos = n * LEAF_ELEMENT.size
        for i, (k, v, flags) in enumerate(items):
            LEAF_ELEMENT.pack_into(elems, i * LEAF_ELEMENT.size, flags, pos - i * LEAF_ELEMENT.size, len(k), len(v))
            data.append(k)
            data.append(v)
            pos += len(k) + len(v)
        return PAGE_HEADER.pack(0, LEAF_PAGE, n, 0) + bytes(elems) + b"".join(data)

    @staticmethod
    def _branch_node(children: list[tuple[bytes, int]]) -> bytes:
        n = len(children)
        elems = bytearray(n * BRANCH_ELEMENT.size)
        pos = n * BRANCH_ELEMENT.size
        for i, (k, pgid) in enumerate(children):
            BRANCH_ELEMENT.pack_into(elems, i * BRANCH_ELEMENT.size, pos - i * BRANCH_ELEMENT.size, len(k), pgid)
            pos += len(k)
        return PAGE_HEADER.pack(0, BRANCH_PAGE, n, 0) + bytes(elems) + b"".join(k for k, _ in children)

    def _write_levels(self, level: list[tuple[bytes, int]]) -> int:
        """Branch pages over `level` ((first key, pgid) of each page) until
        one root remains; returns the root's page id."""
        while len(level) > 1:
            upper: list[tuple[bytes, int]] = []
            node: list[tuple[bytes, int]] = []
            size = PAGE_HEADER.size
            for k, pgid in level:
                add = BRANCH_ELEMENT.size + len(k)
                if node and (size + add > self.page_size or len(node) >= MAX_ELEMENTS):
                    upper.append((node[0][0], self._emit(self._branch_node(node))))
                    node, size = [], PAGE_HEADER.size
                node.append((k, pgid))
                size += add
            upper.append((node[0][0], self._emit(self._branch_node(node))))
            level = upper
        return level[0][1]

    # -- buckets ------------------------------------------------------------

    def bucket(self, items: Iterable[tuple[bytes, bytes]], *, inline_ok: bool = True) -> BucketValue:
        """Write a bucket holding `items` (strictly increasing keys; a value
        that is a BucketValue is a nested bucket) and return its value for
        the parent bucket."""
        pending: list[tuple[bytes, bytes, int]] = []
        size = PAGE_HEADER.size
        inline = inline_ok
        leaves: list[tuple[bytes, int]] = []
        prev = None
        for k, v in items:
            flags = BUCKET_LEAF_FLAG if isinstance(v, BucketValue) else 0
            if not k or len(k) > MAX_KEY_SIZE:
                raise ValueError(f"bbolt keys are 1 to {MAX_KEY_SIZE} bytes, got {len(k)}")
            if prev is not None and k <= prev:
                raise ValueError(f"keys must be strictly increasing: {k!r} after {prev!r}")
            prev = k
            add = LEAF_ELEMENT.size + len(k) + len(v)
            if flags & BUCKET_LEAF_FLAG:
                inline = False
            if pending and (size + add > self.page_size or len(pending) >= MAX_ELEMENTS):
                leaves.append((pending[0][0], self._emit(self._leaf_node(pending))))
                pending, size = [], PAGE_HEADER.size
                inline = False
            pending.append((k, v, flags))
            size += add
            if size > self.inline_limit:
                inline = False
        if inline and not leaves:
            return BucketValue(BUCKET_HEADER.pack(0, 0) + self._leaf_node(pending))
        if pending or not leaves:
            first = pending[0][0] if pending else b""
            leaves.append((first, self._emit(self._leaf_node(pending))))
        return BucketValue(BUCKET_HEADER.pack(self._write_levels(leaves), 0))

    # -- finishing ------------------------------------------------------------

    def finish(self, buckets: Iterable[tuple[bytes, BucketValue]], txid: int = 2) -> int:
        """Write the root bucket (`buckets`, sorted by name), the freelist
        and both meta pages (txids `txid` and `txid + 1`, `txid` even: a meta
        lives on page txid % 2).  Returns the database size in bytes."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        root = self._root_page(list(buckets))
        hwm = self.next_pgid
        ps = self.page_size
        self.f.seek(0)
        for i in (0, 1):
            meta = Meta(page_size=ps, root=root, freelist=2, pgid=hwm, txid=txid + i)
            page = bytearray(ps)
            PAGE_HEADER.pack_into(page, 0, i, META_PAGE, 0, 0)
            page[PAGE_HEADER.size: PAGE_HEADER.size + 64] = meta.pack()
            self.f.write(page)
        freelist = bytearray(ps)
        PAGE_HEADER.pack_into(freelist, 0, 2, FREELIST_PAGE, 0, 0)
        self.f.write(freelist)
        self.f.seek(hwm * ps)
        self.f.truncate()
        return hwm * ps

    def _root_page(self, buckets: list[tuple[bytes, BucketValue]]) -> int:
        """The root bucket always has a page of its own (the meta points at
        a page, never at an inline bucket)."""
        for name, value in buckets:
            if not isinstance(value, BucketValue):
                raise TypeError(f"root bucket entry {name!r} is not a bucket")
        root, _seq = BUCKET_HEADER.unpack_from(self.bucket(buckets, inline_ok=False))
        return root
