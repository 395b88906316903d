"""The protobuf wire encoding of the messages etcd stores in its database.

    mvccpb.KeyValue   key=1 (bytes) create_revision=2 mod_revision=3 version=4 (int64)
                      value=5 (bytes) lease=6 (int64)
    leasepb.Lease     ID=1 TTL=2 RemainingTTL=3 (int64)
    authpb.User       name=1 password=2 (bytes: the bcrypt hash) roles=3 (repeated string)
                      options=4 (UserAddOptions: no_password=1 bool; etcd always writes it)
    authpb.Role       name=1 (bytes) keyPermission=2 (repeated Permission:
                      permType=1 (0 READ, 1 WRITE, 2 READWRITE) key=2 range_end=3)

Encoding writes the fields in number order and leaves zero values out, as
etcd's gogoproto marshalling does, so a KeyValue we write is byte for byte
the one etcd would write.  Decoding skips fields it does not know (a newer
etcd may add some).  A negative int64 is a 10-byte varint (two's complement;
the varint itself: brain.protowire).

Written by hand rather than with the generated code: this layer sits below
brain/api, the only user of the generated protobuf modules, and these few
small messages need nothing more.
"""

from __future__ import annotations

from typing import NamedTuple

from brain.protowire import ProtoError, read_varint, varint

_MASK64 = (1 << 64) - 1


class KeyValue(NamedTuple):
    key: bytes
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    value: bytes = b""
    lease: int = 0


class Lease(NamedTuple):
    id: int
    ttl: int = 0
    remaining_ttl: int = 0


def _int_field(tag: int, n: int) -> bytes:
    return bytes((tag << 3,)) + varint(n) if n else b""


def _bytes_field(tag: int, b: bytes) -> bytes:
    return bytes((tag << 3 | 2,)) + varint(len(b)) + b if b else b""


def encode_key_value(kv: KeyValue) -> bytes:
    return b"".join((
        _bytes_field(1, kv.key),
        _int_field(2, kv.create_revision),
        _int_field(3, kv.mod_revision),
        _int_field(4, kv.version),
        _bytes_field(5, kv.value),
        _int_field(6, kv.lease),
    ))


def encode_lease(lease: Lease) -> bytes:
    return _int_field(1, lease.id) + _int_field(2, lease.ttl) + _int_field(3, lease.remaining_ttl)


def _fields(data: bytes, what: str) -> dict[int, int | bytes]:
    """Field number -> last value (ints as signed int64, length-delimited as
    bytes); unknown wire types 1 and 5 (fixed64/fixed32) are skipped."""
    out: dict[int, int | bytes] = {}
    for field, v in _all_fields(data, what):
        out[field] = v - (1 << 64) if type(v) is int and v >> 63 else v
    return out


def decode_key_value(data: bytes) -> KeyValue:
    """The common case (one-byte tags, fields 1-6) in one pass; anything
    else through the general field reader.  Import decodes one KeyValue per
    stored revision, so this is its hot loop."""
    key = value = b""
    ints = [0, 0, 0, 0, 0, 0, 0]  # by field number: 2 create, 3 mod, 4 version, 6 lease
    pos, n = 0, len(data)
    try:
        while pos < n:
            tag = data[pos]
            pos += 1
            if tag == 0x0A or tag == 0x2A:  # key, value
                size = data[pos]
                if size < 0x80:
                    pos += 1
                else:
                    size, pos = read_varint(data, pos, "mvccpb.KeyValue")
                end = pos + size
                if end > n:
                    raise ProtoError("mvccpb.KeyValue: a field runs past the end")
                if tag == 0x0A:
                    key = data[pos:end]
                else:
                    value = data[pos:end]
                pos = end
            elif tag in (0x10, 0x18, 0x20, 0x30):  # create, mod, version, lease
                v, pos = read_varint(data, pos, "mvccpb.KeyValue")
                if v >> 63:
                    v = (v & _MASK64) - (1 << 64)
                ints[tag >> 3] = v
            else:
                return _decode_key_value_general(data)
    except IndexError:
        raise ProtoError("mvccpb.KeyValue: truncated") from None
    return KeyValue(key, ints[2], ints[3], ints[4], value, ints[6])


def _decode_key_value_general(data: bytes) -> KeyValue:
    f = _fields(data, "mvccpb.KeyValue")
    kv = KeyValue(f.get(1, b""), f.get(2, 0), f.get(3, 0), f.get(4, 0), f.get(5, b""), f.get(6, 0))
    if not (type(kv.key) is bytes and type(kv.value) is bytes
            and all(type(x) is int for x in (kv.create_revision, kv.mod_revision, kv.version, kv.lease))):
        raise ProtoError("mvccpb.KeyValue: a field has the wrong wire type")
    return kv


