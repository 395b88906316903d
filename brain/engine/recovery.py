"""Recovery: a store rebuilt from the value store's last checkpoint plus
the journal records after it.

The value store only ever holds whole checkpoints (brain.engine.checkpointing),
so what it holds is exactly the state at the checkpoint's journal index;
replaying every later record reproduces the state at the journal's end.
The engine recovers this way when it opens, and a replica that stepped down
rebuilds this way (up to the last record it knows is in the journal) when
its memory may hold a batch the journal does not.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager

from ..mvcc.store import Store
from .checkpoint_meta import CheckpointMeta
from .memory import release_free_memory

log = logging.getLogger("brain.engine")

# A recovered index this large is moved out of the cyclic GC's reach.
FREEZE_INDEX_KEYS = 100_000


def load_store(backend, journal, boundaries: list[bytes], max_txn_ops: int,
               upto_index: int | None = None) -> tuple[Store, int, int]:
    """A store recovered from the last checkpoint in ``backend`` plus the
    ``journal`` after it (up to ``upto_index`` if given).  Returns the
    store, the index of the last record it holds, and the journal bytes
    replayed."""
    store = Store(backend, boundaries, max_txn_ops)
    started = time.monotonic()
    meta = CheckpointMeta.read(backend)
    journal_index = 0
    if meta is not None:
        store.load_checkpoint(meta.revision, meta.leases,
                              compact_rev=-1 if meta.compact_revision is None else meta.compact_revision,
                              compaction_finished=meta.compaction_finished,
                              epoch=meta.epoch, leader_id=meta.leader_id, auth=meta.auth,
                              progress=LoadProgressLog(sum(backend.statistics().entries)))
        journal_index = meta.journal_index
        backend.release_read_pages()  # the scan mapped every record; reads map what they need again
        release_free_memory()  # and the record heads it grouped by key are gone
        log.info("loaded checkpoint at revision %d (journal index %d, %d keys) in %.2fs",
                 store.revision, journal_index, store.keys_total(), time.monotonic() - started)
    replayed = 0
    replayed_bytes = 0
    last = journal_index
    last_log = time.monotonic()
    for index, payload in journal.records(after_index=journal_index, epoch=store.epoch):
        if upto_index is not None and index > upto_index:
            break
        store.replay(payload)
        replayed_bytes += len(payload)
        replayed += 1
        last = index
        if time.monotonic() - last_log > PROGRESS_LOG_SECONDS:
            log.info("replaying journal: %d records, revision %d", replayed, store.revision)
            last_log = time.monotonic()
    if replayed:
        log.info("replayed %d journal records to revision %d", replayed, store.revision)
    return store, last, replayed_bytes


PROGRESS_LOG_SECONDS = 5.0  # a long restart says how far it got this often


class LoadProgressLog:
    """A checkpoint load's progress in the log every PROGRESS_LOG_SECONDS
    (records scanned of the store's total and keys packed, each with its
    rate since the last line), so whoever waits on a restart of millions of
    keys sees it move."""

    def __init__(self, records: int, every: float = PROGRESS_LOG_SECONDS) -> None:
        self.records = records
        self.every = every
        self.started = self.logged = time.monotonic()
        self.scanned = self.packed = 0

    def __call__(self, scanned: int, packed: int) -> None:
        now = time.monotonic()
        seconds = now - self.logged
        if seconds < self.every or not seconds:
            return
        log.info("loading checkpoint: %d of %d records scanned (%.0f/s), %d keys packed (%.0f/s), %.0fs in",
                 scanned, self.records, (scanned - self.scanned) / seconds, packed,
                 (packed - self.packed) / seconds, now - self.started)
        self.logged, self.scanned, self.packed = now, scanned, packed


@contextmanager
def index_building():
    """Around building a large index: recovery allocates millions of
    long-lived index objects and no garbage cycles, so the cyclic GC is off
    meanwhile (it would rescan them again and again)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc_was_enabled:
            gc.enable()


def keep_out_of_gc(store: Store) -> None:
    """Keep a large recovered index out of future full collections, each of
    which would otherwise walk every one of its objects."""
    if store.keys_total() >= FREEZE_INDEX_KEYS:
        gc.freeze()
