"""Making a batch durable where appends are not pipelined: the local
journal (one append and one fdatasync per commit batch, the committer's
group commit), and a shared journal whose members do not all read stale
messages as empty (brain.engine.pipeline).  What a failed append means is
decided here: another writer (step down and rebuild), an outcome that
cannot be known once the election is lost, no space (the local journal's
rebuild, brain.engine.journal_space), or anything else (refuse writes until
restart, as etcd does after a failed fdatasync).
"""

from __future__ import annotations

import errno
import logging
import time

from ..journal import JournalFencedError, JournalUnavailableError
from ..mvcc import errors
from .pending import Pending
from .timeouts import REQUEST_TIMEOUT

log = logging.getLogger("brain.engine")


def make_durable(c, payload: bytes, admitted: list[Pending]) -> int | None:
    """Append and sync one batch's record for the committer ``c``
    (brain.engine.committer.Committer); its journal index.  None: it is not
    durable and every caller of the batch has been answered."""
    journal = c.journal
    try:
        journal.append(payload)
        synced = time.perf_counter()
        _sync(c, admitted)
        synced = time.perf_counter() - synced
    except JournalFencedError as e:
        log.warning("another replica wrote to the journal (%s); stepping down", e)
        for p in admitted:
            c.settle(p, None, errors.ErrLeaderChanged)
        c.replication.step_down_now(rebuild=True)
        return None
    except JournalUnavailableError as e:
        if not c.replication.abandoning_writes or c.closing:
            raise
        # lost the election while the journal could not say whether the
        # batch landed: its callers cannot know either
        log.warning("giving up an append whose outcome is unknown (%s); stepping down", e)
        for p in admitted:
            c.settle(p, None, errors.ErrTimeoutDueToLeaderFail)
        c.replication.step_down_now(rebuild=True)
        return None
    except BaseException as e:
        if c.space is not None and c.space.takes(e):
            for p in admitted:
                c.settle(p, None, errors.ErrNoSpace)
            c.flush_sinks()  # final: the rebuild below drops the batch
            c.space.append_failed(e)
            return None
        nospace = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        err = errors.ErrNoSpace if nospace else errors.ErrStopped
        log.error("journal write failed (%r); refusing writes until restart", e)
        c.fail(err, f"journal write failed: {e!r}")
        if nospace:
            c.raise_nospace(f"the journal found no space ({e})")
        for p in admitted:
            c.settle(p, None, err)
        return None
    c.checkpointer.journaled(len(payload))
    for hook in c.journal_sync_hooks:
        hook(synced)
    return journal.last_index

def _sync(c, admitted: list[Pending]) -> None:
    """sync(), waiting out a shared journal that cannot be reached: its
    appends are retried (de-duplicated) until it says whether they
    landed.  Callers waiting longer than the request timeout are told
    ErrTimeout meanwhile (they cannot know the outcome either)."""
    started = time.monotonic()
    while True:
        try:
            c.journal.sync()
            return
        except JournalUnavailableError as e:
            if c.stopping or c.closing or c.replication.abandoning_writes:
                raise
            if time.monotonic() - started > REQUEST_TIMEOUT:
                for p in admitted:
                    c.settle(p, None, errors.ErrTimeout)
                c.flush_sinks()
            log.warning("journal unavailable (%s); retrying the append", e)
            time.sleep(0.2)
