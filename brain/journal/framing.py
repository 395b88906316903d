"""CRC-framed records: pure encoding and decoding, no file handling.

One frame, always starting on an 8-byte boundary::

    u32 LE payload length | u32 LE crc | payload | zero padding to a multiple of 8

Invariants:

* A header starts 8-byte aligned, so it lies inside one 512-byte sector and
  a torn write can never leave half of a length field.
* crc = zlib.crc32(length_bytes + payload, prev_crc), where prev_crc is the
  crc of the frame before. Every frame vouches for the whole chain before it,
  so a stale frame left from older file contents cannot validate in a new
  position.
* encode_frame never writes length 0: a zero length field means "no more
  frames", which is exactly what preallocated (zeroed) space looks like.
* Padding is not covered by the crc; it carries no information.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator, NamedTuple

HEADER_SIZE = 8
ALIGNMENT = 8
MAX_PAYLOAD = 0xFFFFFFFF

_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<I")
# Indexed by length & 7: the zero bytes that pad a payload to the alignment.
_PADDING = tuple(bytes(-n % ALIGNMENT) for n in range(ALIGNMENT))
_ZERO_CHUNK = 1 << 16


def frame_size(payload_length: int) -> int:
    """Bytes a frame occupies on disk, header and padding included."""
    return HEADER_SIZE + ((payload_length + 7) & ~7)


def encode_frame(payload: bytes, prev_crc: int) -> tuple[bytes, int]:
    """Return (frame bytes, chain crc after this frame).

    The payload must be non-empty (length 0 is the end marker) and fit a u32.
    """
    n = len(payload)
    if not 0 < n <= MAX_PAYLOAD:
        raise ValueError(f"payload length must be 1..{MAX_PAYLOAD}, got {n}")
    crc = zlib.crc32(payload, zlib.crc32(_LENGTH.pack(n), prev_crc))
    return b"".join((_HEADER.pack(n, crc), payload, _PADDING[n & 7])), crc


class Frame(NamedTuple):
    """A frame that validated against the chain."""

    offset: int  # where its header starts
    end: int  # where the next frame starts
    payload: memoryview  # zero-copy view into the decoded buffer
    crc: int  # chain crc after this frame


class Stop(enum.Enum):
    """Why decoding stopped."""

    # A zero length field (end marker / preallocated space), or the buffer
    # ends exactly on a frame boundary.
    CLEAN = "clean"
    # The buffer ends inside a header or inside a frame: a write cut short.
    INCOMPLETE = "incomplete"
    # The whole frame is present but its crc does not match the chain. Torn
    # write or corruption: only the bytes around it can tell (see segment.py).
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class DecodeEnd:
    """Terminal item of decode_frames."""

    stop: Stop
    offset: int  # where the first frame not returned starts
    crc: int  # chain crc after the last good frame
    reason: str
    # Where the offending frame claims to end (== offset for CLEAN; may lie
    # beyond the buffer for INCOMPLETE). Only as trustworthy as its header.
    claimed_end: int
    # The crc field of the offending frame, None if its header is cut off.
    stored_crc: int | None


def decode_frames(
    buffer: bytes, start_offset: int = 0, prev_crc: int = 0
) -> Iterator[Frame | DecodeEnd]:
    """Yield each valid frame from start_offset on, then exactly one DecodeEnd.

    Stops at the first frame that does not validate: everything after a bad
    frame is unreachable through the chain anyway.
    """
    if start_offset % ALIGNMENT or start_offset < 0:
        raise ValueError(f"start offset {start_offset} is not 8-byte aligned")
    view = memoryview(buffer).cast("B")
    size = len(view)
    if start_offset > size:
        raise ValueError(f"start offset {start_offset} is past the buffer end {size}")
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    offset = start_offset
    crc = prev_crc
    while True:
        left = size - offset
        if left == 0:
            yield DecodeEnd(Stop.CLEAN, offset, crc, "end of data", offset, None)
            return
        if left < HEADER_SIZE:
            if any(view[offset:]):
                yield DecodeEnd(
                    Stop.INCOMPLETE, offset, crc,
                    f"data ends {left} bytes into a frame header", offset + HEADER_SIZE, None,
                )
            else:
                yield DecodeEnd(Stop.CLEAN, offset, crc, "zero tail shorter than a header", offset, None)
            return
        length, stored = unpack(view, offset)
        if length == 0:
            yield DecodeEnd(Stop.CLEAN, offset, crc, "zero length field (end marker)", offset, stored)
            return
        end = offset + HEADER_SIZE + ((length + 7) & ~7)
        if end > size:
            yield DecodeEnd(
                Stop.INCOMPLETE, offset, crc,
                f"frame of {length} payload bytes runs past the end of data at {size}", end, stored,
            )
            return
        payload = view[offset + HEADER_SIZE : offset + HEADER_SIZE + length]
        new_crc = crc32(payload, crc32(view[offset : offset + 4], crc))
        if new_crc != stored:
            yield DecodeEnd(
                Stop.CORRUPT, offset, crc,
                f"crc mismatch in frame of {length} payload bytes", end, stored,
            )
            return
        crc = new_crc
        yield Frame(offset, end, payload, crc)
        offset = end


def first_nonzero(buffer: bytes, start: int = 0) -> int | None:
    """Offset of the first non-zero byte at or after start, None if all zero."""
    size = len(buffer)
    for low in range(start, size, _ZERO_CHUNK):
        high = min(low + _ZERO_CHUNK, size)
        if buffer.count(0, low, high) != high - low:
            chunk = buffer[low:high]
            return low + len(chunk) - len(chunk.lstrip(b"\0"))
    return None


def data_end(buffer: bytes, start: int = 0) -> int:
    """Offset just past the last non-zero byte at or after start (start if none)."""
    high = len(buffer)
    while high > start:
        low = max(start, high - _ZERO_CHUNK)
        if buffer.count(0, low, high) != high - low:
            return low + len(buffer[low:high].rstrip(b"\0"))
        high = low
    return start


def find_chained_frame(buffer: bytes, start: int, stop: int, prev_crc: int) -> int | None:
    """First aligned offset in [start, stop) holding a frame that chains from prev_crc.

    Used on a frame that failed validation, with prev_crc set to its *stored*
    crc field: if its length field was damaged, the real next frame still
    chains from that crc and proves that records follow. The stored crc
    depends on the whole chain before it, so the payload of a torn frame
    cannot contain such a frame except by chance (2**-32 per candidate).
    """
    view = memoryview(buffer).cast("B")
    size = len(view)
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    first = (start + 7) & ~7
    last = min(stop, size - HEADER_SIZE + 1)
    for offset in range(first, last, ALIGNMENT):
        length, stored = unpack(view, offset)
        if length == 0 or offset + HEADER_SIZE + length > size:
            continue
        payload = view[offset + HEADER_SIZE : offset + HEADER_SIZE + length]
        if crc32(payload, crc32(view[offset : offset + 4], prev_crc)) == stored:
            return offset
    return None
