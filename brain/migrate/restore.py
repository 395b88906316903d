"""Building a fresh data directory from a stream of records: what restoring
a snapshot and importing etcd's data have in common.

The result is a data directory holding one checkpoint and no journal: every
record is in the value store under the shard its key falls in, and the
checkpoint meta names the revision, the compaction revision (with how far
physical compaction got, so a newer compaction is resumed when the engine
opens it), the leases, the layout and a new cluster and member identity
(as `etcdutl snapshot restore` gives a restored member a new one).

Nothing is visible at the destination until the end.  A destination that
does not exist yet is built beside (`.<name>.building-<pid>`) and renamed
into place.  One that exists (empty, a filesystem's root with lost+found,
or brain data the caller asked to replace) is built in a hidden
`.brain-building-<pid>` inside it, so the final moves stay on one
filesystem; the swap then marks the directory incomplete
(`.brain-incomplete`, which `brain serve` refuses), moves brain's old
entries aside, moves the new ones in and drops the mark.  The old
directory's lock is held throughout, so a running server is never replaced
under its feet, and a crash midway leaves a directory that says so instead
of one that looks empty or half old.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass

from .. import backend as backend_mod
from ..engine import datadir
from ..engine.checkpoint_meta import CheckpointMeta
from ..engine.ids import new_id
from ..mvcc.codec import Record, encode_record
from ..mvcc.shard_map import ShardMap

BATCH_BYTES = 32 << 20  # records per value-store transaction


class RestoreError(Exception):
    """The destination cannot be built (the message says why)."""


@dataclass(frozen=True)
class BuiltDir:
    data_dir: str
    cluster_id: int
    member_id: int
    records: int
    bytes: int
    shards: int


def check_destination(data_dir: str, replace: bool) -> datadir.DirContents:
    """Raise RestoreError unless a new data directory may go to `data_dir`."""
    c = datadir.inspect(data_dir)
    if c.kind == datadir.ETCD:
        raise RestoreError(f"data-dir {c.path} is an etcd data directory: brain does not write into it "
                           f"(choose a new directory)")
    if c.kind == datadir.FOREIGN:
        raise RestoreError(datadir.foreign_message(c).replace(" or an existing brain data directory", ""))
    if c.kind == datadir.NOT_A_DIR:
        raise RestoreError(f"data-dir {c.path} is a file, not a directory")
    if c.kind in (datadir.BRAIN, datadir.INCOMPLETE) and not replace:
        what = "holds brain data" if c.kind == datadir.BRAIN else "holds an interrupted import or restore"
        raise RestoreError(f"data-dir {c.path} exists and {what}; pass --replace to replace it "
                           f"(its current contents are deleted once the new directory is complete)")
    return c


class DataDirBuilder:
    """Collects records, then `commit` moves a complete data directory into
    place.  Use as a context manager: leaving it without commit removes the
    work directory."""

    def __init__(self, data_dir: str, boundaries: list[bytes], *, replace: bool = False,
                 name: str = "default") -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.replace = replace
        self.name = name
        self.boundaries = list(boundaries)
        self.shard_map = ShardMap(self.boundaries)
        c = check_destination(self.data_dir, replace)
        self.parent = os.path.dirname(self.data_dir)
        self.inside = c.kind != datadir.MISSING
        if self.inside:
            for n in os.listdir(self.data_dir):  # left by an interrupted build
                if n.startswith(datadir.WORK_PREFIXES):
                    shutil.rmtree(os.path.join(self.data_dir, n), ignore_errors=True)
            self.work = os.path.join(self.data_dir, f"{datadir.WORK_PREFIXES[0]}{os.getpid()}")
        else:
            os.makedirs(self.parent, exist_ok=True)
            self.work = os.path.join(self.parent, f".{os.path.basename(self.data_dir)}.building-{os.getpid()}")
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work, mode=0o700)
        try:
            self.backend = backend_mod.open_backend("lmdb", os.path.join(self.work, datadir.VALUES_DIR),
                                                    len(self.shard_map))
        except BaseException:
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        self._batch: list[tuple[int, bytes, bytes]] = []
        self._pending = 0
        self.records = 0
        self.bytes = 0
        self._done = False

    def __enter__(self) -> "DataDirBuilder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    # -- records --------------------------------------------------------------

    def add(self, rev: int, record: Record) -> None:
        """Store `record` (brain.mvcc.codec's tuple) at packed revision `rev`."""
        self.add_encoded(rev, record[0], encode_record(record))

    def add_encoded(self, rev: int, key: bytes, data: bytes) -> None:
        self._batch.append((self.shard_map.shard_of(key), rev.to_bytes(16, "big"), data))
        self._pending += len(data) + 32
        self.records += 1
        self.bytes += len(data)
        if self._pending >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._batch:
            self.backend.write(backend_mod.WriteBatch(puts=self._batch))
            self._batch, self._pending = [], 0

    # -- finishing ------------------------------------------------------------

    def commit(self, *, revision: int, compact_rev: int, compact_done_rev: int | None = None,
               leases: list[tuple[int, int]] = (), origin: dict | None = None, journal_index: int = 0,
               cluster_id: int | None = None, epoch: int = 0, auth=None) -> BuiltDir:
        """Write the checkpoint meta and move the directory into place.
        `compact_done_rev` (default `compact_rev`) below `compact_rev` makes
        the engine finish that compaction when it opens the directory.  A
        new replica of an existing cluster keeps its `cluster_id` and the
        `journal_index` (and `epoch`) the records correspond to; anything
        else is a new cluster (new IDs) with no journal.  `auth`: the users,
        roles and auth on/off to start with (a brain.mvcc.auth.AuthState)."""
        try:
            self._flush()
            cluster_id, member_id = cluster_id or new_id(), new_id()
            checkpoint = CheckpointMeta(
                revision=revision, journal_index=journal_index,
                compact_revision=None if compact_rev < 0 else compact_rev,
                compaction_finished=compact_done_rev is None or compact_done_rev >= compact_rev,
                leases=tuple(tuple(x) for x in sorted(leases)), epoch=epoch, auth=auth)
            identity = datadir.Identity(cluster_id, member_id, 0, self.name, origin or None)
            self.backend.write(backend_mod.WriteBatch(meta={
                **datadir.meta_entries(identity, list(self.boundaries)),
                **checkpoint.write_entry(),
            }))
            self.backend.close()
            self._move_into_place()
        except BaseException:
            self.abort()
            raise
        self._done = True
        return BuiltDir(self.data_dir, cluster_id, member_id, self.records, self.bytes, len(self.shard_map))

    def _move_into_place(self) -> None:
        c = check_destination(self.data_dir, self.replace)  # again: it may have changed meanwhile
        if not self.inside:
            if c.kind != datadir.MISSING:
                raise RestoreError(f"data-dir {self.data_dir} appeared while it was being built")
            os.rename(self.work, self.data_dir)
            _fsync_dir(self.parent)
            return
        lock_fd = os.open(os.path.join(self.data_dir, datadir.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RestoreError(f"data-dir {self.data_dir} is in use by a running brain; "
                                   f"stop it before replacing its data") from None
            marker = os.path.join(self.data_dir, datadir.INCOMPLETE_MARKER)
            with open(marker, "w") as f:
                f.write("a restore or import into this directory did not finish; run it again with --replace\n")
            _fsync_dir(self.data_dir)
            old = os.path.join(self.data_dir, f"{datadir.WORK_PREFIXES[1]}{os.getpid()}")
            os.makedirs(old, exist_ok=True)
            for n in datadir.BRAIN_ENTRIES:
                if n != datadir.LOCK_FILE and os.path.lexists(os.path.join(self.data_dir, n)):
                    os.rename(os.path.join(self.data_dir, n), os.path.join(old, n))
            for n in os.listdir(self.work):
                os.rename(os.path.join(self.work, n), os.path.join(self.data_dir, n))
            _fsync_dir(self.data_dir)
            os.unlink(marker)
            _fsync_dir(self.data_dir)
        finally:
            os.close(lock_fd)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.backend.close()
        except Exception:  # noqa: BLE001 - already failing
            pass
        shutil.rmtree(self.work, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
