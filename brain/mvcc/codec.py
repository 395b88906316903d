"""Byte formats the core owns: journal batch payloads and stored records.

Journal payload: the *effects* of one group-committed batch, not the requests.
Replaying effects needs no request logic, so a replay can never take a
different branch than the original apply did.  A payload is a sequence of
entries, each starting with a one-byte tag:

  b"V" version:u8                                        the format of the entries after it
                                                         (every payload starts with one)
  b"T" main:u64 count:u32 then `count` changes (the revision's subs, in order):
         b"P" klen:u32 key vlen:u32 value lease:i64      a put
         b"D" klen:u32 key                               a delete (tombstone)
  b"C" rev:i64                                           compaction requested at rev
  b"G" id:i64 ttl:i64                                    lease granted
  b"R" id:i64                                            lease revoked (its keys were
                                                         deleted by a preceding T)
  b"E" epoch:u64 leader:u64                              a replica took the lead of a
                                                         replicated journal (term, member ID)

Format versions: 1 is the one above (a payload without b"V" was written
before versions were recorded, and is version 1 too).  A reader refuses a
payload holding a version it does not know before decoding any of it
(FormatVersionError), so a replica of an older brain stops applying the
records of a newer one instead of misreading them.  A payload may hold
several b"V" entries: the engine joins the payloads of one batch.

Stored record (value store, keyed by the 16-byte revision):
  flags:u8 (1 = tombstone) create:u64 version:i64 lease:i64 klen:u32 key value
where `create` is the packed create revision.
"""

from __future__ import annotations

import struct

_T_HEAD = struct.Struct("<QI")
_LEN = struct.Struct("<I")
_I64 = struct.Struct("<q")
_2I64 = struct.Struct("<qq")
_2U64 = struct.Struct("<QQ")
_REC_HEAD = struct.Struct("<BQqqI")

PUT, DELETE = 0, 1

FORMAT_VERSION = 1  # the journal payload format this code writes and the newest it reads
_VERSION_ENTRY = bytes((0x56, FORMAT_VERSION))  # b"V" version


class FormatVersionError(ValueError):
    """A journal payload in a format newer than this code reads."""

    def __init__(self, version: int) -> None:
        super().__init__(f"journal record format version {version} is newer than this brain reads "
                         f"(up to {FORMAT_VERSION}): upgrade this replica")
        self.version = version

# A record held in memory: (key, value or None for a tombstone, packed create
# revision, version, lease).
Record = tuple


class BatchEncoder:
    """Builds one journal payload while a batch is applied."""

    __slots__ = ("_parts", "_count_at", "_count", "_main")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._count_at = -1
        self._count = 0
        self._main = 0

    def begin_revision(self, main: int) -> None:
        self._close_revision()
        self._parts.append(b"T")
        self._count_at = len(self._parts)
        self._parts.append(b"")  # placeholder for main/count
        self._count = 0
        self._main = main

    def put(self, key: bytes, value: bytes, lease: int) -> None:
        self._parts.append(b"P" + _LEN.pack(len(key)) + key + _LEN.pack(len(value)))
        self._parts.append(value)
        self._parts.append(_I64.pack(lease))
        self._count += 1

    def delete(self, key: bytes) -> None:
        self._parts.append(b"D" + _LEN.pack(len(key)) + key)
        self._count += 1

    def compact(self, rev: int) -> None:
        self._close_revision()
        self._parts.append(b"C" + _I64.pack(rev))

    def lease_grant(self, lease_id: int, ttl: int) -> None:
        self._close_revision()
        self._parts.append(b"G" + _2I64.pack(lease_id, ttl))

    def lease_revoke(self, lease_id: int) -> None:
        self._close_revision()
        self._parts.append(b"R" + _I64.pack(lease_id))

    def epoch(self, epoch: int, leader: int) -> None:
        self._close_revision()
        self._parts.append(b"E" + _2U64.pack(epoch, leader))

    def _close_revision(self) -> None:
        if self._count_at >= 0:
            self._parts[self._count_at] = _T_HEAD.pack(self._main, self._count)
            self._count_at = -1

    def finish(self) -> bytes:
        """The payload: b"" when the batch had no effects, else the format
        version and the entries."""
        self._close_revision()
        if not self._parts:
            return b""
        return _VERSION_ENTRY + b"".join(self._parts)


