"""The sizes of a benchmark run: the full run's and the smoke's.

Every field is recorded in the run's JSON (``meta.settings``) and fills the
``{fields}`` of the catalogue's titles (benchmarks/workloads.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.workloads import clients_of


@dataclass(frozen=True)
class Settings:
    """The sizes of one kind of run (FULL, SMOKE); ``--rounds``, ``--duration`` and
    ``--restart-samples`` replace fields of it."""

    name: str
    rounds: int
    duration: float            # seconds of each timed phase (put, range, txn-put, list, count, watch)
    # The client counts come from the catalogue (recorded here for the run's JSON).
    put_clients: tuple = clients_of("put")
    range_clients: tuple = clients_of("range")
    txn_clients: tuple = clients_of("txn-put")
    keyspace: int = 100_000    # put / txn-put key space
    val_size: int = 256
    list_keys: int = 100_000
    list_limit: int = 500
    list_clients: int = 4
    watch_watchers: int = 1000
    watch_writers: int = 4
    watch_events: int = 200    # keys put, as fast as they go; each event goes to every watcher
    watch_timeout: float = 40  # for watch creation, and for deliveries after the last put
    lease_leases: int = 10_000
    lease_ttl: int = 5
    keepalive_leases: int = 10_000   # kept alive through one LeaseKeepAlive stream
    keepalive_ttl: int = 5
    keepalive_window: int = 1000     # keep-alives in flight on the stream at most
    keepalive_duration: float = 8.0  # the timed phase: longer than the TTL, so a lease left behind expires
    k8s_nodes: int = 10_000
    k8s_pods: int = 3_000
    k8s_pod_rate: int = 200
    k8s_duration: float = 10.0
    restart_keys: int = 1_000_000
    restart_val: int = 1024
    restart_chunk: int = 100_000
    restart_load_cap: float = 540.0   # seconds of loading allowed per server (kine: ~2k keys/s)
    # Overwrites before the kill -9: 30,000 x 1,079 B of brain journal payload (measured per 1 KiB
    # Put) = 30.9 MiB, 96.5% of brain's first checkpoint threshold (32 MiB; 500k records and 60 s
    # are reached later at this size and rate), so brain replays its largest journal tail.
    restart_tail: int = 30_000
    # Starts timed per restart row (SIGTERM, kill -9) on the one loaded data dir: a row's value is
    # their median, its target is judged on the worst.
    restart_samples: int = 3
    # The scale group (issue 17): keys of Kubernetes shapes (brainload scale-load), then a share of
    # them overwritten; reads of the whole data set, restarts.  --scale-keys 10000000 for the 10M run.
    scale_keys: int = 1_000_000
    # brainload's value sizes: "kubernetes" (about 1 KiB a value) or "small" (about 540 B: mostly
    # node leases and events, a few 4 KiB pods), which the 10M run takes to fit this machine.
    scale_mix: str = "kubernetes"
    scale_overwrite: float = 0.2     # overwrites after the create, as a share of the keys
    scale_seed: int = 17
    scale_clients: int = 64          # the load's clients (one gRPC connection per 8) ...
    scale_batch: int = 64            # ... each writing Txns of this many puts (etcd's --max-txn-ops: 128)
    scale_tail: int = 25_000         # overwrites before the kill -9 (about 25 MiB: under brain's 32 MiB checkpoint threshold)
    # SIGTERM and kill -9 starts timed per server: the restart targets need MIN_RESTART_SAMPLES (3) of
    # every server they compare (brain's worst against etcd's median).
    scale_restart_samples: int = 3
    # Rounds of the scale group (servers alternating, order rotating): 1 by default, as a 10M round
    # takes most of an hour; 3 with --scale-restart-samples 1 gives 3 runs of every row and 3 starts.
    scale_rounds: int = 1
    # The watch from before the load may take this long (seconds), then it is recorded as not finished
    # with the events it got: etcd reads every revision since the watch's start for each catch-up step
    # (12M at 10M keys), and its watch of the 480k pod events had delivered almost none after 23 min.
    scale_watch_limit: float = 900.0
    # --profile-scale-reads: each scale read once more under the profilers (brainload's Go CPU profile, py-spy on
    # brain), the split of the client's CPU and the server's by function in the record (benchmarks/profiles.py).
    scale_profile: bool = False
    # Node capacity (issue 24): steps of brainload node-capacity, each on a freshly started server (or
    # cluster); N ramps from capacity_start by capacity_factor until a step fails, then is bisected until
    # the first failing N is within capacity_resolution of the last passing one (benchmarks/capacity.py).
    capacity_start: int = 10_000
    capacity_factor: float = 2.0
    capacity_resolution: float = 0.05
    capacity_quantum: int = 100        # every N is a multiple of this
    capacity_max_nodes: int = 2_560_000  # the ramp stops here: a capacity above it is reported as "at least"
    capacity_max_steps: int = 14       # per server; a search cut short says what it knows
    capacity_cluster_max_steps: int = 14  # per cluster (a cluster's start costs more: the smoke runs one step)
    capacity_groups_max_steps: int = 14  # brain-groups (two brains to start: the smoke runs one step)
    capacity_seconds: float = 60.0     # the open-loop window of one step
    capacity_drain: float = 10.0       # after it, answers awaited this long
    capacity_pods: int = 1_000         # existing pods the status updates go round (preloaded with the leases)
    capacity_clients: int = 1024       # brainload's workers: ops in flight at most (a queue before them)
    capacity_conns: int = 16
    capacity_compact_interval: float = 300.0  # kube-apiserver's default --etcd-compaction-interval (5 min)
    check_perf: bool = True
    check_perf_load: str = "l"
    settle: float = 2.0        # seconds between the restart load and the RSS reading
    slow_group: float = 90.0   # a server whose first round of a group takes longer runs it only once
    probe_per_client: int = 4  # requests per client in benchmark's calibration pass
    # Mutual TLS mode (issue 10): the unary workloads at these client counts.
    mtls_clients: tuple = clients_of("mtls-put")
    # Clusters (issue 9): 3 brains on 3 nats-servers against 3 etcd 3.6 members.
    cluster_size: int = 3
    cluster_clients: tuple = clients_of("cluster-load")
    # Faults per round, so that 3 rounds give every fault row at least 9 samples (its p99 is then the largest,
    # its p50 the 5th): the kills and isolations of the leader also in cluster-failover-brain-defaults.
    failover_leader_kills: int = 3   # per round: kill -9 of the leader (brain's, etcd's)
    failover_nats_kills: int = 3     # per round, brain only: kill -9 of the NATS stream leader
    failover_rolling_restarts: int = 1  # per round: SIGTERM and start of every member in turn (3 members)
    failover_isolations: int = 3     # per round: SIGSTOP of the leader (brain's, etcd's), SIGCONT after ...
    failover_isolate_seconds: float = 5.0  # ... this many seconds
    failover_nats_rolling_restarts: int = 1  # per round, brain only: every nats-server restarted in turn
    failover_rate: float = 300.0     # the writer's open-loop rate, writes/s
    failover_warmup: float = 3.0     # seconds of writes before the first kill
    failover_settle: float = 2.5     # seconds between a killed member's restart and the next kill


FULL = Settings(name="full", rounds=3, duration=4.0)
SMOKE = Settings(
    name="smoke", rounds=1, duration=1.0, keyspace=1_000,
    list_keys=2_000, list_clients=2,
    watch_watchers=50, watch_writers=1, watch_events=50, watch_timeout=10,
    lease_leases=200, lease_ttl=2,
    k8s_nodes=100, k8s_pods=100, k8s_pod_rate=50, k8s_duration=1.5,
    restart_keys=2_000, restart_chunk=2_000, restart_load_cap=60.0, restart_tail=500,
    scale_keys=3_000, scale_tail=300, scale_restart_samples=1,
    check_perf=False, settle=0.0, probe_per_client=2,
    keepalive_leases=200, keepalive_ttl=2, keepalive_window=100, keepalive_duration=2.5,
    failover_leader_kills=1, failover_nats_kills=1, failover_rolling_restarts=0,
    failover_isolations=1, failover_isolate_seconds=3.0, failover_nats_rolling_restarts=1,
    failover_rate=200.0, failover_warmup=1.5, failover_settle=1.0,
    capacity_start=100, capacity_quantum=10, capacity_max_steps=2, capacity_cluster_max_steps=1,
    capacity_groups_max_steps=1,
    capacity_seconds=2.0, capacity_drain=2.0,
    capacity_pods=50, capacity_clients=64, capacity_conns=4, capacity_compact_interval=1.0,
)


def conns_for(clients: int) -> int:
    """gRPC connections for a client count: one per 8 clients, at least one."""
    return max(1, clients // 8)
