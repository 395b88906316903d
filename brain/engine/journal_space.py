"""A single node's local journal out of space, and the engine going on.

The committer applies a batch to the store before it appends the batch's
record (it decides, then makes durable), so a journal that cannot take the
record leaves the store holding a batch the journal does not.  Two things
keep that from stopping the engine:

* The journal keeps its next segment preallocated (brain.journal.
  segment_journal, the spare), so a rollover never asks the filesystem for
  space.  When the spare cannot be made, the NOSPACE alarm is raised while
  a whole segment of room is left: puts, lease grants and Txns that can put
  are refused (etcd's `database space exceeded`), deletes and compactions
  still fit.  Making it is tried again every RETRY_SECONDS (free space is
  looked at first, so a full disk is not taken and given back each time).
* An append that fails for space all the same (a record larger than a
  segment, or a rollover with no spare left) gets its callers etcd's NOSPACE
  error and the store is rebuilt from the checkpoint and the journal up to
  the last record in it, as a replica that lost an append rebuilds its own
  (brain.engine.replication): the batch is gone from memory as it is from
  the disk, so it never becomes visible.  The alarm is raised, and until
  the spare is there again every write is refused before it is applied, so
  the next batch cannot be caught the same way.

Why rebuild rather than refuse a batch up front: what a batch appends is
known only once it is decided (a DeleteRange lists every key it deleted),
so refusing ahead would need a bound on every request's effects; the spare
makes the rebuild rare (once per episode of a full disk), and it is the
path a replica's store already takes.

Once space is back the spare is made again, writes are taken again, and
an operator's `etcdctl alarm disarm` lets puts in: no restart.  A failed
fdatasync stays fatal (brain.engine.committer: the kernel may have dropped
the pages it did not write).

Everything here runs on the committer thread.
"""

from __future__ import annotations

import errno
import logging
import time

from ..journal import JournalWriteError
from ..mvcc import errors
from .alarms import ALARM_NOSPACE

log = logging.getLogger("brain.engine")

RETRY_SECONDS = 1.0
SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class JournalSpace:
    """The committer's (``core``) handling of its local journal's space;
    ``load_store(upto_index)`` recovers a store (brain.engine.recovery)."""

    def __init__(self, core, journal, checkpointer, load_store, alarms, raise_nospace) -> None:
        self._core = core
        self._journal = journal
        self._checkpointer = checkpointer
        self._load_store = load_store
        self._alarms = alarms
        self._raise_nospace = raise_nospace
        # An append failed for space and the spare is not back yet: every
        # write is refused before it is applied.
        self.refusing = False
        self._retry_at = 0.0
        self._short = False  # the spare is missing: retried every RETRY_SECONDS

    @staticmethod
    def takes(exc: BaseException) -> bool:
        """Whether a failed append is one of ours: the journal refused the
        record for space and stays usable (a failed fdatasync is not)."""
        return isinstance(exc, JournalWriteError) and exc.errno in SPACE_ERRNOS

    def maintain(self) -> None:
        """Between batches: while the spare is missing, make it again
        (at once when it goes missing, then every RETRY_SECONDS), raising
        the alarm while there is no space for it."""
        if self._journal.reserve_error is None:
            if self._short or self.refusing:
                self._back()
            return
        now = time.monotonic()
        if self._short and now < self._retry_at:
            return
        first, self._short = not self._short, True
        self._retry_at = now + RETRY_SECONDS
        try:
            self._journal.reserve()
        except JournalWriteError as e:
            if e.errno not in SPACE_ERRNOS:
                if first:
                        log.warning("the journal cannot preallocate its next segment (%s); retrying every %.0fs",
                                e, RETRY_SECONDS)
            elif not self._alarms.has(ALARM_NOSPACE):
                self._raise_nospace(f"the journal found no space for its next segment ({e})")
            return
        self._back()

    def _back(self) -> None:
        log.info("the journal's next segment is preallocated again%s",
                 "; taking writes again" if self.refusing else "")
        self._short = self.refusing = False

    def append_failed(self, exc: JournalWriteError) -> None:
        """An append was refused for space (its callers are answered):
        drop its batch from memory by rebuilding the store, raise the
        alarm and, if the spare is missing, refuse writes until it is back
        (with a spare, only a record larger than a segment needed space)."""
        self.refusing = self._journal.reserve_error is not None
        self._raise_nospace(f"the journal found no space ({exc})")
        log.warning("rebuilding the store from the checkpoint and the journal without the batch "
                    "the journal refused%s", "; refusing writes until the journal has space again"
                    if self.refusing else "")
        try:
            self._rebuild()
        except Exception as e:  # noqa: BLE001 - the store may hold the batch: stop writes
            log.exception("rebuilding the store failed")
            self._core.fail(errors.ErrStopped, f"rebuilding the store after a full journal failed: {e!r}")

    def _rebuild(self) -> None:
        """Replace the store by one recovered from the checkpoint and the
        journal up to the applied index: exactly the committed state, which
        readers were served meanwhile."""
        core = self._core
        started = time.monotonic()
        self._checkpointer.settle(core.store)
        store, applied, nbytes = self._load_store(core.applied_index)
        if applied != core.applied_index or store.revision != core.committed_rev:
            reason = (f"rebuilding the store reached journal index {applied}, revision {store.revision}; "
                      f"expected {core.applied_index}, {core.committed_rev}")
            log.error("%s", reason)
            core.fail(errors.ErrCorrupt, reason)
            return
        store.collect_changes()
        core.replace_store(store)
        self._checkpointer.journal_bytes = nbytes
        log.info("store rebuilt at revision %d in %.2fs", store.revision, time.monotonic() - started)
