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
  b"A" kind:u8 then, by kind (strings and bytes as len:u32 then the bytes):
         1 name password flags:u8 (1 = no password) count:u32 role*   a user, put whole
         2 name                                                        a user deleted
         3 name count:u32 (type:u8 key range_end)*                     a role, put whole
         4 name                                                        a role deleted
         5 enabled:u8 revision:u64                                     auth on/off, auth revision
         6 token name                                                  a simple token assigned
         7 name                                                        the user's tokens dropped
         8                                                             every token dropped
       (brain.mvcc.auth: the effects on the auth state; 6-8 the tokens'.)

Format versions: 1 is the one above without b"A"; 2 adds b"A" (a payload
without b"V" was written before versions were recorded, and is version 1
too).  A payload is written in the lowest version its entries need, so a
brain that reads only version 1 still follows a journal where auth was
never used.  A reader refuses a
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

FORMAT_VERSION = 2  # the newest journal payload format this code reads and writes
AUTH_FORMAT_VERSION = 2  # the first with auth entries (b"A")
_BASE_VERSION = 1  # what a payload without auth entries is written as

# b"A" kinds: the auth state's effects (brain.mvcc.auth's numbers) and the tokens'
AUTH_USER_PUT, AUTH_USER_DELETE, AUTH_ROLE_PUT, AUTH_ROLE_DELETE, AUTH_STATUS = 1, 2, 3, 4, 5
AUTH_TOKEN_ASSIGN, AUTH_TOKENS_OF_USER_DROPPED, AUTH_TOKENS_DROPPED = 6, 7, 8


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

    __slots__ = ("_parts", "_count_at", "_count", "_main", "_version")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._count_at = -1
        self._count = 0
        self._main = 0
        self._version = _BASE_VERSION

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

    def auth(self, kind: int, *fields) -> None:
        """One b"A" entry: ``fields`` as the kind's layout above lists them
        (a user: name, password, no_password, roles; a role: name and
        (type, key, range_end) triples; the status: enabled, revision)."""
        self._close_revision()
        self._version = AUTH_FORMAT_VERSION
        self._parts.append(encode_auth(kind, *fields))

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
        return bytes((0x56, self._version)) + b"".join(self._parts)


def _blob(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def encode_auth(kind: int, *fields) -> bytes:
    """A b"A" entry's bytes (BatchEncoder.auth)."""
    head = b"A" + bytes((kind,))
    if kind == AUTH_USER_PUT:
        name, password, no_password, roles = fields
        return (head + _blob(name.encode()) + _blob(password) + bytes((1 if no_password else 0,))
                + _LEN.pack(len(roles)) + b"".join(_blob(r.encode()) for r in roles))
    if kind in (AUTH_USER_DELETE, AUTH_ROLE_DELETE, AUTH_TOKENS_OF_USER_DROPPED):
        return head + _blob(fields[0].encode())
    if kind == AUTH_ROLE_PUT:
        name, perms = fields
        return (head + _blob(name.encode()) + _LEN.pack(len(perms))
                + b"".join(bytes((t,)) + _blob(k) + _blob(e) for t, k, e in perms))
    if kind == AUTH_STATUS:
        enabled, revision = fields
        return head + bytes((1 if enabled else 0,)) + struct.pack("<Q", revision)
    if kind == AUTH_TOKEN_ASSIGN:
        token, name = fields
        return head + _blob(token.encode()) + _blob(name.encode())
    if kind == AUTH_TOKENS_DROPPED:
        return head
    raise ValueError(f"unknown auth entry kind {kind}")


def _read_blob(payload: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _LEN.unpack_from(payload, pos)
    pos += 4
    end = pos + n
    if end > len(payload):
        raise ValueError("truncated auth entry")
    return payload[pos:end], end


def _read_str(payload: bytes, pos: int) -> tuple[str, int]:
    data, pos = _read_blob(payload, pos)
    return data.decode(), pos


def decode_auth(payload: bytes, pos: int) -> tuple[tuple, int]:
    """One b"A" entry from ``pos`` (just after its tag): (("A", kind, fields...), next position)."""
    kind = payload[pos]
    pos += 1
    if kind == AUTH_USER_PUT:
        name, pos = _read_str(payload, pos)
        password, pos = _read_blob(payload, pos)
        flags = payload[pos]
        (count,) = _LEN.unpack_from(payload, pos + 1)
        pos += 5
        roles = []
        for _ in range(count):
            role, pos = _read_str(payload, pos)
            roles.append(role)
        return ("A", kind, name, password, bool(flags & 1), tuple(roles)), pos
    if kind in (AUTH_USER_DELETE, AUTH_ROLE_DELETE, AUTH_TOKENS_OF_USER_DROPPED):
        name, pos = _read_str(payload, pos)
        return ("A", kind, name), pos
    if kind == AUTH_ROLE_PUT:
        name, pos = _read_str(payload, pos)
        (count,) = _LEN.unpack_from(payload, pos)
        pos += 4
        perms = []
        for _ in range(count):
            perm_type = payload[pos]
            key, pos = _read_blob(payload, pos + 1)
            end, pos = _read_blob(payload, pos)
            perms.append((perm_type, key, end))
        return ("A", kind, name, tuple(perms)), pos
    if kind == AUTH_STATUS:
        enabled = bool(payload[pos])
        (revision,) = struct.unpack_from("<Q", payload, pos + 1)
        return ("A", kind, enabled, revision), pos + 9
    if kind == AUTH_TOKEN_ASSIGN:
        token, pos = _read_str(payload, pos)
        name, pos = _read_str(payload, pos)
        return ("A", kind, token, name), pos
    if kind == AUTH_TOKENS_DROPPED:
        return ("A", kind), pos
    raise ValueError(f"unknown auth entry kind {kind} at {pos - 1}")


def decode_batch(payload: bytes) -> list[tuple]:
    """The entries: ("T", main, [(PUT, key, value, lease) | (DELETE, key)]),
    ("C", rev), ("G", id, ttl), ("R", id), ("E", epoch, leader), ("A", kind,
    fields...) (decode_auth).  Raises
    ValueError on bad bytes, FormatVersionError on a format newer than
    FORMAT_VERSION; the whole payload is decoded first, so a caller that
    applies entries applies none of a payload that raises."""
    entries: list[tuple] = []
    mv = memoryview(payload)
    pos, n = 0, len(payload)
    version = 1
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
        elif tag == 0x41:  # A
            if version < AUTH_FORMAT_VERSION:
                raise ValueError(f"auth entry in a version {version} payload at offset {pos - 1}")
            try:
                entry, pos = decode_auth(payload, pos)
            except (struct.error, IndexError, UnicodeDecodeError) as e:
                raise ValueError(f"bad auth entry at offset {pos - 1}: {e}") from None
            entries.append(entry)
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
