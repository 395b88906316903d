"""Hashes of the store and snapshots: taking, checking, restoring.

Hashes (HashKV, Hash) walk the history shard by shard (which is key order),
key by key, the revisions `kvhash.covered_revisions` selects (everything up
to the revision asked for that compaction keeps), through the engine's
reader of history at a pinned revision (brain/engine/history.py): writes
go on meanwhile, and a compaction requested during the walk cannot drop
history it has not reached yet (the selection uses the compaction revision
read when the walk started).

A snapshot is an etcd database holding the same revisions (etcd_export.py),
followed, in a file, by its sha256: exactly what etcd's Maintenance Snapshot
sends and `etcdctl snapshot save` writes.  So `etcdctl snapshot status` and
`etcdutl snapshot restore` take brain's snapshots, and brain restores
etcd's (restoring one is importing it: etcd_import.py).  Files in brain's
earlier format (legacy_snapshot.py) are still read.

Restore builds a new data directory holding one checkpoint (no journal),
in the layout asked for (restore can reshard), with new cluster and member
IDs, as `etcdutl snapshot restore` gives a restored member a new identity.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..mvcc import errors
from ..mvcc.codec import decode_record, encode_record
from ..mvcc.kvhash import KvHasher, hashed
from ..mvcc.shard_map import DEFAULT_SHARDS, default_boundaries, layout_problem
from . import legacy_snapshot
from .etcddb import DigestMismatch, EtcdDb, EtcdDbError
from .etcd_export import ExportInfo, write_etcd_snapshot
from .etcd_import import import_etcd
from .legacy_snapshot import SnapshotDigestError, SnapshotError
from .restore import DataDirBuilder, RestoreError

SEND_CHUNK = 32 * 1024  # etcd's snapshotSendBufferSize


# ---------------------------------------------------------------------------
# hashing the history


def _hash_chunk(h: KvHasher, pinned, chunk, compact_rev: int) -> None:
    if not chunk.revisions:
        return
    records = pinned.read((chunk.shard, r) for r in chunk.revisions)
    entries = [(r, encode_record(rec)) for r, rec in zip(chunk.revisions, records)]
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
    with engine.history().pin() as pinned:
        current, compact_rev = pinned.revision, pinned.compact_revision
        if rev > 0 and rev < compact_rev:
            raise errors.ErrCompacted.fresh()
        if rev > 0 and rev > current:
            raise errors.ErrFutureRev.fresh()
        if rev == 0:
            rev = current
        h = KvHasher()
        if rev >= 0:
            for chunk in pinned.walk(rev):
                _hash_chunk(h, pinned, chunk, compact_rev)
    return KvHash(h.value, compact_rev, rev, current)


def hash_all(engine) -> tuple[int, int]:
    """etcd's Hash: one hash of the whole store state (all kept history, the
    compaction revision, the leases).  Returns (hash, revision)."""
    kv = hash_kv(engine, 0)
    leases = engine.history().leases()
    extra = json.dumps({"compact": kv.compact_revision, "revision": kv.hash_revision, "leases": leases})
    return zlib.crc32(extra.encode(), kv.hash) & 0xFFFFFFFF, kv.current_revision


# ---------------------------------------------------------------------------
# taking a snapshot

SnapshotInfo = ExportInfo


def write_snapshot(engine, f: BinaryIO, *, out=None) -> ExportInfo:
    """Write a snapshot of the committed state to `f` (seekable, empty), as
    an etcd database, except the trailing digest, which is returned in the
    info (etcd sends it as its own message; a file gets it appended).
    Writes may go on meanwhile."""
    return write_etcd_snapshot(engine, f, out=out)


def save_snapshot(engine, path: str, *, out=None) -> ExportInfo:
    """A snapshot file at `path` (with its digest), written atomically."""
    part = path + ".part"
    try:
        with open(part, "w+b") as f:
            info = write_snapshot(engine, f, out=out)
            f.seek(info.size)
            f.write(info.digest)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except BaseException:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise
    return info


def spool_snapshot(engine, directory: str, *, out=None) -> tuple[BinaryIO, ExportInfo]:
    """Write a snapshot to an unnamed temporary file in `directory` (nothing
    is left behind if the process dies) and return it rewound, with its info."""
    f = tempfile.TemporaryFile(dir=directory, buffering=1 << 20)
    try:
        info = write_snapshot(engine, f, out=out)
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


# ---------------------------------------------------------------------------
# reading a snapshot


@dataclass(frozen=True)
class SnapshotStatus:
    """What `brain snapshot status` prints.  For an etcd-format file, hash,
    revision, total_keys, total_size and version are exactly what etcdutl
    3.6's `snapshot status` prints (etcd 3.4's etcdctl counts every bucket
    entry as total keys); for brain's earlier format, the hash is the
    source's HashKV at the revision."""

    format: str  # "etcd" or "brain-1"
    hash: int
    revision: int
    total_keys: int
    total_size: int
    version: str
    compact_revision: int
    revisions: int
    leases: int


