"""Which keys a user may read or write: its roles' permissions merged into
sorted, disjoint key ranges, so a check is one bisection.

etcd keeps each user's permissions in two interval trees (read and write;
its auth/range_perm_cache.go) and asks whether the union of the intervals
overlapping a request covers it without a gap.  Merging the intervals once
(touching ones too: etcd's walk counts an interval that starts where the
last one ended as contiguous) gives the same answers with a bisection:

* a permission on one key K is the interval [K, K+"\\0");
* a range [K, E) is itself, and range_end "\\0" means every key from K on
  (an open end, written None here, above every key);
* a request on one key K is covered when K lies in a merged range;
* a request on [K, E) (E "\\0": open) is covered when the merged range
  holding K reaches E.  etcd's overlap walk answers a request whose end is
  not above its key (an empty or reversed range) the same way: covered
  when K itself lies in a merged range.
"""

from __future__ import annotations

from bisect import bisect_right

PERM_READ, PERM_WRITE, PERM_READWRITE = 0, 1, 2  # authpb.Permission.Type

OPEN = b"\x00"  # range_end "every key from key on"


def _interval(key: bytes, range_end: bytes) -> tuple[bytes, bytes | None]:
    """A permission's interval, as etcd reads it (getMergedPerms)."""
    if not range_end:
        return key, key + b"\x00"
    if range_end == OPEN:
        return key, None
    return key, range_end


def _after(end: bytes | None, other: bytes | None) -> bool:
    """end >= other, None being above every key."""
    if end is None:
        return True
    if other is None:
        return False
    return end >= other


class KeyRanges:
    """Sorted, disjoint, non-touching [start, end) ranges (end None: open)."""

    __slots__ = ("starts", "ends")

    def __init__(self, intervals) -> None:
        starts: list[bytes] = []
        ends: list[bytes | None] = []
        for start, end in sorted(intervals, key=lambda iv: iv[0]):
            if starts and (ends[-1] is None or start <= ends[-1]):
                if not _after(ends[-1], end):
                    ends[-1] = end
                continue
            starts.append(start)
            ends.append(end)
        self.starts = starts
        self.ends = ends

    def covers(self, key: bytes, range_end: bytes = b"") -> bool:
        """Whether [key, range_end) is inside one range (range_end b"": the
        key alone; b"\\0": every key from key on)."""
        i = bisect_right(self.starts, key) - 1
        if i < 0:
            return False
        end = self.ends[i]
        if end is not None and key >= end:
            return False
        if not range_end:
            return True
        if range_end == OPEN:
            return end is None
        return end is None or range_end <= end or range_end <= key

    def __bool__(self) -> bool:
        return bool(self.starts)

    def __repr__(self) -> str:
        return f"KeyRanges({list(zip(self.starts, self.ends))!r})"


class UserPermissions:
    """The merged read and write ranges of one user's roles."""

    __slots__ = ("read", "write")

    def __init__(self, perms) -> None:
        """``perms``: every Permission of every role the user has."""
        reads, writes = [], []
        for p in perms:
            iv = _interval(p.key, p.range_end)
            if p.perm_type in (PERM_READ, PERM_READWRITE):
                reads.append(iv)
            if p.perm_type in (PERM_WRITE, PERM_READWRITE):
                writes.append(iv)
        self.read = KeyRanges(reads)
        self.write = KeyRanges(writes)


def valid_permission_range(key: bytes, range_end: bytes) -> bool:
    """etcd's isValidPermissionRange: a key is needed; a range must end
    above its key or be open."""
    if not key:
        return False
    if not range_end:
        return True
    return key < range_end or range_end == OPEN
