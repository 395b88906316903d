"""The production backend: one LMDB environment.

Layout: an environment directory (``data.mdb`` + ``lock.mdb``) holding the
named databases ``shard-0000`` .. ``shard-NNNN`` and ``meta``.  The shard
count is recorded in ``meta`` under :data:`SHARDS_META_KEY` when the store is
created and checked on every open.

The environment is opened with ``sync`` and ``metasync`` on, so a commit
returns only once its pages and meta page are fsync'ed: writes are rare,
large batches and must be durable on return.  ``readahead`` is off (random
reads of a store larger than RAM), ``writemap`` is off (a stray write cannot
corrupt the map) and locking is on: many reader threads, one writer.

A full filesystem must be an error, never a signal.  ``data.mdb`` is only
read through its mapping (``writemap`` off: pages are written with
``pwrite``, which reports ENOSPC); but lmdb sizes ``lock.mdb`` with
``ftruncate`` and writes it through a shared writable mapping (its header
when the environment opens, a reader slot per read transaction), and a page
of it the filesystem cannot back is a SIGBUS.  So every page of
``lock.mdb`` is allocated (``posix_fallocate``) before lmdb opens it and
again once lmdb has sized it: a full disk fails the open with
:class:`BackendFullError` instead.  lmdb reports a commit whose ``pwrite``
was cut short by a full disk as EIO (it cannot tell why); an EIO while the
filesystem has less than :data:`_NEARLY_FULL` bytes free is taken for a
full disk.  A store whose creation fails is removed again, so the next
open starts afresh instead of finding half a meta page.

A commit whose meta page could not be written (lmdb writes it last, after
the data pages are synced) leaves lmdb in MDB_PANIC: every transaction
after it, reads included, fails until the environment is opened again.
The previous commit is intact on disk (the failed one's meta page never
landed, or lmdb wrote the old transaction ID back over it), so
:meth:`LmdbBackend.recover` closes and reopens the environment.  Closing
it under a reader would unmap the pages that reader is in, so a reopen
needs every other call out: record reads (``get``, ``get_many``) run under
the engine's lock, which whoever reopens holds (a reader that meets the
panic reopens itself and reads again); writes, statistics, ``get_meta``
and the start of a scan are kept out here, and an unfinished scan makes a
reopen wait for a later try.

Read-path idioms (measured with py-lmdb 3.0 on 100k 300-byte records):

* one unmanaged read transaction per call, ``env.begin(db=...).get(key)``,
  with ``max_spare_txns=1`` so the C extension recycles the transaction
  handle (~0.4 us per ``get`` versus ~1.2 us with a ``with`` block and no
  spare);
* ``get_many`` maps ``txn.get`` over the keys: ~0.27 us per key for 1000
  random keys, whereas ``Cursor.getmulti`` (~0.37 us) omits missing keys,
  so it needs a dict to realign results and ends up ~0.45 us;
* ``buffers=False``: callers keep the values, so they must be copied anyway.

Write path: puts are grouped per shard, stably sorted by key (nearly free
for the revision-ordered batches the MVCC core produces) and inserted with
``Cursor.putmulti``; when a group is strictly increasing and lies entirely
after the shard's current last key, ``append=True`` skips the B-tree search
and packs leaf pages fully.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
import time
from itertools import islice
from operator import itemgetter, lt
from typing import Iterator, Sequence

import lmdb

from .protocol import (
    MAX_KEY_SIZE,
    SHARDS_META_KEY,
    BackendClosedError,
    BackendError,
    BackendFullError,
    BackendStatistics,
    ShardCountMismatchError,
    WriteBatch,
)

__all__ = ["DEFAULT_MAP_SIZE", "LmdbBackend"]

log = logging.getLogger("brain.backend")

#: Default map size: 1 TiB of address space.  The file is not pre-allocated
#: (it grows as pages are used), so this costs nothing but virtual memory.
DEFAULT_MAP_SIZE = 1 << 40

_META_DB = b"meta"
_EXTRA_DBS = 4  # meta + headroom
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DATA_FILE = "data.mdb"
_LOCK_FILE = "lock.mdb"
_LOCK_HEADER_BYTES = 4096  # lmdb's lock header (192 bytes on Linux x86-64) and the first reader slots
_NEARLY_FULL = 1 << 20
_MADV_DONTNEED = 4  # Linux


def _madvise_dontneed(addr: int, length: int) -> None:
    """madvise(MADV_DONTNEED) on a mapping of ours; errors ignored (best effort)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(addr, length, _MADV_DONTNEED)
    except (OSError, AttributeError):
        pass
