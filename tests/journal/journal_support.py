"""Helpers for journal tests: locate segments and frames on disk."""

from __future__ import annotations

import os
import random

from brain.journal import Frame, SegmentHeader, decode_frames, encode_frame, parse_segment_name
from brain.journal.segment import HEADER_FRAME_SIZE, decode_segment_header, encode_segment_header


def segment_paths(directory) -> list[str]:
    names = sorted(n for n in os.listdir(directory) if parse_segment_name(n) is not None)
    return [os.path.join(directory, n) for n in names]


def record_frames(path) -> list[Frame]:
    """Valid record frames of a segment file (header frame excluded)."""
    with open(path, "rb") as f:
        buffer = f.read()
    _, crc = decode_segment_header(buffer, path)
    return [f for f in decode_frames(buffer, HEADER_FRAME_SIZE, crc) if isinstance(f, Frame)]


def rewrite_as_legacy(directory, *, keep_length: bool) -> None:
    """Rewrite every segment as a brain that did not record segment sizes
    wrote it: the header's size field 0 (then reserved), the crc chain
    recomputed from there.  keep_length False: each file ends after its
    last frame, as a segment created without preallocation did."""
    prev_crc = None
    for path in segment_paths(directory):
        data = read_bytes(path)
        header, _ = decode_segment_header(data, path)
        payloads = [bytes(f.payload) for f in record_frames(path)]
        if prev_crc is None:
            prev_crc = header.prev_crc
        frame, crc = encode_segment_header(SegmentHeader(header.first_index, prev_crc))
        parts = [frame]
        for payload in payloads:
            frame, crc = encode_frame(payload, crc)
            parts.append(frame)
        body = b"".join(parts)
        if keep_length:
            body += bytes(len(data) - len(body))
        with open(path, "wb") as f:
            f.write(body)
        prev_crc = crc


def payload_for(index: int, max_len: int = 300) -> bytes:
    """Deterministic, index-specific payload so any record can be checked."""
    rng = random.Random(index)
    return f"{index}:".encode() + rng.randbytes(rng.randint(0, max_len))


def patch_bytes(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()



def crash_payload(index: int) -> bytes:
    """Payload of record `index` in the crash test: mostly small, some larger
    than a 64 KiB segment, always starting with the index."""
    rng = random.Random(index)
    roll = rng.random()
    if roll < 0.8:
        size = rng.randint(1, 200)
    elif roll < 0.98:
        size = rng.randint(1_000, 20_000)
    else:
        size = rng.randint(70_000, 150_000)
    return index.to_bytes(8, "little") + rng.randbytes(size)
