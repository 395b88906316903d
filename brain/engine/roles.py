"""The engine's two roles as objects: what a replica does differently while
it leads and while it follows.

A *leader* decides writes (its committer commits them), runs the lease
clocks and auto-compaction, and answers lease calls from those clocks.  A
*follower* sends its clients' writes and lease calls to the leader (through
brain.cluster's forwarder), since only the leader holds the clocks.  The
engine holds exactly one role at a time; a single node leads from the
start, a replica of a shared journal starts following and swaps its role
when it is promoted or steps down (brain.engine.replication).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Protocol

from ..mvcc import errors
from .compactor import Compactor
from .leases import LeaseKeeper, LeaseLeasesResult, LeaseTimeToLiveResult
from .timeouts import REQUEST_TIMEOUT

LEADER = "leader"
FOLLOWER = "follower"



class Forwarder(Protocol):
    """How a follower reaches the leader (brain.cluster.forwarding)."""

    def forward(self, requests: list, done: Callable[[list | errors.EtcdError], None],
                wires: list | None = None) -> None:
        """Have the leader decide ``requests``; ``done(results)`` (one result
        or EtcdError each, in order) or ``done(error)`` for all of them,
        on any thread.  ``wires``: for each request the TxnRequest bytes its
        client sent, or None; they may be sent instead of the request."""

    def call(self, op: str, args: list, done: Callable[[object, BaseException | None], None]) -> None:
        """A lease operation only the leader can answer ("keepalive" with
        [ids], "ttl" with [id, keys], "leases" with [])."""


class Leader:
    """Leading: the lease clocks (``keeper``) and the ``compactor`` run
    until ``stop`` (the committer decides the writes)."""

    name = LEADER

    def __init__(self, keeper: LeaseKeeper, compactor: Compactor, *,
                 committed_revision: Callable[[], int],
                 attached_keys: Callable[[int], list[bytes]]) -> None:
        self.keeper = keeper
        self.compactor = compactor
        self._committed_revision = committed_revision
        self._attached_keys = attached_keys

    def within_read_lease(self, read_lease: Callable[[], bool] | None) -> bool:
        """True while no other writer can exist (see Engine.read_barrier)."""
        return read_lease is not None and read_lease()

    def lease_keepalive(self, lease_id: int) -> int:
        return self.keeper.renew(lease_id)

    def lease_keepalive_many(self, lease_ids, callback) -> None:
        callback(self.renew_leases(lease_ids))

    def renew_leases(self, lease_ids) -> list:
        out = []
        for lease_id in lease_ids:
            try:
                out.append((lease_id, self.keeper.renew(lease_id)))
            except errors.EtcdError as e:
                out.append((lease_id, 0 if e == errors.ErrLeaseNotFound else e))
        return out

    def lease_time_to_live(self, lease_id: int, keys: bool) -> LeaseTimeToLiveResult:
        left = self.keeper.remaining(lease_id)
        if left is None:
            raise errors.ErrLeaseNotFound.fresh()
        attached = self._attached_keys(lease_id) if keys else []
        return LeaseTimeToLiveResult(self._committed_revision(), lease_id, int(left[0]), left[1], attached)

    def lease_leases(self) -> LeaseLeasesResult:
        return LeaseLeasesResult(self._committed_revision(), self.keeper.ids_by_expiry())

    def leases_expired(self) -> int:
        return self.keeper.expired_total

    def stop(self, wait: bool) -> None:
        """Stop the lease clocks and the compactor; ``wait`` for the
        compactor's thread (not on the committer: it may be waiting for a
        write)."""
        self.compactor.stop(wait=wait)
        self.keeper.stop()


class Follower:
    """Following: lease calls go to the leader through ``forwarder()``
    (None: no leader known); writes too (the committer forwards them)."""

    name = FOLLOWER

    def __init__(self, forwarder: Callable[[], Forwarder | None]) -> None:
        self._forwarder = forwarder

    def within_read_lease(self, read_lease: Callable[[], bool] | None) -> bool:
        return False

    def lease_keepalive(self, lease_id: int) -> int:
        return self._call("keepalive", [lease_id])[0][1]

    def lease_keepalive_many(self, lease_ids, callback) -> None:
        """(any thread) Keep-alives go to the leader."""
        lease_ids = list(lease_ids)

        def done(result, exc) -> None:
            if exc is not None:
                err = exc if isinstance(exc, errors.EtcdError) else errors.ErrTimeout
                callback([(i, err) for i in lease_ids])
            else:
                callback([(lease_id, outcome) for lease_id, outcome in result])

        forwarder = self._forwarder()
        if forwarder is None:
            done(None, errors.ErrNoLeader)
            return
        forwarder.call("keepalive", lease_ids, done)

    def renew_leases(self, lease_ids) -> list:
        return [(lease_id, errors.ErrNotLeader) for lease_id in lease_ids]

    def lease_time_to_live(self, lease_id: int, keys: bool) -> LeaseTimeToLiveResult:
        return self._call("ttl", [lease_id, keys])

    def lease_leases(self) -> LeaseLeasesResult:
        return self._call("leases", [])

    def leases_expired(self) -> int:
        return 0  # the leader's clocks expire leases

    def stop(self, wait: bool) -> None:
        """Nothing runs for a follower's role (following is the journal's)."""

    def _call(self, op: str, args: list, timeout: float = REQUEST_TIMEOUT):
        """(any thread but the committer) A lease query for the leader;
        blocks for the answer."""
        forwarder = self._forwarder()
        if forwarder is None:
            raise errors.ErrNoLeader.fresh()
        fut: Future = Future()

        def done(result, exc) -> None:
            if exc is not None:
                fut.set_exception(errors.raisable(exc))
            else:
                fut.set_result(result)

        forwarder.call(op, args, done)
        try:
            return fut.result(timeout)
        except TimeoutError:
            raise errors.ErrTimeout.fresh() from None
