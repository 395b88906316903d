"""Helpers for journal tests: locate segments and frames on disk."""

from __future__ import annotations

import os
import random

from brain.journal import Frame, decode_frames, parse_segment_name
from brain.journal.segment import HEADER_FRAME_SIZE, decode_segment_header


def segment_paths(directory) -> list[str]:
    names = sorted(n for n in os.listdir(directory) if parse_segment_name(n) is not None)
    return [os.path.join(directory, n) for n in names]


def record_frames(path) -> list[Frame]:
    """Valid record frames of a segment file (header frame excluded)."""
    with open(path, "rb") as f:
        buffer = f.read()
    _, crc = decode_segment_header(buffer, path)
    return [f for f in decode_frames(buffer, HEADER_FRAME_SIZE, crc) if isinstance(f, Frame)]


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
