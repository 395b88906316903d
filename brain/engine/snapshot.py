"""Hashes of the store and snapshots: taking, checking, restoring.

Both walk the history the same way: shard by shard (which is key order),
key by key, the revisions `kvhash.covered_revisions` selects (everything up to
the revision asked for that compaction keeps).  The walk holds the engine
lock for a bounded number of revisions at a time, so writes go on meanwhile;
it pins physical compaction, so a compaction requested during the walk
cannot drop history it has not reached yet (the selection uses the
compaction revision read when the walk started).

Snapshot file format (integers little-endian):

    b"BRAINSNP"  u32 format (1)  u32 header length  header (JSON, UTF-8)
    records:     b"R" u32 n  then n bytes: 16-byte big-endian revision + record
                 (brain.mvcc.codec.encode_record), in key, then revision order
    end:         b"E" u64 records  u64 live keys  u32 kv hash
    zero padding to a multiple of 512 bytes
    sha256 of everything above (32 bytes)

The header holds the revision, the compaction revision, the leases (id, TTL),
the shard boundaries and the source's identity.  The padding and the trailing
digest are what etcd's server sends and etcdctl checks (`snapshot save`
expects size % 512 == 32), so `etcdctl snapshot save` can fetch one from
brain; only brain reads the content.  The kv hash equals the source's HashKV
at the snapshot revision (same compaction revision), so `brain snapshot
status` and `etcdctl endpoint hashkv --rev` can be compared.

Restore builds a new data directory holding one checkpoint (no journal):
every record goes to the value store under the shard its key falls in (the
snapshot's layout by default, or another one: restore can reshard), plus the
checkpoint meta and new cluster and member IDs, as `etcdutl snapshot
restore` gives a restored member a new identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from .. import backend as backend_mod
from ..etcd_version import STORAGE_VERSION
from ..mvcc import errors
from ..mvcc.codec import decode_record, encode_record
from ..mvcc.kvhash import KvHasher, covered_revisions, hashed
from ..mvcc.shard import ShardMap, default_boundaries
from .engine import META_CHECKPOINT, META_IDENTITY, META_LAYOUT
from .ids import new_id

MAGIC = b"BRAINSNP"
FORMAT = 1
SECTOR = 512  # etcd: a snapshot is a multiple of this, then its sha256
DIGEST_SIZE = 32
WALK_CHUNK = 4096  # revisions read per hold of the engine lock
SEND_CHUNK = 32 * 1024  # etcd's snapshotSendBufferSize
RESTORE_BATCH_BYTES = 32 << 20

_HEAD = struct.Struct("<8sII")
_REC = struct.Struct("<cI")
_END = struct.Struct("<cQQI")


class SnapshotError(Exception):
    """A snapshot file that cannot be used (message says why)."""


# ---------------------------------------------------------------------------
# walking the history


def _walk(engine, rev: int, compact_rev: int, chunk: int | None = None) -> Iterator[tuple[list, int]]:
    """Yield (entries, live_keys) per chunk: entries are (revision, record
    bytes) in key, then revision order.  The caller has pinned compaction."""
    lock = engine._lock
    chunk = chunk or WALK_CHUNK
    for shard in engine.store.shards:
        cursor = None
        while True:
            entries: list[tuple[int, bytes]] = []
            live = 0
            with lock:
                index = shard.index
                it = index.irange() if cursor is None else index.irange(cursor, inclusive=(False, True))
                last = None
                scanned = 0
                for key in it:
                    last = key
                    scanned += 1
                    revs = covered_revisions(index[key], compact_rev, rev)
                    if not revs:
                        if scanned >= 4 * chunk:  # keys newer than `rev` still cost time
                            break
                        continue
                    rec = None
                    for r in revs:
                        rec = shard.record(r)
                        entries.append((r, encode_record(rec)))
                    if rec[1] is not None:
                        live += 1
                    if len(entries) >= chunk:
                        break
                else:
                    last = None  # the shard is done
            yield entries, live
            if last is None:
                break
            cursor = last


def _begin_walk(engine, rev: int) -> tuple[int, int, int]:
    """Check `rev` as etcd's HashKV does and pin compaction.
    Returns (revision to walk to, compaction revision, current revision)."""
    with engine._lock:
        current = engine.committed_rev
        compact_rev = engine.store.compact_rev
        if rev > 0 and rev < compact_rev:
            raise errors.ErrCompacted.fresh()
        if rev > 0 and rev > current:
            raise errors.ErrFutureRev.fresh()
        if rev == 0:
            rev = current
        engine.pin_compaction()
    return rev, compact_rev, current


def _hash_entries(h: KvHasher, entries: list[tuple[int, bytes]], compact_rev: int) -> None:
    if entries:
        h.update(b"".join(r.to_bytes(16, "big") + data for r, data in entries if hashed(r, data, compact_rev)),
                 len(entries))


@dataclass(frozen=True)
class KvHash:
    hash: int
    compact_revision: int
    hash_revision: int
    current_revision: int


def hash_kv(engine, rev: int = 0) -> KvHash:
    """etcd's HashKV: the hash of the history up to `rev` (0: the current
    revision) that compaction keeps; ErrCompacted / ErrFutureRev as etcd."""
    rev, compact_rev, current = _begin_walk(engine, rev)
    try:
        h = KvHasher()
        if rev >= 0:
            for entries, _live in _walk(engine, rev, compact_rev):
                _hash_entries(h, entries, compact_rev)
    finally:
        engine.unpin_compaction()
    return KvHash(h.value, compact_rev, rev, current)


def hash_all(engine) -> tuple[int, int]:
    """etcd's Hash: one hash of the whole store state (all kept history, the
    compaction revision, the leases).  Returns (hash, revision)."""
    kv = hash_kv(engine, 0)
    with engine._lock:
        leases = sorted((lease.id, lease.ttl) for lease in engine.store.lessor.leases.values())
    extra = json.dumps({"compact": kv.compact_revision, "revision": kv.hash_revision, "leases": leases})
    return zlib.crc32(extra.encode(), kv.hash) & 0xFFFFFFFF, kv.current_revision


# ---------------------------------------------------------------------------
# taking a snapshot


@dataclass
class SnapshotInfo:
    revision: int
    compact_revision: int
    records: int = 0
    keys: int = 0
    hash: int = 0
    size: int = 0  # bytes before the digest (a multiple of SECTOR)
    digest: bytes = b""
    header: dict = field(default_factory=dict)


class _Sink:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.sha.update(data)
        self.size += len(data)


def write_snapshot(engine, f: BinaryIO) -> SnapshotInfo:
    """Write a snapshot of the committed state to `f`, except the trailing
    digest, which is returned in the info (etcd sends it as its own message;
    a file gets it appended).  Writes may go on meanwhile."""

    def begin():
        with engine._lock:
            engine.pin_compaction()
            st = engine.store
            return {
                "format": FORMAT,
                "revision": engine.committed_rev,
                "compact_revision": st.compact_rev,
                "leases": sorted([lease.id, lease.ttl] for lease in st.lessor.leases.values()),
                "boundaries": [b.hex() for b in st.shard_map.boundaries],
                "cluster_id": engine.cluster_id,
                "member_id": engine.member_id,
                # the journal record the state ends with, read with the
                # revision (a replica copying this snapshot tails from it)
                "journal_index": engine._applied_index,
                "epoch": st.epoch,
                "leader_id": st.leader_id,
                "storage_version": STORAGE_VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }

    header = engine.on_committer(begin)
    info = SnapshotInfo(header["revision"], header["compact_revision"], header=header)
    sink = _Sink(f)
    try:
        head = json.dumps(header, sort_keys=True).encode()
        sink.write(_HEAD.pack(MAGIC, FORMAT, len(head)) + head)
        h = KvHasher()
        for entries, live in _walk(engine, info.revision, info.compact_revision):
            if not entries:
                continue
            parts = []
            for r, data in entries:
                parts.append(_REC.pack(b"R", 16 + len(data)))
                parts.append(r.to_bytes(16, "big"))
                parts.append(data)
            _hash_entries(h, entries, info.compact_revision)
            sink.write(b"".join(parts))
            info.records += len(entries)
            info.keys += live
    finally:
        engine.unpin_compaction()
    info.hash = h.value
    sink.write(_END.pack(b"E", info.records, info.keys, info.hash))
    pad = -sink.size % SECTOR
    if pad:
        sink.write(b"\0" * pad)
    info.size = sink.size
    info.digest = sink.sha.digest()
    return info


def save_snapshot(engine, path: str) -> SnapshotInfo:
    """A snapshot file at `path` (with its digest), written atomically."""
    part = path + ".part"
    with open(part, "wb") as f:
        info = write_snapshot(engine, f)
        f.write(info.digest)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
    return info


# ---------------------------------------------------------------------------
# reading a snapshot


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
        raise SnapshotError(f"{path}: sha256 mismatch: the snapshot is corrupt or incomplete")


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
        raise SnapshotError(f"{path}: snapshot missing hash but --skip-hash-check=false")
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


def status(path: str) -> SnapshotFile:
    """Read a whole snapshot, checking its digest, frames and kv hash."""
    snap, it = open_snapshot(path)
    for _ in it:
        pass
    return snap


# ---------------------------------------------------------------------------
# restoring


@dataclass
class RestoreResult:
    data_dir: str
    revision: int
    compact_revision: int
    records: int
    keys: int
    shards: int
    cluster_id: int
    member_id: int


def restore(
    path: str,
    data_dir: str,
    *,
    name: str = "default",
    shards: int | None = None,
    boundaries: list[bytes] | None = None,
    skip_hash_check: bool = False,
    replica_of: int | None = None,
) -> RestoreResult:
    """Create `data_dir` (which must not exist or be empty) from a snapshot.
    `shards`/`boundaries` choose the layout (default: the snapshot's).

    ``replica_of``: the data dir becomes a new replica of that cluster (a
    peer's snapshot): it keeps the cluster ID and the journal position the
    snapshot was taken at, where an ordinary restore starts a new cluster
    with no journal."""
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)):
        raise SnapshotError(f"data-dir {data_dir!r} exists")
    snap, records = open_snapshot(path, skip_hash_check=skip_hash_check)
    header = snap.header
    if boundaries is None:
        boundaries = default_boundaries(shards) if shards is not None else \
            [bytes.fromhex(b) for b in header.get("boundaries", [])]
    if shards is not None and shards != len(boundaries) + 1:
        raise SnapshotError(f"--shards {shards} needs {shards - 1} boundaries, got {len(boundaries)}")
    shard_map = ShardMap(list(boundaries))
    nshards = len(shard_map)

    parent = os.path.dirname(data_dir)
    os.makedirs(parent, exist_ok=True)
    work = os.path.join(parent, f".{os.path.basename(data_dir)}.restoring-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    try:
        be = backend_mod.open_backend("lmdb", os.path.join(work, "values"), nshards)
        try:
            batch: list[tuple[int, bytes, bytes]] = []
            pending = 0
            for rev, data in records:
                key = decode_record(data)[0]
                batch.append((shard_map.shard_of(key), rev.to_bytes(16, "big"), data))
                pending += len(data) + 32
                if pending >= RESTORE_BATCH_BYTES:
                    be.write(backend_mod.WriteBatch(puts=batch))
                    batch, pending = [], 0
            if batch:
                be.write(backend_mod.WriteBatch(puts=batch))
            cluster_id, member_id = (replica_of or new_id()), new_id()
            compact_rev = header["compact_revision"]
            checkpoint = {
                "revision": header["revision"],
                "compact_rev": compact_rev,
                "compact_done_rev": compact_rev,
                "journal_index": header.get("journal_index", 0) if replica_of else 0,
                "leases": [tuple(x) for x in header.get("leases", [])],
            }
            if replica_of:
                checkpoint["epoch"] = header.get("epoch", 0)
                checkpoint["leader_id"] = header.get("leader_id", 0)
            be.write(backend_mod.WriteBatch(meta={
                META_LAYOUT: json.dumps({"boundaries": [b.hex() for b in boundaries]}).encode(),
                META_IDENTITY: json.dumps({"cluster_id": cluster_id, "member_id": member_id, "term": 0,
                                           "name": name, "restored_from": {
                                               "cluster_id": header.get("cluster_id"),
                                               "member_id": header.get("member_id"),
                                               "revision": header["revision"]}}).encode(),
                META_CHECKPOINT: json.dumps(checkpoint).encode(),
            }))
        finally:
            be.close()
        if os.path.isdir(data_dir):
            os.rmdir(data_dir)  # empty (checked above)
        os.rename(work, data_dir)
        fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return RestoreResult(data_dir, header["revision"], header["compact_revision"], snap.records, snap.keys,
                         nshards, cluster_id, member_id)


def spool_snapshot(engine, directory: str) -> tuple[BinaryIO, SnapshotInfo]:
    """Write a snapshot to an unnamed temporary file in `directory` (nothing
    is left behind if the process dies) and return it rewound, with its info."""
    f = tempfile.TemporaryFile(dir=directory, buffering=1 << 20)
    try:
        info = write_snapshot(engine, f)
        f.flush()
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f, info


def iter_chunks(f: BinaryIO, size: int, chunk: int = SEND_CHUNK) -> Iterator[bytes]:
    left = size
    while left > 0:
        data = f.read(min(chunk, left))
        if not data:
            raise SnapshotError("snapshot spool file shrank")
        left -= len(data)
        yield data


__all__ = [
    "KvHash",
    "RestoreResult",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotInfo",
    "hash_all",
    "hash_kv",
    "iter_chunks",
    "open_snapshot",
    "restore",
    "save_snapshot",
    "spool_snapshot",
    "status",
    "write_snapshot",
]
