"""What the engine asks of a journal, whichever one it has.

Two implementations keep this contract (tests/journal/test_contract.py runs
one suite over both):

* ``brain.journal.SegmentJournal``: segment files on the local disk (the embedded
  default); one process is its only writer and reader;
* ``brain.journal.jetstream.JetStreamJournal``: a NATS JetStream stream
  replicated by the NATS cluster; every replica of a brain cluster reads
  it, and the one that leads writes it.

The contract, in the engine's words:

* records are opaque byte strings with increasing indexes; ``append``
  returns the index the record gets, ``sync`` returns once every record
  appended so far is durable (fdatasync'ed, or acknowledged by a quorum of
  the NATS cluster).  Nothing may be acknowledged to a client before that;
* ``records(after_index)`` yields the retained records after an index, in
  order, exactly as appended (a record that was never made durable in full
  is never yielded: a torn tail is cut, a partly published record is
  skipped);
* ``release(upto_index)`` says the caller's checkpoint covers every record
  up to that index; the journal may then drop them (the local one deletes
  whole segments, the shared one purges once every replica is past them);
* a shared journal has more than one writer over time, so its appends are
  *fenced*: each carries the index the writer expects to be the last one,
  and an append after another writer's is refused with JournalFencedError,
  never interleaved.  ``begin_writing(last_index, epoch)`` positions a new
  writer; ``epoch`` (its term) goes with each of its records, and readers
  given the epoch their store is at (``records``, ``follow``) read a record
  of an older epoch than the newest they have seen as an empty one: a
  deposed writer's record that was already on its way when it was fenced
  and landed after the next writer's epoch record (appends may be
  pipelined: brain.engine.pipeline).

Errors: JournalError and its subclasses (brain.journal.errors).  After
JournalFencedError the records appended since the last successful sync were
not kept; after JournalFailedError the journal cannot be used any more.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, runtime_checkable


@runtime_checkable
class Journal(Protocol):
    """The write-ahead journal the engine commits through."""

    @property
    def first_index(self) -> int:
        """Index of the oldest retained record (last_index + 1 if none)."""

    @property
    def last_index(self) -> int:
        """Index of the newest record appended (0 if none ever was)."""

    def append(self, payload: bytes) -> int:
        """Add one record; it is not durable before ``sync``."""

    def sync(self) -> None:
        """Return once every appended record is durable."""

    def records(self, after_index: int = 0, epoch: int = 0) -> Iterator[tuple[int, bytes]]:
        """(index, payload) of the retained records after ``after_index``
        (``epoch``: the reader's, see the module docstring)."""

    def release(self, upto_index: int) -> int:
        """Records up to ``upto_index`` are covered by a checkpoint."""

    def close(self) -> None:
        """Release files and connections (does not sync)."""


@runtime_checkable
class SharedJournal(Journal, Protocol):
    """A journal several replicas read and, one at a time, write."""

    def begin_writing(self, last_index: int, epoch: int = 0) -> None:
        """Start writing after ``last_index``: every append is fenced on the
        record before it, so the first one fails with JournalFencedError if
        the journal has grown past ``last_index`` meanwhile."""

    def stop_writing(self) -> None:
        """Give up writing (appends fail until ``begin_writing``)."""

    def end_index(self, callback: Callable[[int | None, BaseException | None], None]) -> None:
        """Ask the journal's newest index; ``callback(index, None)`` or
        ``callback(None, error)`` follows on another thread.  The answer may
        be stale (a replicated log's deposed leader may give it), so only a
        writer about to append fenced on it may rely on it, never a
        linearizable read: those wait for an acknowledged record
        (brain.engine.readindex)."""

    def follow(self, after_index: int, deliver: Callable[[int, bytes], None],
               failed: Callable[[BaseException], None], epoch: int = 0) -> None:
        """Deliver every record after ``after_index``, in order and each
        once, as it becomes durable (on another thread), until
        ``stop_following``; ``failed`` is called if that becomes impossible
        (the records were purged meanwhile).  ``epoch``: the reader's."""

    def stop_following(self) -> None:
        """Stop delivering; records already handed over stay handed over."""