def decode_batch(payload: bytes) -> list[tuple]:
    """The entries: ("T", main, [(PUT, key, value, lease) | (DELETE, key)]),
    ("C", rev), ("G", id, ttl), ("R", id), ("E", epoch, leader).  Raises
    ValueError on bad bytes, FormatVersionError on a format newer than
    FORMAT_VERSION; the whole payload is decoded first, so a caller that
    applies entries applies none of a payload that raises."""
    entries: list[tuple] = []
    mv = memoryview(payload)
    pos, n = 0, len(payload)
    while pos < n:
        tag = payload[pos]
        pos += 1
        if tag == 0x56:  # V
            if pos >= n:
                raise ValueError("truncated format version entry")
            version = payload[pos]
            pos += 1
            if version > FORMAT_VERSION:
                raise FormatVersionError(version)
            if version < 1:
                raise ValueError(f"journal record format version {version} does not exist")
        elif tag == 0x54:  # T
            main, count = _T_HEAD.unpack_from(payload, pos)
            pos += _T_HEAD.size
            changes = []
            for _ in range(count):
                kind = payload[pos]
                (klen,) = _LEN.unpack_from(payload, pos + 1)
                pos += 5
                key = bytes(mv[pos : pos + klen])
                pos += klen
                if kind == 0x50:  # P
                    (vlen,) = _LEN.unpack_from(payload, pos)
                    pos += 4
                    value = bytes(mv[pos : pos + vlen])
                    pos += vlen
                    (lease,) = _I64.unpack_from(payload, pos)
                    pos += 8
                    changes.append((PUT, key, value, lease))
                elif kind == 0x44:  # D
                    changes.append((DELETE, key))
                else:
                    raise ValueError(f"unknown change kind {kind} at {pos}")
            if pos > n:
                raise ValueError("truncated revision entry")
            entries.append(("T", main, changes))
        elif tag == 0x43:  # C
            (rev,) = _I64.unpack_from(payload, pos)
            pos += 8
            entries.append(("C", rev))
        elif tag == 0x47:  # G
            lease_id, ttl = _2I64.unpack_from(payload, pos)
            pos += 16
            entries.append(("G", lease_id, ttl))
        elif tag == 0x52:  # R
            (lease_id,) = _I64.unpack_from(payload, pos)
            pos += 8
            entries.append(("R", lease_id))
        elif tag == 0x45:  # E
            epoch, leader = _2U64.unpack_from(payload, pos)
            pos += 16
            entries.append(("E", epoch, leader))
        else:
            raise ValueError(f"unknown journal entry tag {tag} at offset {pos - 1}")
    return entries


def encode_record(rec: Record) -> bytes:
    key, value, create, version, lease = rec
    if value is None:
        return _REC_HEAD.pack(1, 0, 0, 0, len(key)) + key
    return _REC_HEAD.pack(0, create, version, lease, len(key)) + key + value


def decode_record_head(data) -> tuple[bytes, bool, int, int, int]:
    """(key, is_delete, create, version, lease) without copying the value:
    what rebuilding the key index needs."""
    flags, create, version, lease, klen = _REC_HEAD.unpack_from(data, 0)
    start = _REC_HEAD.size
    return bytes(data[start : start + klen]), bool(flags & 1), create, version, lease


def decode_value_lease(data: bytes) -> tuple[bytes, int]:
    """(value, lease) of a put's record, without copying its key: what a
    list reads of each key."""
    _flags, _create, _version, lease, klen = _REC_HEAD.unpack_from(data, 0)
    return data[_REC_HEAD.size + klen:], lease


def decode_record(data: bytes) -> Record:
    flags, create, version, lease, klen = _REC_HEAD.unpack_from(data, 0)
    start = _REC_HEAD.size
    key = bytes(data[start : start + klen])
    if flags & 1:
        return (key, None, 0, 0, 0)
    return (key, bytes(data[start + klen :]), create, version, lease)
