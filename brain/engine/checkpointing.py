"""Checkpoints: the store's memtables written to the value store, so the
journal records they hold can go.

A checkpoint starts when the journal since the last one, the memtables or
the time since it pass their limits, or when writes stopped after a burst
(EngineConfig.checkpoint_*).  After one, the memory the memtables held is
handed back to the operating system (brain.engine.memory).  The
committer freezes the memtables (``Store.checkpoint_cut``, under the engine
lock), a thread writes the frozen records, deletes and the checkpoint meta
(brain.engine.checkpoint_meta) in one atomic synced batch, and the
committer, between two batches, either drops the frozen tables and releases
the journal up to the cut's index, or, if the write failed, serves the cut
from memory again (it is written by the next checkpoint).  So the value
store only ever holds whole checkpoints: recovery (brain.engine.recovery)
loads the last one and replays the journal after its index.

A failed checkpoint is retried after a pause that doubles up to
RETRY_MAX_SECONDS (a full disk would otherwise be written to, and logged,
after every batch); one that failed for lack of space (BackendFullError)
also tells the engine (``on_full``), which raises the NOSPACE alarm.  A
failed write may leave the value store unusable, reads included (lmdb
after a commit whose meta page was not written): the checkpoint's thread
has it reopened at once (``Backend.recover``), holding the engine's lock,
under which every read of a record runs.

Threads: everything here but the write runs on the committer.
"""

from __future__ import annotations

import logging
import threading
import time

from .. import backend as backend_mod
from .checkpoint_meta import CheckpointMeta
from .config import EngineConfig
from .memory import release_free_memory
from ..thread_names import name_os_thread

log = logging.getLogger("brain.engine")

RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0


class Checkpointer:
    def __init__(self, backend, journal, lock: threading.Lock, config: EngineConfig, hooks: list,
                 journal_bytes: int, on_full=None) -> None:
        """``lock``: the engine's, guarding the store; ``hooks``: duration
        observers (seconds) called after every checkpoint write, on its
        thread; ``journal_bytes``: journal bytes not in the last checkpoint;
        ``on_full(error)``: called on the committer when a checkpoint
        failed because the value store has no space."""
        self._backend = backend
        self._on_full = on_full
        self._journal = journal
        self._lock = lock
        self._config = config
        self._hooks = hooks
        self.journal_bytes = journal_bytes
        self.checkpoints = 0
        self.last_seconds = 0.0
        self.backend_size = 0
        self.backend_in_use = 0
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._last_time = time.monotonic()
        self._last_journaled = self._last_time
        self._cut = None
        self._cut_index = 0
        self._cut_bytes = 0
        self._retry_delay = 0.0  # after a failure: the pause before the next try
        self._retry_at = 0.0
        self.refresh_backend_size()

    @property
    def bytes_in_use(self) -> int:
        """What the quota counts: the value store's pages in use plus the
        journal not yet checkpointed."""
        return self.backend_in_use + self.journal_bytes

    def journaled(self, n: int) -> None:
        """``n`` more bytes appended to the journal (the committer)."""
        self.journal_bytes += n
        self._last_journaled = time.monotonic()

    def due(self, store) -> bool:
        """A checkpoint would start now (not while one is being written)."""
        return self._thread is None and self._due(store)

    def _due(self, store) -> bool:
        cfg = self._config
        if self.journal_bytes == 0:
            return False
        now = time.monotonic()
        if now < self._retry_at:
            return False
        return (
            self.journal_bytes >= cfg.checkpoint_journal_bytes
            or store.memtable_entries() >= cfg.checkpoint_memtable_records
            or now - self._last_time >= cfg.checkpoint_interval_seconds
            or (self.journal_bytes >= cfg.checkpoint_idle_bytes
                and now - self._last_journaled >= cfg.checkpoint_idle_seconds)
        )

    def maintain(self, store, applied_index: int, may_start: bool) -> None:
        """Between batches: finish a written checkpoint; start one when due
        (and ``may_start``: not while the engine refuses writes)."""
        t = self._thread
        if t is not None:
            if not self._done.is_set():
                return
            t.join()
            self._thread = None
            self._finish(store)
        if may_start and self._due(store):
            self._start(store, applied_index)

    def now(self, store, applied_index: int, may_start: bool) -> None:
        """A full checkpoint now, waited for."""
        self.settle(store)
        if may_start and self.journal_bytes:
            self._start(store, applied_index)
            self.settle(store)

    def settle(self, store) -> None:
        """Wait for a checkpoint being written and finish it."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._finish(store)

    def join(self) -> None:
        """Wait for a checkpoint write still running (shutdown)."""
        if self._thread is not None:
            self._thread.join()

    def refresh_backend_size(self) -> None:
        st = self._backend.statistics()
        self.backend_size = st.size_bytes
        self.backend_in_use = st.in_use_bytes

    def _start(self, store, index: int) -> None:
        self._recover_backend()  # if another write (an alarm's) left it unusable
        with self._lock:
            cut = store.checkpoint_cut()
        self._cut_index = index
        self._cut = cut
        self._cut_bytes = self.journal_bytes
        self._done.clear()
        self._error = None
        self._thread = threading.Thread(target=self._write, args=(cut, index), name="brain-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _write(self, cut, index: int) -> None:
        name_os_thread()  # else it keeps the OS name of the thread that started it
        started = time.monotonic()
        try:
            batch = backend_mod.WriteBatch(
                puts=list(cut.records()),
                deletes=list(cut.deleted()),
                meta=CheckpointMeta.of_cut(cut, index).write_entry(),
            )
            self._backend.write(batch)
            self.last_seconds = time.monotonic() - started
            for hook in self._hooks:
                hook(self.last_seconds)
            log.debug("checkpoint at revision %d: %d records, %d deletes in %.3fs",
                      cut.revision, len(batch.puts), len(batch.deletes), self.last_seconds)
        except BaseException as e:
            self._error = e
            self._recover_backend()
        finally:
            self._done.set()

    def _recover_backend(self) -> None:
        with self._lock:  # every reader out
            try:
                self._backend.recover()
            except Exception as e:  # noqa: BLE001 - tried again before the next checkpoint
                log.error("reopening the value store failed: %r", e)

    def _finish(self, store) -> None:
        err = self._error
        if err is not None:
            self._retry_delay = min(max(2 * self._retry_delay, RETRY_MIN_SECONDS), RETRY_MAX_SECONDS)
            log.error("checkpoint failed (%r); journal segments are kept; next try in %.0fs",
                      err, self._retry_delay)
            # The frozen records go back to being served from memory; they
            # are written again by the next checkpoint.
            with self._lock:
                store.checkpoint_abort(self._cut)
            self._last_time = time.monotonic()
            self._retry_at = self._last_time + self._retry_delay
            if isinstance(err, backend_mod.BackendFullError) and self._on_full is not None:
                self._on_full(err)
            return
        self._retry_delay = 0.0
        with self._lock:
            store.checkpoint_done()
        try:
            self._journal.release(self._cut_index)
        except Exception as e:  # noqa: BLE001 - only space is lost; retried at the next checkpoint
            log.warning("releasing journal records up to %d failed: %r", self._cut_index, e)
        self.journal_bytes -= self._cut_bytes
        self.checkpoints += 1
        self._last_time = time.monotonic()
        self.refresh_backend_size()
        release_free_memory()