def status(path: str) -> SnapshotStatus:
    """Read a whole snapshot, checking its digest and structure."""
    if legacy_snapshot.is_legacy(path):
        snap, it = legacy_snapshot.open_snapshot(path)
        for _ in it:
            pass
        h = snap.header
        return SnapshotStatus("brain-1", snap.hash, h["revision"], snap.keys, snap.size, h.get("storage_version", ""),
                              h["compact_revision"], snap.records, len(h.get("leases", [])))
    try:
        with EtcdDb.open(path) as db:
            st = db.status()
            return SnapshotStatus("etcd", st.hash, db.current_revision, st.total_keys, st.total_size, st.version,
                                  db.compact_revision, sum(1 for _ in db.revisions()), len(db.leases()))
    except DigestMismatch as e:
        raise SnapshotDigestError(str(e)) from None
    except EtcdDbError as e:
        raise SnapshotError(str(e)) from None


# ---------------------------------------------------------------------------
# restoring


@dataclass(frozen=True)
class RestoreResult:
    data_dir: str
    revision: int
    compact_revision: int
    records: int
    keys: int
    shards: int
    cluster_id: int
    member_id: int
    format: str


def restore(
    path: str,
    data_dir: str,
    *,
    name: str = "default",
    shards: int | None = None,
    boundaries: list[bytes] | None = None,
    skip_hash_check: bool = False,
    replace: bool = False,
    out=None,
    replica_of: int | None = None,
) -> RestoreResult:
    """Create `data_dir` (which must not exist or be empty, unless
    `replace`) from a snapshot.  `shards`/`boundaries` choose the layout
    (default: a brain-1 snapshot's own, else the default layout).

    ``replica_of``: the data dir becomes a new replica of that cluster (a
    peer's snapshot): it keeps the cluster ID and the journal position the
    snapshot was taken at (its consistent index), where an ordinary restore
    starts a new cluster with no journal."""
    try:
        if legacy_snapshot.is_legacy(path):
            if replica_of:
                raise SnapshotError(f"{path}: a snapshot in brain's earlier format cannot start a replica")
            return _restore_legacy(path, data_dir, name=name, shards=shards, boundaries=boundaries,
                                   skip_hash_check=skip_hash_check, replace=replace)
        if boundaries is None:
            boundaries = default_boundaries(shards if shards is not None else DEFAULT_SHARDS)
        _check_layout(shards, boundaries)
        res = import_etcd(path, data_dir, boundaries=boundaries, name=name, replace=replace,
                          skip_hash_check=skip_hash_check, out=out, replica_of=replica_of)
    except DigestMismatch as e:
        raise SnapshotDigestError(str(e)) from None
    except (EtcdDbError, RestoreError) as e:
        raise SnapshotError(str(e)) from None
    return RestoreResult(res.data_dir, res.revision, res.compact_revision, res.records, res.keys, res.shards,
                         res.cluster_id, res.member_id, "etcd")


def _check_layout(shards: int | None, boundaries: list[bytes]) -> None:
    problem = layout_problem(shards, boundaries)
    if problem is not None:
        raise SnapshotError(problem)


def _restore_legacy(path, data_dir, *, name, shards, boundaries, skip_hash_check, replace) -> RestoreResult:
    snap, records = legacy_snapshot.open_snapshot(path, skip_hash_check=skip_hash_check)
    header = snap.header
    if boundaries is None:
        boundaries = default_boundaries(shards) if shards is not None else \
            [bytes.fromhex(b) for b in header.get("boundaries", [])]
    _check_layout(shards, boundaries)
    with DataDirBuilder(data_dir, boundaries, replace=replace, name=name) as builder:
        for rev, data in records:
            builder.add_encoded(rev, decode_record(data)[0], data)
        compact_rev = header["compact_revision"]
        built = builder.commit(
            revision=header["revision"], compact_rev=compact_rev,
            leases=[tuple(x) for x in header.get("leases", [])],
            origin={"cluster_id": header.get("cluster_id"), "member_id": header.get("member_id"),
                    "revision": header["revision"]})
    return RestoreResult(built.data_dir, header["revision"], compact_rev, snap.records, snap.keys, built.shards,
                         built.cluster_id, built.member_id, "brain-1")


__all__ = [
    "KvHash",
    "RestoreResult",
    "SnapshotError",
    "SnapshotInfo",
    "SnapshotStatus",
    "hash_all",
    "hash_kv",
    "iter_chunks",
    "restore",
    "save_snapshot",
    "spool_snapshot",
    "status",
    "write_snapshot",
]
