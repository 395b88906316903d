"""The protobuf varint, written, sized and read in one place.

A varint holds an integer seven bits a byte, the lowest first, with the
high bit set on every byte but the last; an int64 below zero is written as
its 64-bit two's complement, so it takes ten bytes.  Protobuf uses it for
every integer field, every tag and every length.

A leaf below every layer because two of them write protobuf by hand:
brain/api splices bytes around what the generated code and the native
encoder produce (events, list responses, sizes etcd measures), and
brain/migrate reads and writes the two messages etcd stores, without the
generated code (which only brain/api may import).
"""

from __future__ import annotations

_U64 = (1 << 64) - 1


class ProtoError(ValueError):
    """Bytes that are not a valid encoding of the expected message."""


def varint(n: int) -> bytes:
    """``n`` as a varint; a negative int64 takes ten bytes, as protobuf writes it."""
    n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint_size(n: int) -> int:
    """How many bytes ``varint(n)`` takes."""
    return max(1, ((n & _U64).bit_length() + 6) // 7)


def read_varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``, unsigned; ProtoError
    naming ``what`` (the message read) past ten bytes, IndexError when the
    bytes end inside it."""
    v = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, pos
        shift += 7
        if shift > 63:
            raise ProtoError(f"{what}: varint too long")


__all__ = ["ProtoError", "read_varint", "varint", "varint_size"]
