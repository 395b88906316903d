"""Revisions: (main, sub) pairs packed into one int.

Every write request gets the next *main* revision; the changes inside it (the
puts and deletes of one Txn, every key a DeleteRange removes) are numbered by
*sub*.  Packing main << 32 | sub gives an int that compares exactly like the
pair, hashes cheaply and needs no tuple allocation on the hot path.  Sub is
below 2**32 because one request can carry at most that many changes (a
DeleteRange over more keys than fit in memory is not a concern).

On disk a revision is 16 big-endian bytes so that bytewise order equals
numeric order (the value stores keep records sorted by it).
"""

from __future__ import annotations

SUB_BITS = 32
SUB_MASK = (1 << SUB_BITS) - 1


def pack(main: int, sub: int = 0) -> int:
    return (main << SUB_BITS) | sub


def main_of(rev: int) -> int:
    return rev >> SUB_BITS


def sub_of(rev: int) -> int:
    return rev & SUB_MASK


def last_of_main(main: int) -> int:
    """The largest packed revision whose main part is `main`."""
    return (main << SUB_BITS) | SUB_MASK


def to_bytes(rev: int) -> bytes:
    return rev.to_bytes(16, "big")


def from_bytes(data: bytes) -> int:
    return int.from_bytes(data, "big")
