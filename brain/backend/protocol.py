"""The protocol every value store behind the MVCC core implements.

A backend holds ``shards`` ordered tables plus one meta table.  Each shard
table maps keys to values; the MVCC core uses 16-byte revision keys
(8-byte big-endian main revision + 8-byte big-endian sub revision) and
encoded records as values, but a backend treats both as opaque bytes and
orders keys bytewise.  The meta table maps bytes to bytes.

Writes arrive as large :class:`WriteBatch` es (the MVCC core flushes its
in-memory records at checkpoints).  A batch is applied atomically across all
shards and the meta table, and is durable when :meth:`Backend.write` returns.

Keys
    A *valid key* is a non-empty bytes object of at most
    :data:`MAX_KEY_SIZE` bytes (LMDB's limit with its default page size).
    Writing an invalid key is an error; looking one up simply finds nothing.

Errors shared by every method
    :class:`BackendClosedError`
        the backend was closed.
    ``ValueError``
        a shard index outside ``range(shards)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence, runtime_checkable

__all__ = [
    "MAX_KEY_SIZE",
    "SHARDS_META_KEY",
    "Backend",
    "BackendClosedError",
    "BackendError",
    "BackendFullError",
    "BackendStatistics",
    "ShardCountMismatchError",
    "WriteBatch",
]

#: Longest valid key, in bytes (shard keys and meta keys alike).
MAX_KEY_SIZE = 511

#: Meta key under which a backend records its shard count (ASCII decimal).
#: It is readable with ``get_meta`` but reserved: a batch may not write it.
SHARDS_META_KEY = b"backend.shards"


class BackendError(Exception):
    """Base class of the errors raised by backends themselves."""


class BackendFullError(BackendError):
    """The store cannot grow to hold a batch; nothing of it was applied.

    Raised for a full LMDB map (``MapFullError``), a full disk (``ENOSPC``,
    ``EDQUOT``) or, for the memory backend, its ``max_bytes`` limit.
    """


class BackendClosedError(BackendError):
    """The backend was used after :meth:`Backend.close`."""


class ShardCountMismatchError(BackendError, ValueError):
    """An existing store was opened with a different shard count."""


@dataclass(slots=True)
class WriteBatch:
    """One atomic, durable write.

    ``deletes`` are applied before ``puts``, so a key both deleted and put
    in the same batch ends up holding the put value; of several puts to one
    key the last wins.  Deleting a missing key is not an error.  ``meta``
    entries are upserted into the meta table (meta keys cannot be deleted).
    """

    puts: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    deletes: list[tuple[int, bytes]] = field(default_factory=list)
    meta: dict[bytes, bytes] = field(default_factory=dict)

    def __len__(self) -> int:
        """Number of operations (puts + deletes + meta entries)."""
        return len(self.puts) + len(self.deletes) + len(self.meta)


@dataclass(frozen=True, slots=True)
class BackendStatistics:
    """A point-in-time view of a backend, for metrics and compaction policy.

    size_bytes
        bytes the store occupies: the data file's size for LMDB, which
        includes free pages awaiting reuse; the payload size for memory.
    in_use_bytes
        bytes in pages that hold live data (B-tree branch, leaf and overflow
        pages of every table); ``size_bytes - in_use_bytes`` approximates
        the free space that new writes reuse before the file grows.
    entries
        number of entries in each shard table, indexed by shard.
    writes
        batches committed by this instance since it was opened (empty
        batches are not counted).
    last_write_seconds
        wall-clock duration of the last committed batch, including its
        sync to disk; ``0.0`` before the first write.
    last_write_time
        ``time.time()`` when the last batch committed, or ``None``.
    """

    size_bytes: int
    in_use_bytes: int
    entries: tuple[int, ...]
    writes: int
    last_write_seconds: float
    last_write_time: float | None


@runtime_checkable
class Backend(Protocol):
    """Sharded ordered key/value tables plus a meta table.

    Thread safety: every method may be called from any thread.  Reads run
    concurrently with each other and with a write and never observe a
    partially applied batch; writes are serialised.
    """

    #: Number of shard tables, fixed when the store is created.
    shards: int

    def get(self, shard: int, key: bytes) -> bytes | None:
        """Return the value stored under ``key`` in ``shard``, or ``None``.

        Errors: ``ValueError`` for a bad shard; :class:`BackendClosedError`;
        ``TypeError`` if ``key`` is not bytes.  An invalid key (empty or
        too long) is simply absent and returns ``None``.
        """
        ...

    def get_many(self, shard: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """Return the values of ``keys`` in ``shard``, ``None`` where absent.

        The result is parallel to ``keys`` (duplicates allowed) and is read
        from a single snapshot.  Errors: as :meth:`get`.
        """
        ...

    def scan(
        self, shard: int, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` pairs of ``shard`` with ``start <= key < end``.

        Keys ascend bytewise; ``end=None`` means no upper bound.  The
        snapshot is taken when ``scan`` is called and holds for the whole
        iteration, whatever is written meanwhile.  An unfinished iterator
        pins its snapshot (for LMDB, pages cannot be reused) until it is
        exhausted, closed or garbage-collected, so do not keep one around.

        Errors: ``ValueError`` for a bad shard and :class:`BackendClosedError`
        are raised by the call itself; closing the backend mid-iteration
        raises :class:`BackendClosedError` from the iterator.
        """
        ...

    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically and durably (see :class:`WriteBatch`).

        When this returns, the batch is synced to stable storage.  If it
        raises, nothing of the batch was applied.

        Errors:
            :class:`BackendFullError`: the store cannot grow to hold it.
            ``ValueError``: a bad shard, an invalid key in ``puts``,
            ``deletes`` or ``meta``, or a write of :data:`SHARDS_META_KEY`.
            ``TypeError``: a key or value that is not bytes (or ``None``).
            :class:`BackendClosedError`.
            Anything else (I/O errors, LMDB corruption) propagates as is.
        An empty batch is a no-op that touches nothing.
        """
        ...

    def recover(self) -> bool:
        """Make the store usable again after a write failed in a way that
        left it unusable (LMDB: a commit whose meta page could not be
        written puts the environment in MDB_PANIC, reads included, until
        it is reopened).  True if something was done; False when nothing
        failed so, or it cannot be done yet (call again later).

        Unlike every other method this one needs the readers out: the
        caller holds the lock its reads of records run under (the
        engine's).  Writes and metadata reads are kept out by the backend.
        """
        ...

    def get_meta(self, key: bytes) -> bytes | None:
        """Return the meta value stored under ``key``, or ``None``.

        Errors: :class:`BackendClosedError`; ``TypeError`` if ``key`` is not
        bytes.  An invalid key returns ``None``.
        """
        ...

    def statistics(self) -> BackendStatistics:
        """Return current :class:`BackendStatistics`.

        Errors: :class:`BackendClosedError`.
        """
        ...

    def release_read_pages(self) -> None:
        """Let the operating system take back the memory that reads left
        mapped into this process (a restart's scan of every record), as
        much as the store can; later reads find the data again.  Never
        raises; a store with nothing mapped does nothing.
        """
        ...

    def close(self) -> None:
        """Wait for an in-flight write, then release the store.

        Idempotent; every later call except ``close`` raises
        :class:`BackendClosedError`.  Never raises for a healthy store.
        """
        ...
