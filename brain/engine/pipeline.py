"""Appends in flight on a shared journal: the leader's committer decides and
publishes the next batches while earlier ones wait for the journal's quorum.

On a JetStream journal an append is a publish and its durability an
acknowledgement a network round trip later (two with the stream's
``sync_interval: always``).  Waiting for each before deciding the next
batch left the committer idle for most of a turn: the cluster wrote at
0.61-0.80x a 3-member etcd.  With the pipeline the committer appends batch
N+1 while a *syncing thread* waits for N's acknowledgement; each append is
still fenced on the sequence the one before it takes (brain.journal.
jetstream), so a refusal fails that batch and every later one, as before.

Invariants (the committer keeps them, brain.engine.committer):

- a batch becomes visible (``committed_rev``, watchers) and its callers
  are answered only once the journal acknowledged its record and every
  record before it: batches settle in append order;
- an answer decided without a record (a failed compare) waits behind the
  batches appended before it was decided, whose effects it may have seen;
- at most ``MAX_IN_FLIGHT`` batches wait; the committer waits for the
  oldest before deciding more;
- the store holds exactly the committed state only with nothing in flight,
  so a checkpoint starts, and a control (a promotion, a snapshot) runs,
  only once the pipeline is drained;
- a refused append (another writer) or an append whose outcome cannot be
  known when the replica loses the election fails every batch in flight,
  and the replica steps down and rebuilds its store from the journal.

A single node's local journal is not pipelined: its fdatasync is a fraction
of a millisecond and the segment files are written and synced by one
thread (the committer).  Measured under the node-capacity load past one
brain's capacity (270,000 nodes, 2 runs of each): with the fdatasync taken
out entirely the server achieved the same 22,200-23,700 writes/s, so
overlapping it with the next batch would not raise the capacity.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..journal import JournalFencedError, JournalUnavailableError
from ..mvcc import errors
from .items import Durable, SyncFailed, SyncOverdue
from .timeouts import REQUEST_TIMEOUT
from ..thread_names import name_os_thread

log = logging.getLogger("brain.engine")

# Batches a leader keeps in flight on a pipelined journal.  Deeper is not
# better where CPU is short: every batch costs a publish, and a committer
# that never waits appends smaller batches (on the 2-core development
# machine, with three replicas, three nats-servers and the client on it,
# 8 cost more CPU per write than waiting for each acknowledgement: one A/B
# run with the load average at 11-18, to be measured again on a quiet one).
MAX_IN_FLIGHT = 4


@dataclass(slots=True)
class InFlight:
    """A decided batch waiting for the journal: what to publish and whom to
    answer once every record up to ``index`` is acknowledged."""

    index: int  # its record's index, or the last appended before it (it appended nothing)
    revision: int  # the store's revision after it
    events: list  # its watch events
    admitted: list  # the writes it decided (Pending), answered with ``results``
    results: list
    barriers: list = field(default_factory=list)  # read-index requests, answered with ``index``
    nbytes: int = 0  # its record's size (the checkpointer counts journal bytes)
    appended_at: float = 0.0  # monotonic
    unwritten: bool = False  # decided without a record: counted when it was decided
    auth: tuple | None = None  # the store's take_auth after it: published with it (Committer.publish)


class Syncer:
    """The thread that waits for a pipelined journal's acknowledgements and
    posts what it learns to the committer: ``Durable(index)`` once every
    record up to ``index`` is acknowledged, ``SyncOverdue`` when records
    have waited past the request timeout (their callers are told, the
    records may still land), ``SyncFailed`` when they cannot land.

    A *session* is one span of leading: the committer starts a new one
    each time it leads or gives up its appends, and ignores what the
    syncer posts for an older one."""

    def __init__(self, journal, post: Callable[[object], None], give_up: Callable[[], bool]) -> None:
        self._journal = journal
        self._post = post
        self._give_up = give_up  # the election was lost or the engine closes: an unknown outcome stays unknown
        self._cv = threading.Condition()
        # under _cv: the session, its last index appended and the last one
        # synced (or given up), and when the oldest record not synced was
        # appended (for SyncOverdue)
        self._session = 0
        self._appended = 0
        self._synced = 0
        self._oldest_unsynced = 0.0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="brain-syncer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(5)

    def appended(self, index: int, session: int) -> None:
        """(committer) Record ``index`` of ``session`` was appended."""
        with self._cv:
            if session != self._session:
                self._session, self._appended, self._synced = session, 0, 0
            if self._appended <= self._synced:
                self._oldest_unsynced = time.monotonic()
            self._appended = index
            self._cv.notify()

    def _run(self) -> None:
        name_os_thread()  # else it keeps the OS name of the thread that started it
        while True:
            with self._cv:
                while not self._stopped and self._appended <= self._synced:
                    self._cv.wait()
                if self._stopped:
                    return
                session, target, since = self._session, self._appended, self._oldest_unsynced
            started = time.monotonic()
            try:
                self._journal.sync()
            except JournalUnavailableError as e:
                if self._give_up():
                    self._done(session, target, SyncFailed(e, session))
                    continue
                if time.monotonic() - since > REQUEST_TIMEOUT:
                    self._post(SyncOverdue(target, session))
                log.warning("journal unavailable (%s); retrying the append", e)
                time.sleep(0.2)
                continue
            except BaseException as e:  # noqa: BLE001 - a refusal, a closed journal: the committer decides
                self._done(session, target, SyncFailed(e, session))
                continue
            self._done(session, target, Durable(target, session, time.monotonic() - started))

    def _done(self, session: int, target: int, item) -> None:
        """Records up to ``target`` of ``session`` are settled one way or
        the other: tell the committer, and wait for later appends."""
        with self._cv:
            if self._session == session:
                self._synced = max(self._synced, target)
                if self._appended > target:
                    self._oldest_unsynced = time.monotonic()
        self._post(item)


class Pipeline:
    """The committer's batches in flight on a pipelined journal (the
    module docstring has the invariants), held by the committer, which it
    calls back to publish and answer: ``committer`` is
    brain.engine.committer.Committer."""

    def __init__(self, committer, journal) -> None:
        self._committer = committer
        self._journal = journal
        self._in_flight: deque[InFlight] = deque()
        self.session = 0  # one span of leading: a Durable of another is stale
        self._syncer = Syncer(journal, committer.post, committer.giving_up)

    def start(self) -> None:
        self._syncer.start()

    def stop(self) -> None:
        self._syncer.stop()

    @property
    def busy(self) -> bool:
        """Batches wait for the journal: the store is ahead of what is committed."""
        return bool(self._in_flight)

    @property
    def full(self) -> bool:
        """No room for another batch: MAX_IN_FLIGHT, or one while some
        replica would apply a deposed writer's stale messages."""
        allowed = self._committer.cluster.pipeline_allowed
        depth = MAX_IN_FLIGHT if allowed is None or allowed() else 1
        return len(self._in_flight) >= depth

    def new_session(self) -> None:
        """Leading begins or ends: whatever the syncer says of earlier
        appends is stale."""
        self.session += 1

    def append(self, entry: InFlight, payload: bytes) -> bool:
        """Publish ``entry``'s record; False when the append was refused and
        every caller in flight has been answered (the committer stepped
        down or failed)."""
        try:
            entry.index = self._journal.append(payload)
        except BaseException as e:  # noqa: BLE001 - answered like a failed sync, this batch included
            self._in_flight.append(entry)
            self.failed(SyncFailed(e, self.session))
            return False
        entry.appended_at = time.monotonic()
        self._in_flight.append(entry)
        self._syncer.appended(entry.index, self.session)
        return True

    def after_appended(self, entry: InFlight) -> None:
        """An outcome decided without a record (a failed compare answered
        within the read lease): answered once the batches appended before
        it, whose effects it may have seen, are acknowledged."""
        entry.unwritten = True
        if not self._in_flight:
            self._settle(entry)
            return
        entry.index = self._in_flight[-1].index
        self._in_flight.append(entry)

    def durable(self, items: list) -> None:
        """(committer) Publish and answer the batches the journal acknowledged."""
        for item in items:
            if item.session != self.session:
                continue
            for hook in self._committer.journal_sync_hooks:
                hook(item.seconds)
            while self._in_flight and self._in_flight[0].index <= item.index:
                self._settle(self._in_flight.popleft())

    def overdue(self, items: list) -> None:
        """(committer) Callers waited past the request timeout: they hear
        ErrTimeout (the batch may still land, and is published if it does)."""
        c = self._committer
        for item in items:
            if item.session != self.session:
                continue
            for entry in self._in_flight:
                if entry.index > item.index:
                    break
                for p in entry.admitted + entry.barriers:
                    c.settle(p, None, errors.ErrTimeout)

    def failed(self, item) -> None:
        """(committer) The batches in flight cannot land: answer them, then
        step down (another writer, or an outcome that cannot be known) or
        refuse writes until restart (any other error)."""
        if item.session != self.session:
            return
        c, e = self._committer, item.exc
        entries, self._in_flight = list(self._in_flight), deque()
        self.new_session()
        if isinstance(e, JournalFencedError):
            log.warning("another replica wrote to the journal (%s); stepping down", e)
            err, step_down = errors.ErrLeaderChanged, True
        elif isinstance(e, JournalUnavailableError):
            log.warning("giving up appends whose outcome is unknown (%s); stepping down", e)
            err, step_down = errors.ErrTimeoutDueToLeaderFail, True
        else:
            log.error("journal write failed (%r); refusing writes until restart", e)
            err, step_down = errors.ErrStopped, False
            c.fail(err, f"journal write failed: {e!r}")
        for entry in entries:
            for p in entry.admitted + entry.barriers:
                c.settle(p, None, err)
        if step_down and c.is_leader:
            c.replication.step_down_now(rebuild=True)

    def _settle(self, entry: InFlight) -> None:
        c = self._committer
        if entry.nbytes or entry.barriers:
            c.checkpointer.journaled(entry.nbytes)
            c.publish(entry.revision, entry.index, entry.events, entry.auth)
        for p in entry.barriers:
            c.settle(p, entry.index)
        if entry.unwritten:
            c.settle_results(entry.admitted, entry.results)
        elif entry.admitted:
            c.requests += len(entry.admitted)
            if c.is_leader:
                c.role.keeper.on_commit([p.request for p in entry.admitted], entry.results)
            c.settle_results(entry.admitted, entry.results)
