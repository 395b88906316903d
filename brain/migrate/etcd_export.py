"""Exporting brain's data as an etcd database (the way back to etcd).

The file holds exactly what a snapshot covers (brain.mvcc.kvhash.
covered_revisions): every revision above the compaction revision, and for
each key its newest revision at or below it, as etcd's own database holds
them after a compaction; plus the leases, the compaction revision, and as
consistent_index the journal index the snapshot's revision corresponds to
(a replica bootstrapping from the file resumes the journal after it).

etcd's key bucket is in revision order, brain's history in key order per
shard, so the export runs in two passes while physical compaction is
pinned (writes go on meanwhile; the export shows the committed state at its
start):
  1. walk the key indexes, a chunk of keys per hold of the engine lock,
     collecting the covered revisions (ints, no values), and sort them;
  2. read the records in revision order, a chunk per hold of the lock,
     and stream them into the database's key bucket.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from .etcddb import schema
from .etcddb.proto import KeyValue, Lease, encode_key_value
from .etcddb.writer import DbMeta, Member, write_etcd_db
from ..mvcc.kvhash import covered_revisions
from ..mvcc.revision import main_of, sub_of
from ..progress import Progress

KEYS_PER_HOLD = 4096  # keys walked per hold of the engine lock (pass 1)
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


def _begin(engine) -> dict:
    """On the committer thread: the committed state's coordinates."""
    with engine._lock:
        engine.pin_compaction()
        st = engine.store
        return {
            "revision": engine.committed_rev,
            "compact_revision": st.compact_rev,
            "leases": sorted((lease.id, lease.ttl) for lease in st.lessor.leases.values()),
            "journal_index": engine._applied_index,  # read with the revision, on the committer
        }


def _covered(engine, revision: int, compact_rev: int) -> tuple[list[int], int]:
    """Pass 1: every covered revision as (packed revision << 16 | shard),
    sorted; and the number of keys alive at `revision`."""
    nshards = len(engine.store.shards)
    if nshards >= 1 << _SHARD_BITS:
        raise ValueError(f"{nshards} shards: too many to export")
    out: list[int] = []
    live = 0
    for sid, shard in enumerate(engine.store.shards):
        cursor = None
        while True:
            with engine._lock:
                index = shard.index
                it = index.irange() if cursor is None else index.irange(cursor, inclusive=(False, True))
                n = 0
                last = None
                for key in it:
                    last = key
                    n += 1
                    revs = covered_revisions(index[key], compact_rev, revision)
                    if revs:
                        out.extend((r << _SHARD_BITS) | sid for r in revs)
                        ki = index[key]
                        if ki.get(revision) is not None:
                            live += 1
                    if n >= KEYS_PER_HOLD:
                        break
                else:
                    last = None
            if last is None:
                break
            cursor = last
    out.sort()
    return out, live


def _records(engine, covered: list[int], progress: Progress | None) -> Iterator[tuple[bytes, bytes]]:
    """Pass 2: (revision key, KeyValue bytes) in revision order."""
    shards = engine.store.shards
    mask = (1 << _SHARD_BITS) - 1
    done = 0
    nbytes = 0
    for start in range(0, len(covered), RECORDS_PER_HOLD):
        chunk = covered[start: start + RECORDS_PER_HOLD]
        with engine._lock:
            recs = [(x >> _SHARD_BITS, shards[x & mask].record(x >> _SHARD_BITS)) for x in chunk]
        for rev, (key, value, create, version, lease) in recs:
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


def write_etcd_snapshot(engine, f: BinaryIO, *, out=None, interval: float = 2.0) -> ExportInfo:
    """Write the committed state to `f` (seekable, empty) as an etcd
    database; the sha256 that a snapshot file appends is returned in the
    info, not written.  Progress lines go to `out` (default: none)."""
    begin = engine.on_committer(lambda: _begin(engine))
    info = ExportInfo(begin["revision"], begin["compact_revision"], begin["journal_index"])
    try:
        covered, info.keys = _covered(engine, info.revision, info.compact_revision)
        info.records = len(covered)
        progress = Progress("export", unit="revisions", total_items=len(covered), out=out,
                            interval=interval) if out is not None else None
        leases = [Lease(lid, ttl) for lid, ttl in begin["leases"]]
        info.leases = len(leases)
        meta = DbMeta(consistent_index=info.journal_index, term=engine.raft_term,
                      compact_revision=info.compact_revision,
                      members=[Member(engine.member_id, engine.config.name)])
        info.size = write_etcd_db(f, _records(engine, covered, progress), leases, meta)
    finally:
        engine.unpin_compaction()
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
