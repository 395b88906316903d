"""Bytes for what replicas say to each other: core requests and results.

A follower forwards its clients' writes to the leader as brain.mvcc
requests and gets brain.mvcc results back (or etcd errors).  They are small
slotted dataclasses, so one generic, self-describing encoding serves them
all: a tag byte, then the value.

    N              None                T / F     True / False
    I <i64>        an int              B <u32 n> <n bytes>
    S <u32 n> <n bytes of UTF-8>       L <u32 n> <n values>
    D <u8 type> <the fields, in declaration order>
    E <code S> <message S>             an EtcdError

Decoding accepts only the types listed in ``TYPES`` (their position is
their wire number: append, never reorder) and checks every length, so a
peer can make it fail but not make it build anything else.

Example: PutResult(revision=7, prev_kv=None) -> b"D" 0x0b b"I" 7(8 bytes) b"N".
"""

from __future__ import annotations

import dataclasses
import struct

from ..engine.leases import LeaseLeasesResult, LeaseTimeToLiveResult
from ..mvcc import requests as r
from ..mvcc.errors import EtcdError

TYPES: tuple[type, ...] = (
    r.KeyValue, r.RangeRequest, r.PutRequest, r.DeleteRangeRequest, r.Compare, r.TxnRequest,
    r.CompactRequest, r.LeaseGrantRequest, r.LeaseRevokeRequest, r.RangeResult, r.PutResult,
    r.DeleteRangeResult, r.TxnResult, r.EmptyResult, r.CompactResult, r.LeaseGrantResult,
    r.LeaseRevokeResult, LeaseTimeToLiveResult, LeaseLeasesResult,
    # auth (brain.mvcc.requests): the requests, their result, a write with its caller
    *r.AUTH_REQUESTS, r.AuthResult, r.Authorized,
)
_ID = {cls: i for i, cls in enumerate(TYPES)}
_FIELDS = [tuple(f.name for f in dataclasses.fields(cls)) for cls in TYPES]

_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
MAX_DEPTH = 64


class CodecError(ValueError):
    """Bytes that are not a value of this encoding."""


def encode(value) -> bytes:
    out: list[bytes] = []
    _enc(value, out.append)
    return b"".join(out)


def _enc(v, put) -> None:
    if v is None:
        put(b"N")
    elif v is True:
        put(b"T")
    elif v is False:
        put(b"F")
    elif type(v) is int:
        put(b"I" + _I64.pack(v))
    elif type(v) is bytes:
        put(b"B" + _U32.pack(len(v)))
        put(v)
    elif type(v) is str:
        data = v.encode()
        put(b"S" + _U32.pack(len(data)))
        put(data)
    elif type(v) in (list, tuple):
        put(b"L" + _U32.pack(len(v)))
        for item in v:
            _enc(item, put)
    elif isinstance(v, EtcdError):
        put(b"E")
        _enc(v.code, put)
        _enc(v.message, put)
    else:
        tid = _ID.get(type(v))
        if tid is None:
            raise TypeError(f"cannot encode {type(v).__name__}")
        put(b"D" + bytes((tid,)))
        for name in _FIELDS[tid]:
            _enc(getattr(v, name), put)


def decode(data: bytes):
    value, pos = _dec(memoryview(data), 0, 0)
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} bytes left over")
    return value


def _dec(mv: memoryview, pos: int, depth: int):
    if depth > MAX_DEPTH:
        raise CodecError("nested too deeply")
    try:
        tag = mv[pos]
    except IndexError:
        raise CodecError("truncated") from None
    pos += 1
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x49:  # I
        _need(mv, pos, 8)
        return _I64.unpack_from(mv, pos)[0], pos + 8
    if tag in (0x42, 0x53):  # B, S
        _need(mv, pos, 4)
        (n,) = _U32.unpack_from(mv, pos)
        pos += 4
        _need(mv, pos, n)
        raw = bytes(mv[pos:pos + n])
        pos += n
        if tag == 0x42:
            return raw, pos
        try:
            return raw.decode(), pos
        except UnicodeDecodeError as e:
            raise CodecError(str(e)) from None
    if tag == 0x4C:  # L
        _need(mv, pos, 4)
        (n,) = _U32.unpack_from(mv, pos)
        pos += 4
        if n > len(mv) - pos:  # every value takes at least one byte
            raise CodecError("list longer than its bytes")
        items = []
        for _ in range(n):
            item, pos = _dec(mv, pos, depth + 1)
            items.append(item)
        return items, pos
    if tag == 0x45:  # E
        code, pos = _dec(mv, pos, depth + 1)
        message, pos = _dec(mv, pos, depth + 1)
        if type(code) is not str or type(message) is not str:
            raise CodecError("bad error")
        return EtcdError(code, message), pos
    if tag == 0x44:  # D
        _need(mv, pos, 1)
        tid = mv[pos]
        pos += 1
        if tid >= len(TYPES):
            raise CodecError(f"unknown type {tid}")
        values = []
        for _ in _FIELDS[tid]:
            item, pos = _dec(mv, pos, depth + 1)
            values.append(item)
        try:
            return TYPES[tid](*values), pos
        except TypeError as e:
            raise CodecError(str(e)) from None
    raise CodecError(f"unknown tag {tag:#x} at {pos - 1}")


def _need(mv: memoryview, pos: int, n: int) -> None:
    if pos + n > len(mv):
        raise CodecError("truncated")
