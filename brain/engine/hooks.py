"""What a replica's engine asks of the cluster it belongs to: one frozen
object, given to ``Engine.open`` (brain.cluster builds it; a single node
has none).  The engine reaches its cluster through these callables alone,
so the seam between them is this one page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .roles import Forwarder


@dataclass(frozen=True)
class ClusterHooks:
    """What a replica's engine asks of the cluster it belongs to
    (brain.cluster builds it; a single node has none).  Every callable may
    be called from any thread."""

    forwarder: Callable[[], Forwarder | None]  # how a follower reaches the leader now (None: no leader)
    leader_hint: Callable[[], int]  # the member ID the election names (0: none)
    has_leader: Callable[[], bool]  # etcd's "has a leader": require-leader, health, metrics
    election_timeout: float  # seconds: how often require-leader checks an open stream
    role_changed: Callable[[], None]  # called on the committer after the role or the leader changed
    # True while this replica, leading, may read without asking the journal
    # (brain.cluster.election.Election.lease_valid); None: the lease is off
    read_lease: Callable[[], bool] | None = None
    # True while every replica reads a deposed writer's stale messages as
    # empty records, so a leader may keep appends in flight
    # (brain.engine.pipeline); None: always
    pipeline_allowed: Callable[[], bool] | None = None
    # called once (on the committer, or the thread that found the fault)
    # when the engine starts refusing writes until restart (Committer.fail):
    # this replica can never lead again, so it must leave the election
    engine_failed: Callable[[str], None] | None = None