_first = itemgetter(0)


def _shard_db_name(shard: int) -> bytes:
    return b"shard-%04d" % shard


def _is_full(exc: BaseException, path: str) -> bool:
    """Whether ``exc``, raised by lmdb on the store at ``path``, means no space."""
    if isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    code = getattr(exc, "code", None) if isinstance(exc, lmdb.Error) else None
    if code in _FULL_ERRNOS:
        return True
    return code == errno.EIO and _free_bytes(path) < _NEARLY_FULL


def _free_bytes(path: str) -> int:
    """Bytes free for us on the filesystem holding ``path`` (huge if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _back_lock_file(path: str, new_size: int) -> None:
    """Allocate every page of lmdb's lock file (see the module docstring);
    an empty or missing one gets ``new_size`` bytes.  The length of one
    lmdb sized is kept: another process may have it mapped.  OSError on
    failure."""
    fd = os.open(os.path.join(path, _LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size or new_size
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def _remove_new_store(path: str) -> None:
    """Remove the files of a store whose creation failed."""
    for name in (_DATA_FILE, _LOCK_FILE):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass


def _strictly_increasing(items: list[tuple[bytes, bytes]]) -> bool:
    keys = map(_first, items)
    following = map(_first, islice(items, 1, None))
    return all(map(lt, keys, following))


class LmdbBackend:
    """:class:`~brain.backend.Backend` over one LMDB environment directory.

    ``path`` is created (mode 0700) if missing.  Opening an existing store
    with another ``shards`` raises :class:`ShardCountMismatchError`; opening
    one that is already open in this process raises ``lmdb.Error``.
    ``map_size`` caps the data file; a write that would exceed it raises
    :class:`BackendFullError`.  It is never grown automatically.
    ``max_readers`` bounds concurrent read transactions, unfinished scans
    included; beyond it reads raise ``lmdb.ReadersFullError``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        shards: int,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_readers: int = 512,
    ) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.shards = shards
        self.path = os.fspath(path)
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        data = os.path.join(self.path, _DATA_FILE)
        new = not os.path.exists(data) or os.path.getsize(data) == 0
        try:
            self._open(map_size, max_readers)
        except BaseException as exc:
            if new:
                _remove_new_store(self.path)
            if isinstance(exc, (lmdb.Error, OSError)) and _is_full(exc, self.path):
                raise BackendFullError(
                    f"{self.path}: no space left to {'create' if new else 'open'} the value store: {exc}"
                ) from exc
            raise
        self._begin = self._env.begin
        self._closed = False
        self._write_lock = threading.Lock()
        # Held while the environment is replaced, and by the calls that are
        # not kept out by the engine's lock (get_meta, a scan's start and end).
        self._env_lock = threading.RLock()  # a scan collected while it is held ends under it
        self._scans = 0  # scans begun and not finished: no reopen meanwhile
        self._panicked = False  # lmdb said MDB_PANIC: reopen before use
        self._writes = 0
        self._last_write_seconds = 0.0
        self._last_write_time: float | None = None

    def _open(self, map_size: int, max_readers: int) -> None:
        # lmdb writes a new lock file's header while it opens it; it sizes
        # the file for its reader slots (a larger one keeps its size).
        self._map_size, self._max_readers = map_size, max_readers
        _back_lock_file(self.path, _LOCK_HEADER_BYTES)
        self._env = lmdb.open(
            self.path,
            map_size=map_size,
            subdir=True,
            mode=0o600,
            create=True,
            sync=True,
            metasync=True,
            map_async=False,
            writemap=False,
            readahead=False,
            meminit=False,
            lock=True,
            max_readers=max_readers,
            max_dbs=self.shards + _EXTRA_DBS,
            max_spare_txns=1,
        )
        try:
            _back_lock_file(self.path, 0)  # the reader slots lmdb sized it for
            self._meta_db, self._dbs = self._open_tables(self.shards)
        except BaseException:
            self._env.close()
            raise

    def _open_tables(self, shards: int) -> tuple[object, dict[int, object]]:
        """The meta and shard tables (made in a new store).  Opening those
        of an existing store changes nothing, so lmdb commits it without a
        write: a reopen on a disk that still fails opens."""
        env = self._env
        with env.begin(write=True) as txn:
            meta_db = env.open_db(_META_DB, txn=txn)
            recorded = txn.get(SHARDS_META_KEY, db=meta_db)
            if recorded is not None and recorded != b"%d" % shards:
                raise ShardCountMismatchError(
                    f"{self.path}: store has {recorded.decode(errors='replace')} shards, "
                    f"opened with shards={shards}"
                )
            dbs = {i: env.open_db(_shard_db_name(i), txn=txn) for i in range(shards)}
            if recorded is None:
                txn.put(SHARDS_META_KEY, b"%d" % shards, db=meta_db)
        return meta_db, dbs

    def __repr__(self) -> str:
        return f"LmdbBackend({self.path!r}, shards={self.shards})"

    def __enter__(self) -> LmdbBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------

    def _shard_error(self, shard: object) -> Exception:
        if self._closed:
            return BackendClosedError("backend is closed")
        return ValueError(f"shard {shard!r} not in range({self.shards})")

    def _lmdb_error(self, exc: lmdb.Error) -> Exception:
        """Translate an LMDB error raised by a read (closed env or bug)."""
        if self._closed:
            return BackendClosedError("backend is closed")
        return exc

    # -- reads ---------------------------------------------------------------

    def get(self, shard: int, key: bytes) -> bytes | None:
        """See :meth:`brain.backend.Backend.get`."""
        try:
            return self._begin(db=self._dbs[shard]).get(key)
        except KeyError:
            raise self._shard_error(shard) from None
        except lmdb.BadValsizeError:
            return None  # empty key: cannot exist
        except lmdb.Error as exc:
            if self._reopened_for(exc):
                return self.get(shard, key)
            raise self._lmdb_error(exc) from exc

    def get_many(self, shard: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """See :meth:`brain.backend.Backend.get_many`."""
        try:
            txn = self._begin(db=self._dbs[shard])
        except KeyError:
            raise self._shard_error(shard) from None
        except lmdb.Error as exc:
            if self._reopened_for(exc):
                return self.get_many(shard, keys)
            raise self._lmdb_error(exc) from exc
        try:
            try:
                return list(map(txn.get, keys))
            except lmdb.BadValsizeError:
                return [txn.get(key) if key else None for key in keys]
        except lmdb.Error as exc:
            raise self._lmdb_error(exc) from exc

    def _reopened_for(self, exc: lmdb.Error) -> bool:
        """A record read met MDB_PANIC (a commit failed since): reopen, so
        the read can be made again.  The caller holds the engine's lock."""
        if not isinstance(exc, lmdb.PanicError) or self._closed:
            return False
        self._panicked = True
        return self.recover()

    def scan(
        self, shard: int, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """See :meth:`brain.backend.Backend.scan`."""
        if not isinstance(start, (bytes, bytearray, memoryview)):
            raise TypeError(f"start must be bytes, not {type(start).__name__}")
        start = bytes(start)
        if end is not None:
            if not isinstance(end, (bytes, bytearray, memoryview)):
                raise TypeError(f"end must be bytes, not {type(end).__name__}")
            end = bytes(end)
        with self._env_lock:
            try:
                txn = self._begin(db=self._dbs[shard])  # the snapshot starts now
            except KeyError:
                raise self._shard_error(shard) from None
            except lmdb.Error as exc:
                raise self._lmdb_error(exc) from exc
            self._scans += 1
        iterator = self._iterate(txn, start, end)
        next(iterator)  # started: its end (exhausted, closed or collected) counts it out
        return iterator

    def _iterate(
        self, txn: lmdb.Transaction, start: bytes, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        try:
            yield None  # primed by scan()
            if end is not None and end <= start:
                return
            cursor = txn.cursor()
            if not start:
                found = cursor.first()
            else:
                # LMDB rejects over-long keys; position at the longest valid
                # prefix and skip the keys that sort below ``start``.
                found = cursor.set_range(start[:MAX_KEY_SIZE])
                while found and cursor.key() < start:
                    found = cursor.next()
            if not found:
                return
            items = cursor.iternext()
            if end is None:
                yield from items
            else:
                for item in items:
                    if item[0] >= end:
                        return
                    yield item
        except lmdb.Error as exc:
            raise self._lmdb_error(exc) from exc
        finally:
            with self._env_lock:
                self._scans -= 1
                if not self._closed:
                    try:
                        txn.abort()
                    except lmdb.Error:
                        pass  # the environment closed under us

    def get_meta(self, key: bytes) -> bytes | None:
        """See :meth:`brain.backend.Backend.get_meta`."""
        with self._env_lock:
            if self._closed:
                raise BackendClosedError("backend is closed")
            try:
                return self._begin(db=self._meta_db).get(key)
            except lmdb.BadValsizeError:
                return None
            except lmdb.Error as exc:
                raise self._lmdb_error(exc) from exc

    # -- writes --------------------------------------------------------------

    def write(self, batch: WriteBatch) -> None:
        """See :meth:`brain.backend.Backend.write`."""
        started = time.perf_counter()
        with self._write_lock:
            if self._closed:
                raise BackendClosedError("backend is closed")
            if not (batch.puts or batch.deletes or batch.meta):
                return
            dbs = self._dbs

            # Everything that can be checked without LMDB is checked before
            # the transaction starts; LMDB itself rejects bad key sizes.
            groups: dict[int, list[tuple[bytes, bytes]]] = {}
            for shard, key, value in batch.puts:
                if value is None:
                    raise TypeError(f"value for key {key!r} is None")
                try:
                    groups[shard].append((key, value))
                except KeyError:
                    if shard not in dbs:
                        raise self._shard_error(shard) from None
                    groups[shard] = [(key, value)]
            for shard in {shard for shard, _ in batch.deletes}:
                if shard not in dbs:
                    raise self._shard_error(shard)
            for key, value in batch.meta.items():
                if key == SHARDS_META_KEY:
                    raise ValueError(f"meta key {SHARDS_META_KEY!r} is reserved")
                if value is None:
                    raise TypeError(f"meta value for key {key!r} is None")
            for items in groups.values():
                items.sort(key=_first)

            try:
                with self._begin(write=True) as txn:
                    delete = txn.delete
                    for shard, key in batch.deletes:
                        if not delete(key, db=dbs[shard]) and len(key) > MAX_KEY_SIZE:
                            raise ValueError(f"key must be 1..{MAX_KEY_SIZE} bytes, got {len(key)}")
                    for shard, items in groups.items():
                        cursor = txn.cursor(dbs[shard])
                        append = (
                            not cursor.last() or cursor.key() < items[0][0]
                        ) and _strictly_increasing(items)
                        cursor.putmulti(items, overwrite=True, append=append)
                    if batch.meta:
                        cursor = txn.cursor(self._meta_db)
                        cursor.putmulti(batch.meta.items(), overwrite=True)
            except lmdb.BadValsizeError as exc:
                raise ValueError(f"invalid key (must be 1..{MAX_KEY_SIZE} bytes): {exc}") from exc
            except (lmdb.Error, OSError) as exc:
                if isinstance(exc, lmdb.PanicError) or self._env_panicked():
                    self._panicked = True
                if _is_full(exc, self.path):
                    raise BackendFullError(f"{self.path}: no space left: {exc}") from exc
                if self._panicked:
                    raise BackendError(f"{self.path}: a commit failed and lmdb must be reopened: {exc}") from exc
                raise

            self._writes += 1
            self._last_write_time = time.time()
            self._last_write_seconds = time.perf_counter() - started

    def _env_panicked(self) -> bool:
        """Whether the failed write left lmdb in MDB_PANIC (its meta page
        was not written).  Called with the write lock held."""
        try:
            self._begin(write=True).abort()
        except lmdb.PanicError:
            return True
        except lmdb.Error:
            pass
        return False

    def recover(self) -> bool:
        """See :meth:`brain.backend.Backend.recover`: after MDB_PANIC, close
        and reopen the environment (the module docstring says why it is
        safe and who keeps the readers out).  False when there was nothing
        to do, or a scan is still open (a later call reopens)."""
        if not self._panicked:
            return False
        with self._write_lock, self._env_lock:
            if not self._panicked or self._closed:
                return False
            if self._scans:
                return False
            self._env.close()
            self._open(self._map_size, self._max_readers)
            self._begin = self._env.begin
            self._panicked = False
        log.warning("%s: reopened the value store after MDB_PANIC (a commit failed to write its meta page)",
                    self.path)
        return True

    # -- admin ---------------------------------------------------------------

    def statistics(self) -> BackendStatistics:
        """See :meth:`brain.backend.Backend.statistics`."""
        with self._write_lock:
            if self._closed:
                raise BackendClosedError("backend is closed")
            env = self._env
            main = env.stat()
            psize = main["psize"]
            pages = 2 + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
            entries = []
            with env.begin() as txn:
                for db in [self._meta_db, *self._dbs.values()]:
                    st = txn.stat(db)
                    pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                    if db is not self._meta_db:
                        entries.append(st["entries"])
            size = os.stat(os.path.join(self.path, "data.mdb")).st_size
            return BackendStatistics(
                size_bytes=size,
                in_use_bytes=pages * psize,
                entries=tuple(entries),
                writes=self._writes,
                last_write_seconds=self._last_write_seconds,
                last_write_time=self._last_write_time,
            )

    def release_read_pages(self) -> None:
        """See :meth:`brain.backend.Backend.release_read_pages`.  LMDB
        reads through a read-only shared mapping of the data file, so every
        page a read touched stays in this process's resident set (a file's
        page cache, which the kernel may reclaim, but counted as ours).
        MADV_DONTNEED on that mapping drops the page table entries only:
        the next read of a page maps it again from the page cache, and a
        reader in another thread meanwhile is not disturbed.  Linux only
        (the mapping is found in /proc/self/maps)."""
        data = os.path.realpath(os.path.join(self.path, "data.mdb"))
        try:
            with open("/proc/self/maps") as maps:
                ranges = [line.split(None, 1)[0] for line in maps if line.rstrip().endswith(" " + data)]
        except OSError:
            return
        for r in ranges:
            lo, hi = (int(x, 16) for x in r.split("-"))
            _madvise_dontneed(lo, hi - lo)

    def close(self) -> None:
        """See :meth:`brain.backend.Backend.close`."""
        with self._write_lock, self._env_lock:
            if self._closed:
                return
            self._closed = True
            self._dbs = {}
            self._env.close()
