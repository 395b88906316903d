"""The configurations the cluster groups run each kind of cluster in.

A comparison of brain's cluster with etcd's is only of the servers when both
run at the same settings where the settings decide the figure.  Failover is
timed by the election timeout: etcd elects after 1,000 ms without a
heartbeat (its default), brain after 500 ms (its default), so
``cluster-failover`` runs both at etcd's (``--election-timeout 1000
--heartbeat-interval 100`` on every member of both), and
``cluster-failover-brain-defaults`` runs brain at ``brain serve``'s own, the
figure an operator who sets nothing gets, as a row of its own.

Linearizable reads are decided by brain's read lease: the cluster groups run
brain at ``brain serve``'s default (whatever it is: the harness reads it from
brain.config), and the read-lease groups add the other setting as labelled
rows: ``cluster-read-barrier`` with ``--read-lease=false`` (every read
confirmed by a barrier record the journal's quorum acknowledged, as etcd
confirms a ReadIndex), ``cluster-read-lease`` with ``--read-lease=true``.
The one of the two whose setting is brain's default would measure
``cluster-load``'s range rows again, so it does not run (``redundant``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# etcd's defaults (etcd --election-timeout and --heartbeat-interval, ms): what both run at in cluster-failover.
ETCD_ELECTION_TIMEOUT_MS = 1000
ETCD_HEARTBEAT_INTERVAL_MS = 100
ETCD_TIMEOUTS = ("--election-timeout", str(ETCD_ELECTION_TIMEOUT_MS),
                 "--heartbeat-interval", str(ETCD_HEARTBEAT_INTERVAL_MS))


def brain_serve_defaults() -> dict:
    """What ``brain serve`` runs a replica with when given no flag: its read lease and election timings."""
    from brain.config import ServerConfig

    c = ServerConfig()
    return {"read_lease": bool(c.read_lease), "election_timeout_ms": int(c.election_timeout),
            "heartbeat_interval_ms": int(c.heartbeat_interval)}


@dataclass(frozen=True)
class ClusterGroup:
    """A cluster group's servers (None: every cluster) and the flags every member of each gets."""

    servers: tuple[str, ...] | None = None
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The brain defaults under which this group would repeat another's measurement: a reason, or "".
    repeats_when: tuple[str, object] | None = None  # (brain default's key, its value)
    repeats: str = ""  # the group whose rows it would repeat

    def member_args(self, server: str) -> tuple[str, ...]:
        return self.args.get(server, ())


CLUSTER_GROUPS = {
    "cluster-load": ClusterGroup(),
    "cluster-read-barrier": ClusterGroup(servers=("brain",), args={"brain": ("--read-lease=false",)},
                                         repeats_when=("read_lease", False), repeats="cluster-load"),
    "cluster-read-lease": ClusterGroup(servers=("brain",), args={"brain": ("--read-lease=true",)},
                                       repeats_when=("read_lease", True), repeats="cluster-load"),
    "cluster-failover": ClusterGroup(args={"brain": ETCD_TIMEOUTS, "etcd-3.6": ETCD_TIMEOUTS}),
    "cluster-failover-brain-defaults": ClusterGroup(servers=("brain",),
                                                    repeats_when=("election_timeout_ms", ETCD_ELECTION_TIMEOUT_MS),
                                                    repeats="cluster-failover"),
}


def redundant(group: str, defaults: dict) -> str:
    """Why ``group`` would only repeat another group's measurement under brain's ``defaults`` ("" if not)."""
    spec = CLUSTER_GROUPS.get(group)
    if spec is None or spec.repeats_when is None:
        return ""
    key, value = spec.repeats_when
    if key == "election_timeout_ms":
        same = (defaults.get(key), defaults.get("heartbeat_interval_ms")) == (value, ETCD_HEARTBEAT_INTERVAL_MS)
    else:
        same = defaults.get(key) == value
    if not same:
        return ""
    return (f"{group} not run: brain's defaults ({describe(defaults)}) are its settings, so {spec.repeats} "
            f"measured its rows")


def runs_on(group: str, server: str, defaults: dict) -> bool:
    """Whether ``group`` runs on ``server``'s cluster under brain's ``defaults``."""
    spec = CLUSTER_GROUPS.get(group, ClusterGroup())
    return (spec.servers is None or server in spec.servers) and not redundant(group, defaults)


def describe(defaults: dict) -> str:
    """brain serve's defaults as a label: "read lease on, election timeout 500 ms, heartbeat 100 ms"."""
    if not defaults:
        return "not recorded"
    return (f"read lease {'on' if defaults.get('read_lease') else 'off'}, election timeout "
            f"{defaults.get('election_timeout_ms')} ms, heartbeat {defaults.get('heartbeat_interval_ms')} ms")
