"""brain's own snapshot format (format 1), read only.

brain wrote this format before its snapshots became etcd databases
(etcd_export.py); `brain snapshot status|restore` still read such files.
Integers little-endian:

    b"BRAINSNP"  u32 format (1)  u32 header length  header (JSON, UTF-8)
    records:     b"R" u32 n  then n bytes: 16-byte big-endian revision + record
                 (brain.mvcc.codec.encode_record), in key, then revision order
    end:         b"E" u64 records  u64 live keys  u32 kv hash
    zero padding to a multiple of 512 bytes
    sha256 of everything above (32 bytes)

The header holds the revision, the compaction revision, the leases (id, TTL),
the shard boundaries and the source's identity; the kv hash is the source's
HashKV at the snapshot revision.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..mvcc.codec import decode_record
from ..mvcc.kvhash import KvHasher, hashed

MAGIC = b"BRAINSNP"
FORMAT = 1
SECTOR = 512
DIGEST_SIZE = 32

_HEAD = struct.Struct("<8sII")
_END = struct.Struct("<cQQI")


class SnapshotError(Exception):
    """A snapshot file that cannot be used (message says why)."""


class SnapshotDigestError(SnapshotError):
    """The snapshot's sha256 is wrong or missing (restore's --skip-hash-check reads it anyway)."""


def is_legacy(path: str) -> bool:
    """True when `path` starts with this format's magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@dataclass
class SnapshotFile:
    path: str
    header: dict
    size: int  # file size
    has_digest: bool
    records: int = 0
    keys: int = 0
    hash: int = 0


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise SnapshotError(f"truncated snapshot: {what} cut short")
    return data


def _verify_digest(path: str, size: int) -> None:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        left = size - DIGEST_SIZE
        while left > 0:
            buf = f.read(min(left, 1 << 20))
            if not buf:
                raise SnapshotError("truncated snapshot")
            sha.update(buf)
            left -= len(buf)
        digest = f.read(DIGEST_SIZE)
    if sha.digest() != digest:
        raise SnapshotDigestError(f"{path}: sha256 mismatch: the snapshot is corrupt or incomplete")


def open_snapshot(path: str, *, skip_hash_check: bool = False) -> tuple[SnapshotFile, Iterator[tuple[int, bytes]]]:
    """Check a snapshot file and return its description and an iterator of
    (revision, record bytes); the iterator verifies the end frame (counts and
    kv hash) when exhausted and fills in records/keys/hash."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise SnapshotError(f"{path}: {e.strerror or e}") from None
    has_digest = size % SECTOR == DIGEST_SIZE
    if has_digest:
        if not skip_hash_check:
            _verify_digest(path, size)
    elif not skip_hash_check:
        raise SnapshotDigestError(f"{path}: the snapshot has no sha256 trailer")
    f = open(path, "rb")
    try:
        magic, fmt, hlen = _HEAD.unpack(_read_exact(f, _HEAD.size, "header"))
        if magic != MAGIC:
            if magic[:4] == b"\0\0\0\0" or size >= 4096:
                raise SnapshotError(f"{path}: not a brain snapshot (an etcd bbolt snapshot? restore it with etcdutl)")
            raise SnapshotError(f"{path}: not a brain snapshot")
        if fmt != FORMAT:
            raise SnapshotError(f"{path}: snapshot format {fmt} is not supported (this brain reads format {FORMAT})")
        try:
            header = json.loads(_read_exact(f, hlen, "header"))
        except ValueError as e:
            raise SnapshotError(f"{path}: bad snapshot header: {e}") from None
    except BaseException:
        f.close()
        raise
    snap = SnapshotFile(path, header, size, has_digest)

    def records() -> Iterator[tuple[int, bytes]]:
        h = KvHasher()
        compact_rev = header.get("compact_revision", -1)
        n = 0
        keys = 0
        prev_key = None
        prev_live = False
        try:
            while True:
                tag = f.read(1)
                if tag == b"R":
                    (length,) = struct.unpack("<I", _read_exact(f, 4, "record"))
                    body = _read_exact(f, length, "record")
                    rev = int.from_bytes(body[:16], "big")
                    data = body[16:]
                    if hashed(rev, data, compact_rev):
                        h.update(body)
                    rec = decode_record(data)
                    if rec[0] != prev_key:
                        keys += prev_live
                        prev_key = rec[0]
                    prev_live = rec[1] is not None
                    n += 1
                    yield rev, data
                elif tag == b"E":
                    count, live, crc = struct.unpack("<QQI", _read_exact(f, _END.size - 1, "end frame"))
                    keys += prev_live
                    if (count, live, crc) != (n, keys, h.value):
                        raise SnapshotError(
                            f"{path}: end frame says {count} records, {live} keys, hash {crc:x}; "
                            f"read {n} records, {keys} keys, hash {h.value:x}")
                    snap.records, snap.keys, snap.hash = n, keys, h.value
                    return
                else:
                    raise SnapshotError(f"{path}: bad record tag {tag!r} at offset {f.tell() - 1}")
        finally:
            f.close()

    return snap, records()


