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
import operator
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
    _enc(value, out)
    return b"".join(out)


def _enc(v, out: list) -> None:
    """Append ``v``'s encoding to ``out``; the int, bytes, None and
    boolean members of a list or a dataclass are written in the loop over
    them, without a call each."""
    put = out.append
    t = type(v)
    if t in _ATOMS:
        _put_atom(v, t, put)
        return
    if t is list or t is tuple:
        put(_TU32.pack(b"L", len(v)))
        items = v
    elif isinstance(v, EtcdError):
        put(b"E")
        _enc(v.code, out)
        _enc(v.message, out)
        return
    else:
        tid = _ID.get(t)
        if tid is None:
            raise TypeError(f"cannot encode {t.__name__}")
        put(_D_HEAD[tid])
        items = _GETTERS[tid](v)
    for item in items:
        it = type(item)
        if it is int:
            put(_TI64.pack(b"I", item))
        elif it is bytes:
            put(_TU32.pack(b"B", len(item)))
            put(item)
        elif item is None:
            put(b"N")
        elif it is bool:
            put(b"T" if item else b"F")
        else:
            _enc(item, out)


def _put_atom(v, t: type, put) -> None:
    if v is None:
        put(b"N")
    elif t is bool:
        put(b"T" if v else b"F")
    elif t is int:
        put(_TI64.pack(b"I", v))
    elif t is bytes:
        put(_TU32.pack(b"B", len(v)))
        put(v)
    else:  # str
        data = v.encode()
        put(_TU32.pack(b"S", len(data)))
        put(data)


_ATOMS = frozenset((type(None), bool, int, bytes, str))
_TI64 = struct.Struct("<cq")
_TU32 = struct.Struct("<cI")
_D_HEAD = [b"D" + bytes((i,)) for i in range(len(TYPES))]
# each type's field values in declaration order, as a tuple
_GETTERS = [(operator.attrgetter(*names) if len(names) > 1 else
             (lambda obj, get=operator.attrgetter(*names): (get(obj),)) if names else (lambda obj: ()))
            for names in _FIELDS]


def decode(data: bytes):
    if type(data) is not bytes:
        data = bytes(data)
    value, pos = _dec(data, 0, 0)
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} bytes left over")
    return value


def _truncated() -> CodecError:
    return CodecError("truncated")


def _dec(b: bytes, pos: int, depth: int):
    """The value at ``pos`` and the position after it.  The members of a
    list or a dataclass that are ints, bytes, strings, booleans or None
    (nearly all of a forwarded write) are read in the loop over them, without a call each:
    on a leader the decoding of its followers' writes was a quarter of its
    interpreter's time."""
    if depth > MAX_DEPTH:
        raise CodecError("nested too deeply")
    end = len(b)
    if pos >= end:
        raise _truncated()
    tag = b[pos]
    pos += 1
    if tag == 0x44 or tag == 0x4C:  # D, L
        if tag == 0x44:
            if pos >= end:
                raise _truncated()
            tid = b[pos]
            pos += 1
            if tid >= len(TYPES):
                raise CodecError(f"unknown type {tid}")
            n = len(_FIELDS[tid])
        else:
            if pos + 4 > end:
                raise _truncated()
            (n,) = _U32.unpack_from(b, pos)
            pos += 4
            if n > end - pos:  # every value takes at least one byte
                raise CodecError("list longer than its bytes")
        items = []
        add = items.append
        for _ in range(n):
            if pos >= end:
                raise _truncated()
            t = b[pos]
            if t == 0x49:  # I
                if pos + 9 > end:
                    raise _truncated()
                add(_I64.unpack_from(b, pos + 1)[0])
                pos += 9
            elif t == 0x42 or t == 0x53:  # B, S
                if pos + 5 > end:
                    raise _truncated()
                start = pos + 5
                pos = start + _U32.unpack_from(b, pos + 1)[0]
                if pos > end:
                    raise _truncated()
                if t == 0x42:
                    add(b[start:pos])
                    continue
                try:
                    add(b[start:pos].decode())
                except UnicodeDecodeError as e:
                    raise CodecError(str(e)) from None
            elif t == 0x4E:  # N
                add(None)
                pos += 1
            elif t == 0x46:  # F
                add(False)
                pos += 1
            elif t == 0x54:  # T
                add(True)
                pos += 1
            else:
                item, pos = _dec(b, pos, depth + 1)
                add(item)
        if tag == 0x4C:
            return items, pos
        try:
            return TYPES[tid](*items), pos
        except TypeError as e:
            raise CodecError(str(e)) from None
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x49:  # I
        if pos + 8 > end:
            raise _truncated()
        return _I64.unpack_from(b, pos)[0], pos + 8
    if tag == 0x42 or tag == 0x53:  # B, S
        if pos + 4 > end:
            raise _truncated()
        start = pos + 4
        pos = start + _U32.unpack_from(b, pos)[0]
        if pos > end:
            raise _truncated()
        raw = b[start:pos]
        if tag == 0x42:
            return raw, pos
        try:
            return raw.decode(), pos
        except UnicodeDecodeError as e:
            raise CodecError(str(e)) from None
    if tag == 0x45:  # E
        code, pos = _dec(b, pos, depth + 1)
        message, pos = _dec(b, pos, depth + 1)
        if type(code) is not str or type(message) is not str:
            raise CodecError("bad error")
        return EtcdError(code, message), pos
    raise CodecError(f"unknown tag {tag:#x} at {pos - 1}")

