"""Reading an etcd database: an etcd data directory (`member/snap/db`, with
etcd stopped) or an `etcdctl snapshot save` file (the database followed by
its sha256).

    with EtcdDb.open(path) as db:
        db.meta.finished_compact, db.current_revision, db.leases()
        for r in db.revisions(): ...       # the key bucket, in revision order

Written by etcd 3.4, 3.5 and 3.6 alike (see schema.py); fields a version
does not write are None.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

import crc32c

from ..bbolt import BoltError, BoltFile
from . import proto, schema
from .proto import KeyValue, Lease, ProtoError, decode_key_value, decode_lease

SNAPSHOT_SECTOR = 512  # etcd: a snapshot is db bytes (a multiple of 512) then a sha256
DIGEST_SIZE = 32


class EtcdDbError(Exception):
    """A source that cannot be read as an etcd database (message says why)."""


class DigestMismatch(EtcdDbError):
    """The sha256 trailer does not match: the snapshot is corrupt or
    incomplete.  Its own type because only some commands can read such a
    file anyway (restore and import, with --skip-hash-check): they say so,
    `brain snapshot status` has no such flag and must not suggest it."""


class EtcdRunning(EtcdDbError):
    """The database is locked by a running etcd."""


@dataclass(frozen=True)
class EtcdMeta:
    consistent_index: int | None
    term: int | None
    scheduled_compact: int | None
    finished_compact: int | None
    storage_version: str | None
    conf_state: dict | None
    cluster_version: str | None
    auth_enabled: bool


@dataclass(frozen=True, slots=True)
class KeyRevision:
    """One entry of the key bucket: a put (kv is the stored KeyValue) or a
    tombstone (kv holds only the key)."""

    main: int
    sub: int
    tombstone: bool
    kv: KeyValue


@dataclass(frozen=True)
class DbStatus:
    """What `etcdutl snapshot status` reports, computed the same way."""

    hash: int
    revision: int
    total_keys: int
    total_size: int
    version: str


def data_dir_db(path: str) -> str | None:
    """The database file of an etcd data directory, or None if `path` is not one."""
    p = os.path.join(path, "member", "snap", "db")
    return p if os.path.isfile(p) else None


def is_etcd_data_dir(path: str) -> bool:
    """True when `path` looks like etcd's: a member/ with snap/ or wal/."""
    member = os.path.join(path, "member")
    return os.path.isdir(os.path.join(member, "snap")) or os.path.isdir(os.path.join(member, "wal"))