def decode_lease(data: bytes) -> Lease:
    f = _fields(data, "leasepb.Lease")
    vals = (f.get(1, 0), f.get(2, 0), f.get(3, 0))
    if not all(isinstance(v, int) for v in vals):
        raise ProtoError("leasepb.Lease: a field has the wrong wire type")
    return Lease(*vals)


class User(NamedTuple):
    name: bytes
    password: bytes = b""
    roles: tuple[bytes, ...] = ()
    no_password: bool = False


class Permission(NamedTuple):
    perm_type: int
    key: bytes
    range_end: bytes = b""


class Role(NamedTuple):
    name: bytes
    permissions: tuple[Permission, ...] = ()


def encode_user(u: User) -> bytes:
    options = _int_field(1, 1) if u.no_password else b""
    return b"".join((_bytes_field(1, u.name), _bytes_field(2, u.password),
                     *(bytes((3 << 3 | 2,)) + varint(len(r)) + r for r in u.roles),
                     bytes((4 << 3 | 2,)) + varint(len(options)) + options))


def encode_role(r: Role) -> bytes:
    perms = []
    for p in r.permissions:
        body = _int_field(1, p.perm_type) + _bytes_field(2, p.key) + _bytes_field(3, p.range_end)
        perms.append(bytes((2 << 3 | 2,)) + varint(len(body)) + body)
    return _bytes_field(1, r.name) + b"".join(perms)


def _all_fields(data: bytes, what: str) -> list[tuple[int, int | bytes]]:
    """Every (field number, value) in order, repeated fields included (ints
    as unsigned 64-bit); wire types 1 and 5 are skipped."""
    out: list[tuple[int, int | bytes]] = []
    pos, n = 0, len(data)
    try:
        while pos < n:
            tag, pos = read_varint(data, pos, what)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                v, pos = read_varint(data, pos, what)
                out.append((field, v & _MASK64))
            elif wire == 2:
                size, pos = read_varint(data, pos, what)
                if pos + size > n:
                    raise ProtoError(f"{what}: field {field} runs past the end")
                out.append((field, data[pos: pos + size]))
                pos += size
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise ProtoError(f"{what}: unsupported wire type {wire}")
    except IndexError:
        raise ProtoError(f"{what}: truncated") from None
    if pos != n:
        raise ProtoError(f"{what}: truncated")
    return out


def _typed(value, kind: type, what: str):
    if type(value) is not kind:
        raise ProtoError(f"{what}: a field has the wrong wire type")
    return value


def decode_user(data: bytes) -> User:
    name = password = b""
    roles: list[bytes] = []
    no_password = False
    for field, value in _all_fields(data, "authpb.User"):
        if field == 1:
            name = _typed(value, bytes, "authpb.User")
        elif field == 2:
            password = _typed(value, bytes, "authpb.User")
        elif field == 3:
            roles.append(_typed(value, bytes, "authpb.User"))
        elif field == 4:
            for f, v in _all_fields(_typed(value, bytes, "authpb.User"), "authpb.UserAddOptions"):
                if f == 1:
                    no_password = bool(_typed(v, int, "authpb.UserAddOptions"))
    return User(name, password, tuple(roles), no_password)


def decode_role(data: bytes) -> Role:
    name = b""
    perms: list[Permission] = []
    for field, value in _all_fields(data, "authpb.Role"):
        if field == 1:
            name = _typed(value, bytes, "authpb.Role")
        elif field == 2:
            perm_type, key, end = 0, b"", b""
            for f, v in _all_fields(_typed(value, bytes, "authpb.Role"), "authpb.Permission"):
                if f == 1:
                    perm_type = _typed(v, int, "authpb.Permission")
                elif f == 2:
                    key = _typed(v, bytes, "authpb.Permission")
                elif f == 3:
                    end = _typed(v, bytes, "authpb.Permission")
            perms.append(Permission(perm_type, key, end))
    return Role(name, tuple(perms))


class Auth(NamedTuple):
    """What the auth buckets hold: authEnabled, authRevision, the users and
    the roles (by name, as the buckets key them)."""

    enabled: bool = False
    revision: int = 1
    users: tuple[User, ...] = ()
    roles: tuple[Role, ...] = ()
