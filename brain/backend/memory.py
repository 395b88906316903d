"""An in-memory backend for tests: same contract as LMDB, no durability.

State is copy-on-write: a write builds new tables for the shards it touches
and publishes them with one reference assignment.  Readers take that
reference once per call, so every read (and every scan, for its whole life)
sees one consistent snapshot without locking.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from sortedcontainers import SortedDict

from .protocol import (
    MAX_KEY_SIZE,
    SHARDS_META_KEY,
    BackendClosedError,
    BackendFullError,
    BackendStatistics,
    WriteBatch,
)

__all__ = ["MemoryBackend"]


@dataclass(frozen=True, slots=True)
class _State:
    tables: dict[int, SortedDict]  # never mutated once published
    meta: dict[bytes, bytes]  # never mutated once published
    size: int  # sum of len(key) + len(value) over all tables and meta


def _as_bytes(value: object, what: str) -> bytes:
    if value.__class__ is bytes:
        return value  # type: ignore[return-value]
    if value is None or isinstance(value, (str, int)):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    return memoryview(value).tobytes()  # type: ignore[arg-type]  # TypeError if not bytes-like


def _valid_key(key: object, what: str = "key") -> bytes:
    key = _as_bytes(key, what)
    if not 0 < len(key) <= MAX_KEY_SIZE:
        raise ValueError(f"{what} must be 1..{MAX_KEY_SIZE} bytes, got {len(key)}")
    return key


class MemoryBackend:
    """Backend keeping each shard in a :class:`sortedcontainers.SortedDict`.

    ``max_bytes`` emulates a full store: a write that would make the payload
    (keys + values, meta included) exceed it raises
    :class:`~brain.backend.BackendFullError` and applies nothing.
    """

    def __init__(self, shards: int, *, max_bytes: int | None = None) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.shards = shards
        self._max_bytes = max_bytes
        meta = {SHARDS_META_KEY: b"%d" % shards}
        self._state: _State | None = _State(
            tables={i: SortedDict() for i in range(shards)},
            meta=meta,
            size=len(SHARDS_META_KEY) + len(meta[SHARDS_META_KEY]),
        )
        self._write_lock = threading.Lock()
        self._writes = 0
        self._last_write_seconds = 0.0
        self._last_write_time: float | None = None

    def __repr__(self) -> str:
        return f"MemoryBackend(shards={self.shards})"

    def __enter__(self) -> MemoryBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads --------------------------------------------------------------

    def _table(self, shard: int) -> SortedDict:
        state = self._state
        if state is None:
            raise BackendClosedError("backend is closed")
        try:
            return state.tables[shard]
        except (KeyError, TypeError):
            raise ValueError(f"shard {shard!r} not in range({self.shards})") from None

    def get(self, shard: int, key: bytes) -> bytes | None:
        """See :meth:`brain.backend.Backend.get`."""
        return self._table(shard).get(_as_bytes(key, "key"))

    def get_many(self, shard: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """See :meth:`brain.backend.Backend.get_many`."""
        get = self._table(shard).get
        return [get(_as_bytes(key, "key")) for key in keys]

    def scan(
        self, shard: int, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """See :meth:`brain.backend.Backend.scan`."""
        table = self._table(shard)
        start = _as_bytes(start, "start")
        if end is not None:
            end = _as_bytes(end, "end")
        return self._iterate(table, start, end)

    def _iterate(
        self, table: SortedDict, start: bytes, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        if end is not None and end <= start:
            return
        for key in table.irange(start, end, inclusive=(True, False)):
            if self._state is None:
                raise BackendClosedError("backend closed during scan")
            yield key, table[key]

    def get_meta(self, key: bytes) -> bytes | None:
        """See :meth:`brain.backend.Backend.get_meta`."""
        state = self._state
        if state is None:
            raise BackendClosedError("backend is closed")
        return state.meta.get(_as_bytes(key, "meta key"))

    def recover(self) -> bool:
        """See :meth:`brain.backend.Backend.recover`: no write leaves this
        store unusable."""
        return False

    # -- writes -------------------------------------------------------------

    def write(self, batch: WriteBatch) -> None:
        """See :meth:`brain.backend.Backend.write`."""
        started = time.perf_counter()
        with self._write_lock:
            state = self._state
            if state is None:
                raise BackendClosedError("backend is closed")
            if not (batch.puts or batch.deletes or batch.meta):
                return
            tables = state.tables

            # Validate and stage everything before touching any table.
            staged: dict[int, dict[bytes, bytes | None]] = {}
            for shard, key in batch.deletes:
                if shard not in tables:
                    raise ValueError(f"shard {shard!r} not in range({self.shards})")
                staged.setdefault(shard, {})[_valid_key(key)] = None
            for shard, key, value in batch.puts:
                if shard not in tables:
                    raise ValueError(f"shard {shard!r} not in range({self.shards})")
                staged.setdefault(shard, {})[_valid_key(key)] = _as_bytes(value, "value")
            meta_updates: dict[bytes, bytes] = {}
            for key, value in batch.meta.items():
                key = _valid_key(key, "meta key")
                if key == SHARDS_META_KEY:
                    raise ValueError(f"meta key {SHARDS_META_KEY!r} is reserved")
                meta_updates[key] = _as_bytes(value, "meta value")

            size = state.size
            for shard, changes in staged.items():
                table = tables[shard]
                for key, value in changes.items():
                    old = table.get(key)
                    if old is not None:
                        size -= len(key) + len(old)
                    if value is not None:
                        size += len(key) + len(value)
            for key, value in meta_updates.items():
                old = state.meta.get(key)
                if old is not None:
                    size -= len(key) + len(old)
                size += len(key) + len(value)
            if self._max_bytes is not None and size > self._max_bytes:
                raise BackendFullError(
                    f"batch needs {size} bytes, memory backend limit is {self._max_bytes}"
                )

            new_tables = dict(tables)
            for shard, changes in staged.items():
                table = tables[shard].copy()
                puts = {}
                for key, value in changes.items():
                    if value is None:
                        table.pop(key, None)
                    else:
                        puts[key] = value
                table.update(puts)
                new_tables[shard] = table
            meta = {**state.meta, **meta_updates} if meta_updates else state.meta
            self._state = _State(tables=new_tables, meta=meta, size=size)

            self._writes += 1
            self._last_write_time = time.time()
            self._last_write_seconds = time.perf_counter() - started

    # -- admin --------------------------------------------------------------

    def statistics(self) -> BackendStatistics:
        """See :meth:`brain.backend.Backend.statistics`."""
        with self._write_lock:
            state = self._state
            if state is None:
                raise BackendClosedError("backend is closed")
            return BackendStatistics(
                size_bytes=state.size,
                in_use_bytes=state.size,
                entries=tuple(len(state.tables[i]) for i in range(self.shards)),
                writes=self._writes,
                last_write_seconds=self._last_write_seconds,
                last_write_time=self._last_write_time,
            )

    def release_read_pages(self) -> None:
        """See :meth:`brain.backend.Backend.release_read_pages`: the data is
        the memory itself, nothing to give back."""

    def close(self) -> None:
        """See :meth:`brain.backend.Backend.close`."""
        with self._write_lock:
            self._state = None
