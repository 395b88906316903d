"""What the engine refuses to take more of, and how often it refused.

* Writes waiting for the committer: at most ``MAX_PENDING_WRITES`` (etcd's
  maxGapBetweenApplyAndCommitIndex, 5000).  etcd refuses a proposal with
  ``etcdserver: too many requests`` when its applied index lags its
  committed index by more; brain refuses a client's write when that many
  wait for the committer's next turn already.  The engine's own writes
  (lease expiries) and writes another replica forwarded (that replica
  checked them) are not refused.
* Leases: at most ``--max-leases`` (brain's own; etcd has no such limit).
  A grant that would make more is refused with ``etcdserver: too many
  leases`` (RESOURCE_EXHAUSTED, as etcd's other refusals of a resource);
  the count is the store's leases plus the grants of the same commit
  batch decided before it.

A refused request never reaches the store or the journal.
"""

from __future__ import annotations

from ..mvcc import errors
from ..mvcc.requests import LeaseGrantRequest

# etcd: maxGapBetweenApplyAndCommitIndex (server/etcdserver/v3_server.go)
MAX_PENDING_WRITES = 5000
DEFAULT_MAX_LEASES = 1_000_000


class Limits:
    """The limits and their refusal counts (read by the metrics)."""

    def __init__(self, max_leases: int = DEFAULT_MAX_LEASES, max_pending_writes: int = MAX_PENDING_WRITES) -> None:
        self.max_leases = max_leases
        self.max_pending_writes = max_pending_writes
        self.writes_refused = 0
        self.grants_refused = 0

    def too_many_writes(self, pending: int, arriving: int) -> int:
        """How many of ``arriving`` writes must be refused with
        ErrTooManyRequests when ``pending`` are queued already."""
        over = max(0, pending + arriving - self.max_pending_writes)
        over = min(over, arriving)
        self.writes_refused += over
        return over

    def lease_refusal(self, request, leases: int) -> errors.EtcdError | None:
        """ErrTooManyLeases for a grant that would make more than
        --max-leases (``leases``: those there are, counting the batch's
        grants admitted before it), else None."""
        if type(request) is LeaseGrantRequest and leases >= self.max_leases:
            self.grants_refused += 1
            return errors.ErrTooManyLeases
        return None
