"""Exporting brain's data as an etcd database (the way back to etcd).

The file holds exactly what a snapshot covers (brain.mvcc.kvhash.
covered_revisions): every revision above the compaction revision, and for
each key its newest revision at or below it, as etcd's own database holds
them after a compaction; plus the leases, the auth buckets (users, roles,
on or off, the auth revision), the compaction revision, and as
consistent_index the journal index the snapshot's revision corresponds to
(a replica bootstrapping from the file resumes the journal after it).

etcd's key bucket is in revision order, brain's history in key order per
shard, so the export runs in two passes over the engine's history pinned at the
committed state (brain/engine/history.py; writes go on meanwhile, the
export shows the committed state at its start):
  1. walk the key indexes, a chunk of keys per hold of the engine lock,
     collecting the covered revisions (ints, no values), and sort them;
  2. read the records in revision order, a chunk per hold of the lock,
     and stream them into the database's key bucket.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..engine.history import PinnedHistory
from ..mvcc.auth import AuthState
from ..mvcc.revision import main_of, sub_of
from ..progress import Progress
from .etcddb import proto, schema
from .etcddb.proto import KeyValue, Lease, encode_key_value
from .etcddb.writer import DbMeta, Member, write_etcd_db

KEYS_PER_HOLD = 4096  # keys walked per hold of the engine lock in pass 1 (at most history.REVISIONS_PER_HOLD revisions)
RECORDS_PER_HOLD = 2048  # records read per hold (pass 2)
_SHARD_BITS = 16


@dataclass
class ExportInfo:
    revision: int
    compact_revision: int
    journal_index: int
    records: int = 0
    keys: int = 0
    leases: int = 0
    size: int = 0  # database bytes (a multiple of the page size)
    digest: bytes = b""  # sha256 of those bytes


def _covered(pinned: PinnedHistory) -> tuple[list[int], int]:
    """Pass 1: every covered revision as (packed revision << 16 | shard),
    sorted; and the number of keys alive at the pinned revision."""
    if pinned.shards >= 1 << _SHARD_BITS:
        raise ValueError(f"{pinned.shards} shards: too many to export")
    out: list[int] = []
    live = 0
    for chunk in pinned.walk(keys_per_hold=KEYS_PER_HOLD):
        sid = chunk.shard
        out.extend((r << _SHARD_BITS) | sid for r in chunk.revisions)
        live += chunk.alive
    out.sort()
    return out, live


def _records(pinned: PinnedHistory, covered: list[int], progress: Progress | None) -> Iterator[tuple[bytes, bytes]]:
    """Pass 2: (revision key, KeyValue bytes) in revision order."""
    mask = (1 << _SHARD_BITS) - 1
    done = 0
    nbytes = 0
    for start in range(0, len(covered), RECORDS_PER_HOLD):
        chunk = covered[start: start + RECORDS_PER_HOLD]
        revs = [x >> _SHARD_BITS for x in chunk]
        recs = pinned.read((x & mask, rev) for x, rev in zip(chunk, revs))
        for rev, (key, value, create, version, lease) in zip(revs, recs):
            main = main_of(rev)
            if value is None:
                k, v = schema.rev_key(main, sub_of(rev), True), encode_key_value(KeyValue(key))
            else:
                k = schema.rev_key(main, sub_of(rev))
                v = encode_key_value(KeyValue(key, main_of(create), main, version, value, lease))
            nbytes += len(k) + len(v)
            yield k, v
        done += len(chunk)
        if progress is not None:
            progress.update(done, nbytes)


def _pin_committed(engine) -> tuple[PinnedHistory, list[tuple[int, int]], AuthState]:
    """The pinned history, its leases and auth state, taken on the
    committer thread, where the store holds exactly the committed state
    (the leases of a batch that is not durable yet are not in it)."""
    history = engine.history()

    def pin():
        leases = history.leases()
        return history.pin(), leases, engine.store.auth

    return engine.on_committer(pin)


def etcd_auth(state: AuthState) -> proto.Auth:
    """brain's auth state as etcd's auth buckets hold it."""
    users = tuple(proto.User(u.name.encode(), u.password, tuple(r.encode() for r in u.roles), u.no_password)
                  for u in state.users.values())
    roles = tuple(proto.Role(r.name.encode(), tuple(proto.Permission(p.perm_type, p.key, p.range_end)
                                                    for p in r.perms)) for r in state.roles.values())
    return proto.Auth(state.enabled, state.revision, users, roles)


def write_etcd_snapshot(engine, f: BinaryIO, *, out=None, interval: float = 2.0) -> ExportInfo:
    """Write the committed state to `f` (seekable, empty) as an etcd
    database; the sha256 that a snapshot file appends is returned in the
    info, not written.  Progress lines go to `out` (default: none)."""
    pinned, leases, auth = _pin_committed(engine)
    with pinned:
        info = ExportInfo(pinned.revision, pinned.compact_revision, pinned.journal_index)
        covered, info.keys = _covered(pinned)
        info.records = len(covered)
        progress = Progress("export", unit="revisions", total_items=len(covered), out=out,
                            interval=interval) if out is not None else None
        info.leases = len(leases)
        meta = DbMeta(consistent_index=info.journal_index, term=engine.term,
                      compact_revision=info.compact_revision,
                      members=[Member(engine.member_id, engine.config.name)])
        info.size = write_etcd_db(f, _records(pinned, covered, progress), [Lease(lid, ttl) for lid, ttl in leases],
                                  meta, etcd_auth(auth))
    f.flush()
    f.seek(0)
    sha = hashlib.sha256()
    left = info.size
    while left > 0:
        buf = f.read(min(left, 4 << 20))
        if not buf:
            raise OSError("snapshot file shrank while being hashed")
        sha.update(buf)
        left -= len(buf)
    info.digest = sha.digest()
    if progress is not None:
        progress.done(f"revision {info.revision}, {info.keys:,} keys, {info.leases} leases")
    return info
