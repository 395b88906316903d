"""Importing etcd's data: an etcd database becomes a brain data directory
holding the same keyspace *and* history.

Every entry of etcd's key bucket becomes the brain record at the same
(main, sub) revision: a put keeps its value, create revision, version and
lease; a tombstone stays a tombstone.  The revision is the one etcd would
serve after opening the database (brain.migrate.etcddb.EtcdDb.current_revision),
the compaction revision the one below which etcd refuses reads, and an
unfinished etcd compaction is finished by brain when it opens the
directory.  Leases keep their IDs and granted TTLs (like etcd after a
restart, brain gives every lease its full TTL again when it starts serving).

brain keeps a create revision as (main, 0): etcd stores only the main part.

Auth comes along: users (with their bcrypt hashes), roles, whether auth is
on and the auth revision (auth_state).  What is not carried over, with a
warning: etcd's alarms (brain raises its own).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .etcddb import EtcdDb
from .etcddb import proto
from ..mvcc.auth import AuthState, Permission, Role, User
from ..mvcc.revision import pack
from ..progress import Progress
from .restore import BuiltDir, DataDirBuilder


@dataclass(frozen=True)
class ImportResult:
    source: str
    source_kind: str  # "data-dir", "snapshot" or "db"
    storage_version: str  # what wrote it: "3.6.0", or "3.5"/"3.4" guessed from the meta keys present
    data_dir: str
    revision: int
    compact_revision: int
    records: int
    keys: int  # alive at the revision
    leases: int
    shards: int
    cluster_id: int
    member_id: int
    consistent_index: int | None
    seconds: float
    warnings: list[str] = field(default_factory=list)


def _storage_version(db: EtcdDb) -> str:
    m = db.meta
    if m.storage_version:
        return m.storage_version
    return "3.5" if m.term is not None else "3.4"


def import_etcd(source: str, data_dir: str, *, boundaries: list[bytes], name: str = "default",
                replace: bool = False, skip_hash_check: bool = False, out=None,
                interval: float = 2.0, replica_of: int | None = None) -> ImportResult:
    """Build `data_dir` from the etcd data directory or snapshot `source`.
    Progress lines go to `out` (a callable taking a line; default stderr).

    `replica_of`: `source` is a snapshot of a replica of brain cluster
    `replica_of` (brain writes its journal index as etcd's consistent index
    and its epoch as etcd's term): the new directory joins that cluster at
    that journal position instead of starting a new cluster."""
    started = time.monotonic()
    hashing = Progress("import: checking sha256", unit=None, out=out, interval=interval)

    def hash_progress(done: int, total: int) -> None:
        hashing.total_bytes = total
        hashing.update(nbytes=done)

    with EtcdDb.open(source, skip_hash_check=skip_hash_check, progress=hash_progress) as db:
        warnings = _warnings(db)
        page_size = db.bolt.page_size
        progress = Progress("import", unit="revisions", total_bytes=db.pages_total() * page_size, out=out,
                            interval=interval)
        live: dict[bytes, bool] = {}
        with DataDirBuilder(data_dir, boundaries, replace=replace, name=name) as builder:
            n = 0
            for r in db.revisions():
                kv = r.kv
                if r.tombstone:
                    builder.add(pack(r.main, r.sub), (kv.key, None, 0, 0, 0))
                    live[kv.key] = False
                else:
                    builder.add(pack(r.main, r.sub), (kv.key, kv.value, pack(kv.create_revision), kv.version,
                                                      kv.lease))
                    live[kv.key] = True
                n += 1
                if not n & 1023:
                    progress.update(n, db.bolt.pages_read * page_size)
            progress.update(n, db.bolt.pages_read * page_size)
            leases = [(lease.id, lease.ttl) for lease in db.leases()]
            revision, compact = db.current_revision, db.compact_revision
            finished = db.meta.finished_compact
            built: BuiltDir = builder.commit(
                revision=revision, compact_rev=compact,
                compact_done_rev=finished if finished is not None else -1,
                leases=leases,
                auth=auth_state(db.auth()),
                cluster_id=replica_of,
                journal_index=(db.meta.consistent_index or 0) if replica_of else 0,
                epoch=(db.meta.term or 0) if replica_of else 0,
                origin={"etcd": os.path.abspath(source), "kind": db.kind, "revision": revision,
                        "consistent_index": db.meta.consistent_index, "term": db.meta.term,
                        "storage_version": _storage_version(db)})
        keys = sum(live.values())
        progress.bytes = progress.total_bytes or progress.bytes
        progress.done(f"revision {revision}, {keys:,} keys, {len(leases)} leases")
        return ImportResult(
            source=os.path.abspath(source), source_kind=db.kind, storage_version=_storage_version(db),
            data_dir=built.data_dir, revision=revision, compact_revision=compact, records=n, keys=keys,
            leases=len(leases), shards=built.shards, cluster_id=built.cluster_id, member_id=built.member_id,
            consistent_index=db.meta.consistent_index, seconds=time.monotonic() - started, warnings=warnings)


def auth_state(auth: proto.Auth) -> AuthState:
    """etcd's auth buckets as brain's auth state."""
    users = {u.name.decode(): User(u.name.decode(), u.password, tuple(sorted(r.decode() for r in u.roles)),
                                   u.no_password) for u in auth.users}
    roles = {r.name.decode(): Role(r.name.decode(), tuple(Permission(p.perm_type, p.key, p.range_end)
                                                          for p in r.permissions)) for r in auth.roles}
    return AuthState(auth.enabled, auth.revision, users, roles)


def _warnings(db: EtcdDb) -> list[str]:
    out = []
    alarms = db.alarms()
    if alarms:
        out.append(f"{alarms} etcd alarm(s) are not imported (brain raises its own)")
    return out
