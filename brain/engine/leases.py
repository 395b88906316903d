"""Lease time: deadlines, keep-alives and expiry.

The store (brain.mvcc.lease) knows which leases exist and which keys each
one holds; this module adds the clock, the way etcd's lessor does on the
leader:

* every committed LeaseGrant starts a deadline ``now + ttl`` on a monotonic
  clock; a keep-alive moves it to ``now + ttl`` again.  Keep-alives are not
  journaled (etcd does not put them through raft either);
* deadlines live in one binary heap with lazy invalidation: a renewal pushes
  a new entry and bumps the lease's generation, so the old entry is skipped
  when it surfaces.  A renewal is O(log n) and no thread or timer exists per
  lease; the heap is rebuilt when stale entries outnumber live ones;
* one expiry thread sleeps until the earliest deadline and revokes what
  expired through the engine's ordinary write path (``LeaseRevokeRequest``),
  so an expiry is journaled and deletes the lease's keys in one revision
  with delete events, exactly like a client's revoke.  At most
  ``max_inflight`` revokes are outstanding, so a pile of simultaneous
  expiries cannot flood one batch.  A revoke that fails is retried after
  ``retry_interval`` (etcd: its request timeout, 7 s by default);
* an expired lease still exists until its revoke commits (etcd too: a Put
  naming it is accepted meanwhile and its key is deleted by the revoke); a
  keep-alive on it waits for the revoke and then reports "not found";
* after a restart every lease gets its full TTL again, plus etcd's
  election-timeout extension, and when there are many leases their
  deadlines are spread so no more than 3/4 of etcd's revoke rate fall into
  any second (etcd's ``lessor.Promote``).

Server-chosen lease IDs follow etcd's generator: the member ID's low 16 bits,
then a 40-bit millisecond timestamp and an 8-bit counter that is incremented
per ID (and may carry into the timestamp), masked to a positive int64.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..mvcc import errors
from ..mvcc.lease import MAX_LEASE_TTL
from ..mvcc.requests import LeaseGrantRequest, LeaseGrantResult, LeaseRevokeRequest, LeaseRevokeResult, unwrapped
from .timeouts import REQUEST_TIMEOUT
from ..thread_names import name_os_thread

log = logging.getLogger("brain.engine.leases")

# etcd's minimum TTL is ceil(1.5 * election timeout); with the default
# 1000 ms election timeout that is 2 s (observed: Grant(TTL=1) -> TTL 2).
MIN_LEASE_TTL = 2
# etcd's leader refreshes every lease to ttl + election timeout when it
# takes office (observed: a 10 s lease reads remaining 10 right after a
# restart, i.e. more than 10 s left).
RECOVERY_EXTEND_SECONDS = 1.0
# etcd's lessor retries an expired lease whose revoke did not complete after
# the server's request timeout.
EXPIRED_RETRY_SECONDS = REQUEST_TIMEOUT
# etcd revokes at most this many leases per second; recovery spreads
# deadlines to 3/4 of it.
LEASE_REVOKE_RATE = 1000
DEFAULT_MAX_INFLIGHT = 1000
# A keep-alive on an expired lease waits this long for its revoke.
RENEW_WAIT_SECONDS = EXPIRED_RETRY_SECONDS

_INT63 = (1 << 63) - 1


@dataclass(slots=True)
class LeaseTimeToLiveResult:
    revision: int
    id: int
    ttl: int  # remaining seconds, truncated toward zero like etcd
    granted_ttl: int
    keys: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class LeaseLeasesResult:
    revision: int
    ids: list[int]


def effective_ttl(ttl: int, min_ttl: int = MIN_LEASE_TTL) -> int:
    """The TTL etcd grants for a requested one: below the minimum (zero and
    negative included) the minimum; the too-large check comes first."""
    if ttl > MAX_LEASE_TTL:
        raise errors.ErrLeaseTTLTooLarge.fresh()
    return ttl if ttl >= min_ttl else min_ttl


class IdGenerator:
    """etcd's idutil.Generator, reduced to positive int64 lease IDs."""

    _TS_BITS, _CNT_BITS = 40, 8
    _SUFFIX_BITS = _TS_BITS + _CNT_BITS

    def __init__(self, member_id: int, now_ms: int | None = None) -> None:
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        self._prefix = (member_id & 0xFFFF) << self._SUFFIX_BITS
        self._suffix = (now_ms & ((1 << self._TS_BITS) - 1)) << self._CNT_BITS
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._suffix += 1
            suffix = self._suffix
        return (self._prefix | (suffix & ((1 << self._SUFFIX_BITS) - 1))) & _INT63


class _Timer:
    """One lease's clock.  ``when`` is the time of its one valid heap entry
    (the deadline, or a retry time once expired); ``gen`` identifies it."""

    __slots__ = ("ttl", "deadline", "when", "gen", "revoked")

    def __init__(self, ttl: int, deadline: float, gen: int) -> None:
        self.ttl = ttl
        self.deadline = deadline
        self.when = deadline
        self.gen = gen
        self.revoked: threading.Event | None = None  # made when someone waits


