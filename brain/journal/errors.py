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
