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

    def admit_writes(self, pending: int, arriving: list) -> tuple[list, list]:
        """(admitted, refused) of ``arriving`` client writes when ``pending``
        are queued already: the last ones beyond the limit are refused."""
        keep = max(0, self.max_pending_writes - pending)
        if keep >= len(arriving):
            return arriving, []
        self.writes_refused += len(arriving) - keep
        return arriving[:keep], arriving[keep:]

    def lease_grants(self, leases: int) -> "LeaseGrants":
        """What one commit batch's grants are checked with, ``leases``
        being the store's now."""
        return LeaseGrants(self, leases)


class LeaseGrants:
    """The grants of one commit batch: each admitted one counts, so that a
    batch cannot take the store past --max-leases."""

    __slots__ = ("limits", "leases")

    def __init__(self, limits: Limits, leases: int) -> None:
        self.limits = limits
        self.leases = leases

    def refuse(self, request) -> bool:
        """True for a grant that would make more than --max-leases (answer
        it ErrTooManyLeases); an admitted grant is counted."""
        if type(request) is not LeaseGrantRequest:
            return False
        if self.leases >= self.limits.max_leases:
            self.limits.grants_refused += 1
            return True
        self.leases += 1
        return False
