"""Reading a bbolt file: buckets and their keys in order, nothing written.

The file is memory-mapped read-only.  The newest valid meta page names the
root bucket; a bucket is walked depth-first from its root page, so keys come
out in byte order.  Every page is checked as it is read (its id is its
number, its kind is what the parent expects, it lies below the high water
mark, its elements point inside it), and a problem raises BoltError naming
the page: a damaged file fails loudly instead of yielding wrong data.

Bytes after the last page (an etcd snapshot's sha256 trailer) are ignored.
"""

from __future__ import annotations

import mmap
import os
from typing import Iterator

from .layout import (
    BRANCH_ELEMENT,
    BRANCH_PAGE,
    BUCKET_HEADER,
    BUCKET_LEAF_FLAG,
    FREELIST_COUNT_OVERFLOW,
    FREELIST_PAGE,
    LEAF_ELEMENT,
    LEAF_PAGE,
    META,
    NO_FREELIST,
    PAGE_HEADER,
    PAGE_KINDS,
    PGID,
    Meta,
)

_MAX_DEPTH = 64  # a B+tree this deep is a cycle in a damaged file


class BoltError(Exception):
    """A file that is not a readable bbolt database (the message says where)."""


class BoltFile:
    """A read-only bbolt database.  Use as a context manager or close()."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise BoltError(f"{path}: {e.strerror}") from None
        try:
            size = os.fstat(self._fd).st_size
            if size < 2 * 1024:
                raise BoltError(f"{path}: not a bbolt file (only {size} bytes)")
            self._mm = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self.size = size
            self.pages_read = 0  # pages visited by bucket walks: progress for long reads
            self.meta = self._choose_meta()
            self.page_size = self.meta.page_size
            if self.meta.pgid * self.page_size > size:
                raise BoltError(f"{path}: file is {size} bytes but its meta says {self.meta.pgid} pages "
                                f"of {self.page_size} (truncated?)")
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------

    def _choose_meta(self) -> Meta:
        """The valid meta with the highest txid (bbolt's rule).  The page size
        is read from meta 0; if that one is damaged, common sizes are tried for
        meta 1."""
        mm = self._mm
        found: list[Meta] = []
        problems: list[str] = []
        first = self._meta_at(0)
        sizes = [first[0].page_size] if first[0] is not None and first[1] is None else []
        sizes += [s for s in (4096, 8192, 16384, 65536, 1024, 2048) if s not in sizes]
        if first[0] is not None and first[1] is None:
            found.append(first[0])
        else:
            problems.append(f"meta page 0: {first[1]}")
        for ps in sizes:
            if 2 * ps > len(mm):
                continue
            meta, problem = self._meta_at(ps)
            if problem is None and meta.page_size == ps:
                found.append(meta)
                break
        else:
            problems.append("meta page 1: no valid meta")
        if not found:
            raise BoltError(f"{self.path}: not a usable bbolt file ({'; '.join(problems)})")
        return max(found, key=lambda m: m.txid)

    def _meta_at(self, offset: int) -> tuple[Meta | None, str | None]:
        raw = self._mm[offset + PAGE_HEADER.size: offset + PAGE_HEADER.size + META.size]
        if len(raw) < META.size:
            return None, "truncated"
        _pgid, flags, _count, _overflow = PAGE_HEADER.unpack_from(self._mm, offset)
        meta = Meta.unpack(raw)
        problem = meta.problem(raw)
        if problem is None and flags != 0x04:
            problem = f"page flags {flags:#x} are not a meta page's"
        return meta, problem

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            mm.close()
            self._mm = None
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
            self._fd = None

    def __enter__(self) -> "BoltFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- pages --------------------------------------------------------------

    def page(self, pgid: int, want: int | None = None) -> tuple[int, int, int, int]:
        """(offset, flags, count, end) of page `pgid`, checked."""
        if pgid < 2 or pgid >= self.meta.pgid:
            raise BoltError(f"{self.path}: page {pgid} is outside the file's pages [2, {self.meta.pgid})")
        off = pgid * self.page_size
        own, flags, count, overflow = PAGE_HEADER.unpack_from(self._mm, off)
        if own != pgid:
            raise BoltError(f"{self.path}: page {pgid} says it is page {own}")
        if want is not None and flags != want and not (want == -1 and flags in (BRANCH_PAGE, LEAF_PAGE)):
            raise BoltError(f"{self.path}: page {pgid} is a {PAGE_KINDS.get(flags, hex(flags))} page "
                            f"where a {'branch or leaf' if want == -1 else PAGE_KINDS[want]} page belongs")
        end = off + (overflow + 1) * self.page_size
        self.pages_read += overflow + 1
        if pgid + overflow >= self.meta.pgid:
            raise BoltError(f"{self.path}: page {pgid} overflows past the high water mark")
        return off, flags, count, end

    def freelist(self) -> list[int]:
        """The free page ids stored in the file ([] when none is stored)."""
        if self.meta.freelist == NO_FREELIST:
            return []
        off, _flags, count, end = self.page(self.meta.freelist, FREELIST_PAGE)
        start = off + PAGE_HEADER.size
        if count == FREELIST_COUNT_OVERFLOW:
            (count,) = PGID.unpack_from(self._mm, start)
            start += PGID.size
        if start + count * PGID.size > end:
            raise BoltError(f"{self.path}: freelist page {self.meta.freelist} is cut short")
        return [x for (x,) in PGID.iter_unpack(self._mm[start: start + count * PGID.size])]

    # -- buckets ------------------------------------------------------------

    def root(self) -> "Bucket":
        return Bucket(self, self.meta.root, None, "<root>")

    def bucket(self, name: bytes) -> "Bucket | None":
        return self.root().bucket(name)


class Bucket:
    """One bucket: a B+tree rooted at a page, or an inline leaf page."""

    __slots__ = ("db", "root_pgid", "inline", "name")

    def __init__(self, db: BoltFile, root_pgid: int, inline: bytes | None, name: str) -> None:
        self.db = db
        self.root_pgid = root_pgid
        self.inline = inline
        self.name = name

    def items(self) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, flags) in key order; flags & BUCKET_LEAF_FLAG marks a
        nested bucket (open it with `bucket(key)`)."""
        if self.inline is not None:
            yield from self._leaf_items(self.inline, BUCKET_HEADER.size, len(self.inline), "its inline page")
            return
        yield from self._walk(self.root_pgid, 0)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs that are not nested buckets, in key order."""
        for k, v, flags in self.items():
            if not flags & BUCKET_LEAF_FLAG:
                yield k, v

    def _walk(self, pgid: int, depth: int) -> Iterator[tuple[bytes, bytes, int]]:
        if depth > _MAX_DEPTH:
            raise BoltError(f"{self.db.path}: bucket {self.name} is deeper than {_MAX_DEPTH} pages (a cycle?)")
        off, flags, count, end = self.db.page(pgid, -1)
        mm = self.db._mm
        if flags == LEAF_PAGE:
            yield from self._leaf_items(mm, off, end, f"page {pgid}")
            return
        elems = off + PAGE_HEADER.size
        if elems + count * BRANCH_ELEMENT.size > end or count == 0:
            raise BoltError(f"{self.db.path}: branch page {pgid} has a bad element count {count}")
        children = []
        for i, (pos, ksize, child) in enumerate(BRANCH_ELEMENT.iter_unpack(mm[elems: elems + count * 16])):
            start = elems + i * BRANCH_ELEMENT.size + pos
            if start + ksize > end:
                raise BoltError(f"{self.db.path}: branch page {pgid} element {i} points outside the page")
            children.append(child)
        for child in children:
            yield from self._walk(child, depth + 1)

    def _leaf_items(self, buf, page_off: int, end: int, where: str) -> list[tuple[bytes, bytes, int]]:
        """Elements of the leaf page whose header is at buf[page_off] and
        whose bytes end at buf[end]."""
        _id, flags, count, _overflow = PAGE_HEADER.unpack_from(buf, page_off)
        if flags != LEAF_PAGE:
            raise BoltError(f"{self.db.path}: {where} of bucket {self.name} is not a leaf page")
        elems = page_off + PAGE_HEADER.size
        if elems + count * LEAF_ELEMENT.size > end:
            raise BoltError(f"{self.db.path}: {where} of bucket {self.name} has a bad element count {count}")
        out = []
        at = elems
        for eflags, pos, ksize, vsize in LEAF_ELEMENT.iter_unpack(buf[elems: elems + count * LEAF_ELEMENT.size]):
            k0 = at + pos
            v1 = k0 + ksize + vsize
            if v1 > end:
                raise BoltError(f"{self.db.path}: {where} of bucket {self.name}: an element points outside the page")
            out.append((bytes(buf[k0: k0 + ksize]), bytes(buf[k0 + ksize: v1]), eflags))
            at += LEAF_ELEMENT.size
        return out

    def bucket(self, name: bytes) -> "Bucket | None":
        """The nested bucket `name`, or None if there is none."""
        for k, v, flags in self.items():
            if k == name:
                if not flags & BUCKET_LEAF_FLAG:
                    raise BoltError(f"{self.db.path}: {name!r} in bucket {self.name} is a key, not a bucket")
                return self._open_child(k, v)
            if k > name:
                return None
        return None

    def buckets(self) -> Iterator[tuple[bytes, "Bucket"]]:
        """(name, bucket) for every nested bucket, in name order."""
        for k, v, flags in self.items():
            if flags & BUCKET_LEAF_FLAG:
                yield k, self._open_child(k, v)

    def _open_child(self, name: bytes, value: bytes) -> "Bucket":
        if len(value) < BUCKET_HEADER.size:
            raise BoltError(f"{self.db.path}: bucket {name!r} has a {len(value)}-byte header")
        root, _seq = BUCKET_HEADER.unpack_from(value)
        label = name.decode("utf-8", "backslashreplace")
        if root == 0:
            if len(value) < BUCKET_HEADER.size + PAGE_HEADER.size:
                raise BoltError(f"{self.db.path}: inline bucket {label} is cut short")
            return Bucket(self.db, 0, value, label)
        return Bucket(self.db, root, None, label)

    def get(self, key: bytes) -> bytes | None:
        """The value of `key` (None if absent or a bucket).  Walks the tree
        by the branch keys, so it reads only the pages on the key's path."""
        if self.inline is not None:
            for k, v, flags in self.items():
                if k == key:
                    return None if flags & BUCKET_LEAF_FLAG else v
            return None
        pgid = self.root_pgid
        mm = self.db._mm
        for _ in range(_MAX_DEPTH):
            off, flags, count, end = self.db.page(pgid, -1)
            if flags == LEAF_PAGE:
                for k, v, eflags in self._leaf_items(mm, off, end, f"page {pgid}"):
                    if k == key:
                        return None if eflags & BUCKET_LEAF_FLAG else v
                return None
            elems = off + PAGE_HEADER.size
            chosen = None
            for i, (pos, ksize, child) in enumerate(BRANCH_ELEMENT.iter_unpack(mm[elems: elems + count * 16])):
                start = elems + i * BRANCH_ELEMENT.size + pos
                if i and bytes(mm[start: start + ksize]) > key:
                    break
                chosen = child
            if chosen is None:
                return None
            pgid = chosen
        raise BoltError(f"{self.db.path}: bucket {self.name} is deeper than {_MAX_DEPTH} pages (a cycle?)")

    def last(self) -> tuple[bytes, bytes, int] | None:
        """The (key, value, flags) with the greatest key, reading only the
        rightmost path; None for an empty bucket."""
        if self.inline is not None:
            items = list(self.items())
            return items[-1] if items else None
        pgid = self.root_pgid
        mm = self.db._mm
        for _ in range(_MAX_DEPTH):
            off, flags, count, end = self.db.page(pgid, -1)
            if flags == LEAF_PAGE:
                items = self._leaf_items(mm, off, end, f"page {pgid}")
                return items[-1] if items else None
            if count == 0:
                raise BoltError(f"{self.db.path}: branch page {pgid} is empty")
            elem = off + PAGE_HEADER.size + (count - 1) * BRANCH_ELEMENT.size
            pgid = BRANCH_ELEMENT.unpack_from(mm, elem)[2]
        raise BoltError(f"{self.db.path}: bucket {self.name} is deeper than {_MAX_DEPTH} pages (a cycle?)")

    def as_dict(self) -> dict[bytes, bytes]:
        return dict(iter(self))
