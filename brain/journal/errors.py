"""Exceptions raised by the journal.

The split matters to callers: a write error leaves the journal usable (retry
later, e.g. after freeing space), a failed journal must be abandoned (restart
and recover from disk), and corruption needs an operator.
"""

from __future__ import annotations


class JournalError(Exception):
    """Base class for every journal error (also: used after close, lock held)."""


class JournalCorruptError(JournalError):
    """Stored data fails validation somewhere a torn write cannot explain.

    Raised instead of dropping records: the message names the file, the byte
    offset where validation stopped, and why.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalWriteError(JournalError, OSError):
    """An append could not be written; nothing of it remains in the journal.

    Also an OSError so `errno` (e.g. ENOSPC) is available. The journal stays
    usable: the failed record got no index and the next append reuses it.
    """


class JournalFailedError(JournalError):
    """The journal is poisoned and refuses further appends and syncs.

    Raised when fdatasync failed (or a failed write could not be undone):
    after a failed fsync the kernel may have dropped dirty pages and cleared
    the error, so retrying would falsely report durability. Reopen the
    journal to recover from what is really on disk.
    """


class JournalFencedError(JournalError):
    """A shared journal refused an append: another writer's record now
    follows the one this writer expected to be last.  The records appended
    since the last successful sync are not in the journal (they never
    will be); the writer must stop writing and catch up as a reader.
    ``last_index`` is the journal's newest index as the refusal reported it.
    """

    def __init__(self, message: str, last_index: int) -> None:
        super().__init__(message)
        self.last_index = last_index


class JournalUnavailableError(JournalError):
    """A shared journal cannot be reached (no quorum, no connection) and
    the outcome of the last appends is not known yet.  Not final: the
    journal retries the same appends (they are de-duplicated) until it can
    say whether they landed, so the writer may call ``sync`` again."""


class JournalPurgedError(JournalError):
    """Records a reader asked for were dropped from a shared journal (every
    replica had checkpointed past them).  A replica whose checkpoint is
    older than the journal's first record must start from a peer's
    snapshot instead."""

    def __init__(self, message: str, first_index: int) -> None:
        super().__init__(message)
        self.first_index = first_index