class LeaseKeeper:
    """Deadlines of the live leases; see the module docstring.

    ``revoke(id)`` must queue a LeaseRevokeRequest and return its Future; the
    engine tells the keeper about committed grants and revokes through
    ``on_commit`` (or ``granted``/``revoked``).  ``clock`` is injectable for
    tests, which can drive expiry with ``expire_due()`` instead of
    ``start()``ing the thread.
    """

    def __init__(
        self,
        revoke: Callable[[int], Future],
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_interval: float = EXPIRED_RETRY_SECONDS,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        renew_wait: float = RENEW_WAIT_SECONDS,
    ) -> None:
        self._revoke = revoke
        self._clock = clock
        self.retry_interval = retry_interval
        self.max_inflight = max_inflight
        self.renew_wait = renew_wait
        self._cv = threading.Condition(threading.Lock())
        self._timers: dict[int, _Timer] = {}
        self._heap: list[tuple[float, int, int]] = []  # (when, id, gen)
        self._gen = 0
        self._inflight = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.expired_total = 0  # expiry revokes submitted (statistics)
        self._failures = 0
        self._failure_logged = float("-inf")

    # ------------------------------------------------------------------
    # bookkeeping

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, lease_id: int) -> bool:
        return lease_id in self._timers

    @property
    def heap_size(self) -> int:
        return len(self._heap)

    def _push(self, lease_id: int, t: _Timer, when: float) -> None:
        self._gen += 1
        t.gen = self._gen
        t.when = when
        heapq.heappush(self._heap, (when, lease_id, t.gen))
        if len(self._heap) > 2 * len(self._timers) + 1024:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(t.when, i, t.gen) for i, t in self._timers.items()]
        heapq.heapify(self._heap)

    def granted(self, lease_id: int, ttl: int) -> None:
        now = self._clock()
        with self._cv:
            old = self._timers.pop(lease_id, None)
            if old is not None and old.revoked is not None:
                old.revoked.set()
            t = _Timer(ttl, now + ttl, 0)
            self._timers[lease_id] = t
            wake = not self._heap or now + ttl < self._heap[0][0]
            self._push(lease_id, t, now + ttl)
            if wake:
                self._cv.notify()

    def revoked(self, lease_id: int) -> None:
        with self._cv:
            t = self._timers.pop(lease_id, None)
            if t is not None and t.revoked is not None:
                t.revoked.set()
            # its heap entries are dropped when they surface

    def on_commit(self, requests, results) -> None:
        """Called by the committer with a batch's requests and results once
        they are durable, before the callers are answered."""
        for req, res in zip(requests, results):
            req = unwrapped(req)
            if isinstance(req, LeaseGrantRequest):
                if isinstance(res, LeaseGrantResult):
                    self.granted(res.id, res.ttl)
            elif isinstance(req, LeaseRevokeRequest) and isinstance(res, LeaseRevokeResult):
                self.revoked(req.id)

    def restore(self, leases: Iterable[tuple[int, int]], extend: float = RECOVERY_EXTEND_SECONDS,
                revoke_rate: int = LEASE_REVOKE_RATE) -> None:
        """Give every recovered lease ((id, ttl) pairs) a deadline of
        ttl + extend from now; with at least `revoke_rate` leases, spread
        deadlines so that no window of one second gets more than 3/4 of the
        revoke rate (etcd's lessor.Promote)."""
        now = self._clock()
        items = sorted(((now + ttl + extend, lease_id, ttl) for lease_id, ttl in leases))
        if len(items) >= revoke_rate:
            items = _spread(items, now, revoke_rate)
        with self._cv:
            for deadline, lease_id, ttl in items:
                self._gen += 1
                self._timers[lease_id] = _Timer(ttl, deadline, self._gen)
            self._rebuild()
            self._cv.notify()

    # ------------------------------------------------------------------
    # keep-alive and inspection

    def renew(self, lease_id: int) -> int:
        """Restart the lease's deadline; returns its TTL.  Raises
        ErrLeaseNotFound for an unknown lease, and for an expired one after
        its revoke completed (ErrTimeout if that takes over `renew_wait`).

        A stopped keeper raises ErrNotLeader: its clocks are nobody's (the
        leader that ran them stepped down, or the engine closes), so a
        renewal acknowledged here would hold on no leader; the client asks
        again where the lead is, as a follower's answer tells it to."""
        with self._cv:
            if self._stopping:
                raise errors.ErrNotLeader.fresh()
            t = self._timers.get(lease_id)
            if t is None:
                raise errors.ErrLeaseNotFound.fresh()
            now = self._clock()
            if t.deadline > now:
                t.deadline = now + t.ttl
                self._push(lease_id, t, t.deadline)
                return t.ttl
            if t.revoked is None:
                t.revoked = threading.Event()
            ev = t.revoked
            self._cv.notify()  # the expiry thread may not have seen it yet
        if not ev.wait(self.renew_wait):
            raise errors.ErrTimeout.fresh()
        if self._stopping:
            raise errors.ErrStopped.fresh()
        raise errors.ErrLeaseNotFound.fresh()

    def remaining(self, lease_id: int) -> tuple[float, int] | None:
        """(seconds left, may be negative once expired; granted TTL)."""
        with self._cv:
            t = self._timers.get(lease_id)
            if t is None:
                return None
            return t.deadline - self._clock(), t.ttl

    def ids_by_expiry(self) -> list[int]:
        with self._cv:
            pairs = [(t.deadline, i) for i, t in self._timers.items()]
        pairs.sort()
        return [i for _, i in pairs]

    def next_deadline(self) -> float | None:
        with self._cv:
            self._drop_stale()
            return self._heap[0][0] if self._heap else None

    # ------------------------------------------------------------------
    # expiry

    def _drop_stale(self) -> None:
        heap, timers = self._heap, self._timers
        while heap:
            when, lease_id, gen = heap[0]
            t = timers.get(lease_id)
            if t is not None and t.gen == gen:
                return
            heapq.heappop(heap)

    def _pop_due(self, now: float, limit: int) -> list[int]:
        """Leases whose deadline passed (at most `limit`); each is re-armed
        to be retried after `retry_interval` unless its revoke commits."""
        due: list[int] = []
        heap, timers = self._heap, self._timers
        while heap and len(due) < limit:
            when, lease_id, gen = heap[0]
            t = timers.get(lease_id)
            if t is None or t.gen != gen:
                heapq.heappop(heap)
                continue
            if when > now:
                break
            heapq.heappop(heap)
            self._gen += 1
            t.gen = self._gen
            t.when = now + self.retry_interval
            heapq.heappush(heap, (t.when, lease_id, t.gen))
            due.append(lease_id)
        return due

    def expire_due(self) -> list[int]:
        """One expiry pass: submit revokes for what is due now (within the
        in-flight limit).  Returns the lease IDs submitted."""
        with self._cv:
            room = self.max_inflight - self._inflight
            due = self._pop_due(self._clock(), room) if room > 0 else []
            self._inflight += len(due)
        self._submit(due)
        return due

    def _submit(self, due: list[int]) -> None:
        for lease_id in due:
            self.expired_total += 1
            try:
                fut = self._revoke(lease_id)
            except BaseException as e:  # noqa: BLE001 - retried later
                log.warning("cannot revoke expired lease %x: %r", lease_id, e)
                self._revoke_done(lease_id, None)
                continue
            fut.add_done_callback(lambda f, i=lease_id: self._revoke_done(i, f))

    def _revoke_done(self, lease_id: int, fut: Future | None) -> None:
        exc = None if fut is None else fut.exception()
        with self._cv:
            self._inflight -= 1
            if exc == errors.ErrLeaseNotFound:
                # revoked meanwhile by a client: forget it
                t = self._timers.pop(lease_id, None)
                if t is not None and t.revoked is not None:
                    t.revoked.set()
            self._cv.notify()
        if exc is not None and exc != errors.ErrLeaseNotFound and not self._stopping:
            # one line per few seconds, however many leases fail at once
            self._failures += 1
            now = time.monotonic()
            if now - self._failure_logged >= 5.0:
                log.warning("revoking expired lease %x failed (%s); %d failure(s) since the last report, "
                            "each retried in %.0fs", lease_id, exc, self._failures, self.retry_interval)
                self._failure_logged = now
                self._failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="brain-lease-expiry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            for t in self._timers.values():
                if t.revoked is not None:
                    t.revoked.set()
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        name_os_thread()  # else it keeps the OS name of the thread that started it
        while True:
            with self._cv:
                due: list[int] = []
                while not self._stopping:
                    now = self._clock()
                    room = self.max_inflight - self._inflight
                    if room > 0:
                        due = self._pop_due(now, room)
                        if due:
                            break
                        self._drop_stale()
                        timeout = self._heap[0][0] - now if self._heap else None
                    else:
                        timeout = None  # woken when a revoke completes
                    # never sleep long: the clock may be stepped in tests and
                    # a bound keeps a missed notification harmless
                    self._cv.wait(1.0 if timeout is None else min(max(timeout, 0.001), 1.0))
                if self._stopping:
                    return
                self._inflight += len(due)
            self._submit(due)


def _spread(items: list[tuple[float, int, int]], now: float, revoke_rate: int) -> list[tuple[float, int, int]]:
    """etcd's pile-up avoidance on promotion, on sorted (deadline, id, ttl)."""
    target = (3 * revoke_rate) // 4
    out = []
    base = items[0][0] - now
    next_window = base + 1.0
    expires = 0
    for deadline, lease_id, ttl in items:
        remaining = deadline - now
        if remaining > next_window:
            base = remaining
            next_window = base + 1.0
            expires = 1
            out.append((deadline, lease_id, ttl))
            continue
        expires += 1
        if expires <= target:
            out.append((deadline, lease_id, ttl))
            continue
        delay = expires / target - (remaining - base)
        next_window = base + delay
        out.append((deadline + delay, lease_id, ttl))
    return out
