"""Linearizable reads on a replica of a shared journal: the read index.

A replica serves reads from its own memory, which may lag the journal: a
write acknowledged by the leader a moment ago may not be applied here yet.
So a linearizable read first gets a *read index*, an index no lower than
any record acknowledged before the read began, and waits until this
replica has applied up to it.  It is etcd's ReadIndex, with the replicated
journal in the role of the Raft leader and its quorum confirming the index:
the leader appends a barrier record (an empty one unless a write batch
goes out anyway) and the index is that record's once JetStream acknowledged
it, which needs a quorum of the stream's replicas to have stored it after
every record acknowledged before.  A deposed leader, of brain or of the
NATS stream, gets no such acknowledgement, so a read behind it fails or
waits; it never answers from a stale end.  The leader within its read
lease knows the index without a record (Engine.read_barrier).  Where the
index comes from is the engine's ``ask``: brain.cluster asks the leader.

Batching: a round trip serves every read that was waiting when it was
*sent*.  A read that arrives while round trips are in flight waits for the
next one, because the answers of those may predate a write that was
acknowledged before that read began.  Up to ``max_in_flight`` round trips
overlap, so a read waits about one round trip, not one and a half.

Worked example (max_in_flight 1).  Applied index 40.  Reads r1, r2 arrive:
round trip A is sent.  r3 arrives (A in flight).  A answers 42: r1 and r2
wait for index 42; round trip B is sent for r3.  The replica applies 41,
42: r1 and r2 go ahead.  B answers 42: r3 goes ahead at once.  (With
max_in_flight 2, B would have been sent when r3 arrived.)

Threads: ``request`` is called by reader threads, answers arrive on the
journal's thread, ``applied`` is called by the engine's committer; the lock
here is never held while calling out.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import threading
import time
from typing import Callable

from ..mvcc import errors
from .timeouts import REQUEST_TIMEOUT

log = logging.getLogger("brain.engine.readindex")

DEFAULT_TIMEOUT = REQUEST_TIMEOUT  # etcd's read index waits up to its request timeout


class ReadBarrier:
    """Groups linearizable reads behind read-index round trips.

    ``ask(callback)`` starts a round trip (``callback(index, exc)``: the
    index of an acknowledged barrier record, or the leader's within its
    lease);
    ``applied_index()`` is this replica's applied index; ``ahead(index)`` is
    called when the journal reports an index this replica has no record of
    being on its way (a leader that missed another writer's appends).
    """

    def __init__(self, ask: Callable, applied_index: Callable[[], int], *,
                 ahead: Callable[[int], None] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic, max_in_flight: int = 1) -> None:
        self._ask = ask
        self._applied_index = applied_index
        self._ahead = ahead
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: list = []  # callbacks not yet covered by a round trip
        self._waiting_at: list = []  # when each of them came (same order)
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._parked: list = []  # heap of (index, seq, deadline, callbacks)
        self._sent: list = []  # the groups of the round trips in flight
        self._sent_at: list = []  # when each group's oldest read came (same order)
        self._seq = itertools.count()
        self.round_trips = 0

    def use_source(self, ask: Callable) -> None:
        """Start later round trips with ``ask`` instead."""
        self._ask = ask

    def request(self, callback: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            self._waiting.append(callback)
            self._waiting_at.append(self._clock())
            if self._in_flight >= self.max_in_flight:
                return
            group = self._take_waiting()
            self._in_flight += 1
        self._send(group)

    def _take_waiting(self) -> list:
        """(under the lock) The waiting reads as the group of a round trip
        about to be sent."""
        group, self._waiting = self._waiting, []
        self._sent.append(group)
        self._sent_at.append(self._waiting_at[0] if self._waiting_at else self._clock())
        self._waiting_at = []
        return group

    def wait_index(self, index: int, callback: Callable[[BaseException | None], None]) -> bool:
        """Like a round trip that answered ``index`` (a read index known
        without asking, e.g. the leader's own last append): True if it is
        applied already, else ``callback`` follows once it is."""
        if index <= self._applied_index():
            return True
        with self._lock:
            heapq.heappush(self._parked, (index, next(self._seq), self._clock() + self.timeout, [callback]))
        ready = self._release(self._applied_index())  # applied meanwhile
        _call_all(ready, None)
        return False

    def _send(self, group: list) -> None:
        self.round_trips += 1
        started = self._clock()
        try:
            self._ask(lambda index, exc: self._answered(group, started, index, exc))
        except BaseException as e:  # noqa: BLE001 - the reads fail, the server goes on
            self._answered(group, started, None, e)

    def _answered(self, group: list, started: float, index: int | None, exc: BaseException | None) -> None:
        with self._lock:
            for i, g in enumerate(self._sent):
                if g is group:
                    del self._sent[i]
                    del self._sent_at[i]
                    break
            else:
                group = []  # failed by fail_all or expire meanwhile
        ready: list = []
        failed: list = []
        if exc is not None:
            log.debug("read index round trip failed: %r", exc)
            failed = group
        elif index <= self._applied_index():
            ready = group
        else:
            if self._ahead is not None:
                self._ahead(index)
            with self._lock:
                heapq.heappush(self._parked, (index, next(self._seq), started + self.timeout, group))
            # the committer may have applied it meanwhile
            ready = self._release(self._applied_index())
        with self._lock:
            nxt = None
            if self._waiting:
                nxt = self._take_waiting()
            else:
                self._in_flight -= 1
        _call_all(ready, None)
        if failed:
            err = exc if isinstance(exc, errors.EtcdError) else errors.ErrTimeout
            _call_all(failed, err)
        if nxt is not None:
            self._send(nxt)

    def _release(self, applied: int) -> list:
        out: list = []
        with self._lock:
            parked = self._parked
            while parked and parked[0][0] <= applied:
                out.extend(heapq.heappop(parked)[3])
        return out

    def applied(self, index: int) -> None:
        """The replica has applied up to ``index`` (the committer calls it)."""
        if self._parked:
            _call_all(self._release(index), None)

    def expire(self) -> None:
        """Fail reads that waited longer than the timeout (called
        periodically by the committer): parked for the replica to apply a
        read index, and also those whose round trip has not answered, or
        not even gone out behind one that has not: a journal that does not
        answer (a stream leader cut from its peers) must not hold a read
        past etcd's request timeout.  A round trip that answers after its
        reads were failed releases its slot and answers no one."""
        if not (self._parked or self._sent_at or self._waiting_at):
            return
        now = self._clock()
        late: list = []
        with self._lock:
            cutoff = now - self.timeout
            while self._sent_at and min(self._sent_at) <= cutoff:
                i = self._sent_at.index(min(self._sent_at))
                late.extend(self._sent.pop(i))
                del self._sent_at[i]
            k = bisect.bisect_right(self._waiting_at, cutoff)
            if k:
                late.extend(self._waiting[:k])
                del self._waiting[:k]
                del self._waiting_at[:k]
            keep = []
            for item in self._parked:
                if item[2] <= now:
                    late.extend(item[3])
                else:
                    keep.append(item)
            if late:
                heapq.heapify(keep)
                self._parked = keep
        _call_all(late, errors.ErrTimeout)

    def fail_all(self, err: errors.EtcdError) -> None:
        with self._lock:
            parked, self._parked = self._parked, []
            waiting, self._waiting = self._waiting, []
            sent, self._sent = self._sent, []
            self._waiting_at, self._sent_at = [], []
        _call_all([cb for item in parked for cb in item[3]] + waiting + [cb for g in sent for cb in g], err)


def _call_all(callbacks: list, exc) -> None:
    for cb in callbacks:
        try:
            cb(exc)
        except Exception:  # noqa: BLE001 - one caller's bug must not stop the others
            log.exception("read barrier callback failed")