class EtcdDb:
    def __init__(self, path: str, bolt: BoltFile, kind: str, lock_fd: int | None) -> None:
        self.path = path
        self.bolt = bolt
        self.kind = kind  # "data-dir", "snapshot" or "db"
        self._lock_fd = lock_fd
        self.meta = self._read_meta()
        self._current: int | None = None

    # -- opening ------------------------------------------------------------

    @classmethod
    def open(cls, source: str, *, skip_hash_check: bool = False, progress=None) -> "EtcdDb":
        """Open an etcd data directory or a snapshot/database file.

        A data directory's database is opened with a shared lock, refused
        (EtcdRunning) while an etcd holds it.  A snapshot's sha256 trailer is
        checked unless `skip_hash_check`; `progress(done_bytes, total_bytes)`
        is called while hashing."""
        source = os.path.abspath(source)
        if os.path.isdir(source):
            path = data_dir_db(source)
            if path is None:
                if is_etcd_data_dir(source):
                    raise EtcdDbError(f"{source} is an etcd data directory without a database "
                                      f"(member/snap/db): nothing to read")
                raise EtcdDbError(f"{source} is not an etcd data directory (no member/snap/db) "
                                  f"and not a snapshot file")
            kind = "data-dir"
        elif os.path.isfile(source):
            path = source
            kind = "file"
        else:
            raise EtcdDbError(f"{source}: no such file or directory")
        lock_fd = None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise EtcdDbError(f"{path}: {e.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    where = os.path.dirname(os.path.dirname(os.path.dirname(path))) if kind == "data-dir" else path
                    raise EtcdRunning(f"{where}: the etcd database is locked by a running etcd; stop etcd first "
                                      f"(or copy a running etcd with `brain mirror --from <url>`)") from None
                raise
            size = os.fstat(fd).st_size
            if kind == "file":
                if size % SNAPSHOT_SECTOR == DIGEST_SIZE:
                    kind = "snapshot"
                    if not skip_hash_check:
                        _verify_digest(fd, path, size, progress)
                elif size % SNAPSHOT_SECTOR:
                    raise EtcdDbError(f"{path}: {size} bytes is neither an etcd database (a multiple of "
                                      f"{SNAPSHOT_SECTOR}) nor a snapshot (that plus a 32-byte sha256)")
                else:
                    kind = "db"
            try:
                bolt = BoltFile(path)
            except BoltError as e:
                raise EtcdDbError(str(e)) from None
            lock_fd, fd = fd, None
            try:
                try:
                    etcds = bolt.bucket(schema.KEY) is not None and bolt.bucket(schema.META) is not None
                except BoltError as e:
                    raise EtcdDbError(str(e)) from None
                if not etcds:
                    raise EtcdDbError(f"{path}: a bbolt database, but not etcd's (no key and meta buckets)")
                return cls(path, bolt, kind, lock_fd)
            except BaseException:
                bolt.close()
                raise
        except BaseException:
            if fd is not None:
                os.close(fd)
            if lock_fd is not None:
                os.close(lock_fd)
            raise

    def close(self) -> None:
        self.bolt.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "EtcdDb":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- small buckets --------------------------------------------------------

    def _bucket_dict(self, name: bytes) -> dict[bytes, bytes]:
        try:
            b = self.bolt.bucket(name)
            return b.as_dict() if b is not None else {}
        except BoltError as e:
            raise EtcdDbError(str(e)) from None

    def _read_meta(self) -> EtcdMeta:
        m = self._bucket_dict(schema.META)

        def u64(key):
            v = m.get(key)
            if v is None:
                return None
            try:
                return schema.parse_u64(v)
            except ValueError as e:
                raise EtcdDbError(f"{self.path}: meta {key.decode()}: {e}") from None

        def rev(key):
            v = m.get(key)
            if v is None:
                return None
            try:
                return schema.parse_rev_key(v)[0]
            except ValueError as e:
                raise EtcdDbError(f"{self.path}: meta {key.decode()}: {e}") from None

        conf = m.get(schema.META_CONF_STATE)
        try:
            conf_state = json.loads(conf) if conf else None
        except ValueError:
            conf_state = None
        sv = m.get(schema.META_STORAGE_VERSION)
        cv = self._bucket_dict(schema.CLUSTER).get(schema.CLUSTER_VERSION)
        auth = self._bucket_dict(schema.AUTH).get(schema.AUTH_ENABLED)
        return EtcdMeta(
            consistent_index=u64(schema.META_CONSISTENT_INDEX),
            term=u64(schema.META_TERM),
            scheduled_compact=rev(schema.META_SCHEDULED_COMPACT),
            finished_compact=rev(schema.META_FINISHED_COMPACT),
            storage_version=sv.decode() if sv else None,
            conf_state=conf_state,
            cluster_version=cv.decode() if cv else None,
            auth_enabled=auth == b"\x01",
        )

    def leases(self) -> list[Lease]:
        out = []
        for k, v in self._bucket_dict(schema.LEASE).items():
            try:
                lease = decode_lease(v)
            except ProtoError as e:
                raise EtcdDbError(f"{self.path}: lease {k.hex()}: {e}") from None
            out.append(lease)
        return out

    def members(self) -> list[dict]:
        out = []
        for _k, v in self._bucket_dict(schema.MEMBERS).items():
            try:
                out.append(json.loads(v))
            except ValueError:
                continue
        return out

    def alarms(self) -> int:
        """How many alarms the alarm bucket holds."""
        return len(self._bucket_dict(schema.ALARM))

    def auth(self) -> proto.Auth:
        """The auth buckets: on or off, the auth revision (etcd's 1 when the
        database has none), users and roles in name order."""
        bucket = self._bucket_dict(schema.AUTH)
        revision = bucket.get(schema.AUTH_REVISION)
        try:
            users = tuple(proto.decode_user(v) for _, v in sorted(self._bucket_dict(schema.AUTH_USERS).items()))
            roles = tuple(proto.decode_role(v) for _, v in sorted(self._bucket_dict(schema.AUTH_ROLES).items()))
            revision = schema.parse_u64(revision) if revision is not None else 1
        except (ProtoError, ValueError) as e:
            raise EtcdDbError(f"{self.path}: auth: {e}") from None
        return proto.Auth(bucket.get(schema.AUTH_ENABLED) == b"\x01", revision, users, roles)

    def auth_counts(self) -> tuple[int, int]:
        """(users, roles) in the auth buckets."""
        return len(self._bucket_dict(schema.AUTH_USERS)), len(self._bucket_dict(schema.AUTH_ROLES))

    # -- the key bucket -------------------------------------------------------

    def revisions(self) -> Iterator[KeyRevision]:
        """Every entry of the key bucket, in revision order."""
        try:
            for k, v in self.bolt.bucket(schema.KEY):
                try:
                    main, sub, tomb = schema.parse_rev_key(k)
                    kv = decode_key_value(v)
                except (ValueError, ProtoError) as e:
                    raise EtcdDbError(f"{self.path}: key bucket entry {k.hex()}: {e}") from None
                yield KeyRevision(main, sub, tomb, kv)
        except BoltError as e:
            raise EtcdDbError(str(e)) from None

    @property
    def last_revision(self) -> int:
        """The newest main revision in the key bucket (0 when empty)."""
        try:
            last = self.bolt.bucket(schema.KEY).last()
            return schema.parse_rev_key(last[0])[0] if last is not None else 0
        except (BoltError, ValueError) as e:
            raise EtcdDbError(f"{self.path}: {e}") from None

    @property
    def current_revision(self) -> int:
        """The revision etcd would serve after opening this database: the
        newest stored one, or the compaction revision if that is newer (a
        compaction can remove the newest revision's tombstone), and 1 for
        an empty store."""
        if self._current is None:
            m = self.meta
            self._current = max(self.last_revision, m.finished_compact or 0, m.scheduled_compact or 0, 1)
        return self._current

    @property
    def compact_revision(self) -> int:
        """Reads below this fail after etcd opens the database (etcd resumes
        an unfinished compaction at once); -1 when nothing was compacted."""
        m = self.meta
        got = [r for r in (m.finished_compact, m.scheduled_compact) if r is not None]
        return max(got) if got else -1

    def pages_total(self) -> int:
        """Pages holding data (for progress: the key bucket is most of them)."""
        try:
            free = len(self.bolt.freelist())
        except BoltError:
            free = 0
        return max(1, self.bolt.meta.pgid - free)

    # -- etcdutl snapshot status ------------------------------------------

    def status(self) -> DbStatus:
        """`etcdutl snapshot status`: a CRC-32C over every bucket's name and
        its keys and values in order, the newest revision, the keys alive at
        it, the database size and the storage version."""
        h = 0
        revision = 0
        live: set[bytes] = set()
        try:
            for name, bucket in self.bolt.root().buckets():
                h = crc32c.crc32c(name, h)
                is_key = name == schema.KEY
                for k, v, _flags in bucket.items():
                    h = crc32c.crc32c(v, crc32c.crc32c(k, h))
                    if is_key:
                        main, _sub, tomb = schema.parse_rev_key(k)
                        revision = main
                        key = decode_key_value(v).key
                        if tomb:
                            live.discard(key)
                        else:
                            live.add(key)
        except (BoltError, ValueError, ProtoError) as e:
            raise EtcdDbError(f"{self.path}: {e}") from None
        version = self.meta.storage_version or ""
        return DbStatus(h, revision, len(live), self.bolt.meta.pgid * self.bolt.page_size, version)


def _verify_digest(fd: int, path: str, size: int, progress=None) -> None:
    sha = hashlib.sha256()
    left = size - DIGEST_SIZE
    done = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while left > 0:
        buf = os.read(fd, min(left, 4 << 20))
        if not buf:
            raise EtcdDbError(f"{path}: file shrank while being read")
        sha.update(buf)
        left -= len(buf)
        done += len(buf)
        if progress is not None:
            progress(done, size - DIGEST_SIZE)
    trailer = os.read(fd, DIGEST_SIZE)
    os.lseek(fd, 0, os.SEEK_SET)
    if sha.digest() != trailer:
        raise DigestMismatch(f"{path}: sha256 mismatch: the snapshot is corrupt or incomplete")
