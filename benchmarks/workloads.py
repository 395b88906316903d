"""The workload catalogue: every workload of the benchmark, once.

Each entry names the group that runs it (benchmarks/groups.py), the shape of
load the group gives it (``kind``), its client count where it has one, the
tool that makes the load, what it measures (the report's row title, whose
``{fields}`` are the run's settings, benchmarks/settings.py) and how the
report reads the result.  The order is the report's row order.

A row with a ``source`` is not run: the report draws it from the runs of its
source workload (the kill -9 restart and RSS from ``restart``, the write
pauses from ``cluster-failover``).  The workloads of a mode carry its prefix
(``mtls-``, ``cluster-``).
"""

from __future__ import annotations

from dataclasses import dataclass

MTLS = "mtls-"
CLUSTER = "cluster-"
SCALE = "scale-"
# A result key (brainload scale-read's): the server answered Unimplemented; such a run did nothing and did not fail.
UNSUPPORTED = "unsupported"
# brainload scale-load --mix: the value sizes of each data set
SCALE_MIXES = {"kubernetes": "40% leases ~350 B, 25% events ~700 B, 20% pods 1.5-4 KiB, 15% other kinds ~1 KiB",
               "small": "45% leases ~350 B, 36% events ~500 B, 4% pods 3-4 KiB, 15% other kinds ~500 B; "
                        "about 540 B a value"}
SCALE_LIMITS = (500, 10_000)  # the scale group's page sizes: kube-apiserver's list default, its consistency checker's
# Groups run once per server whatever the rounds setting (their rows say so),
# but the scale group, which runs --scale-rounds times (group_rounds).
ONCE_GROUPS = ("restart", "check-perf", "scale", "node-capacity", "cluster-node-capacity")


def group_rounds(group: str, rounds: int, scale_rounds: int = 1) -> int:
    """Rounds a group runs: the scale group its own count (one by default: a 10M round takes most of an
    hour), the other ONCE_GROUPS once, the rest ``rounds``."""
    if group == "scale":
        return max(1, int(scale_rounds or 1))
    return 1 if group in ONCE_GROUPS else rounds


# The node-capacity rows' title: what one step writes and how it is judged (benchmarks/capacity.py).
_CAPACITY = ("the most nodes whose writes pass the SLO: a Lease renewal per node every 10 s plus 50 pod creates, "
             "50 pod status updates and 100 leased events a second, kube-apiserver's Txns, open loop; a step "
             "passes when every kind's p99 from its scheduled time is <= 1 s, >= 97% of the offered rate is "
             "achieved and <= 0.1% fail; {capacity_seconds:g} s steps, each on a fresh start, N ramped x"
             "{capacity_factor:g} from {capacity_start:,} until one fails, then bisected to "
             "{capacity_resolution:.0%}")


@dataclass(frozen=True)
class Workload:
    group: str           # the group that runs it (a row with a source: the source's group)
    kind: str            # the shape of load: put, range-l, range-s, txn-put, watch, watch-shared, ...
    tool: str            # what makes the load (put and range fall back to brainload without benchmark)
    title: str
    metric: str          # key in the run's result ("a.b" for a nested one)
    unit: str
    clients: int | None = None
    higher_better: bool = True
    latency: str = "latency_ms"  # dict with p50/p99 in ms, or "" for none
    source: str = ""     # a summary row drawn from another workload's runs
    scale: float = 1.0   # metric x scale is shown
    # How the runs make the row's value: "median" of the successful runs' metric; "p99" of the
    # samples (a list metric) of every successful run pooled (nearest rank: with fewer than 100
    # samples, the largest); "sum" of the metric over every run that reported it, failed ones too
    # (acknowledged writes lost must not hide in a failed run).
    agg: str = "median"
    # A restart row: the result key of the list of its samples (starts); the value is their median,
    # "worst" their largest.  A run without the list (before samples were taken) is one sample.
    samples: str = ""


def _ops(group: str, kind: str, tool: str, title: str, clients: int | None = None) -> Workload:
    """A throughput row: ops/s with p50/p99 latency."""
    return Workload(group, kind, tool, title, "ops_per_s", "ops/s", clients)


def _fanout(group: str, kind: str, title: str) -> Workload:
    """A watch fan-out row: delivered events/s, p99 delivery latency."""
    return Workload(group, kind, "brainload", title, "delivered_per_s", "events/s")


_TXN = "txn-put (kube-apiserver update shape)"

WORKLOADS: dict[str, Workload] = {
    **{f"put-c{c}": _ops("put", "put", "benchmark", f"put, 256 B values, {c} client{'s' if c > 1 else ''}", c)
       for c in (1, 64, 256)},
    **{f"range-{k}-c{c}": _ops("range", f"range-{k}", "benchmark",
                               f"range, one key, {'linearizable' if k == 'l' else 'serializable'}, {c} clients", c)
       for k in "ls" for c in (64, 256)},
    **{f"txn-put-c{c}": _ops("txn-put", "txn-put", "brainload", f"{_TXN}, {c} clients", c) for c in (64, 256)},
    "list": Workload("list", "list", "brainload",
                     "paginated list of a {list_keys:,}-key prefix, limit {list_limit}, {list_clients} clients "
                     "(a whole listing is one op)", "ops_per_s", "listings/s"),
    "count": _ops("list", "count", "brainload", "count_only over the {list_keys:,}-key prefix, {list_clients} clients"),
    "watch": _fanout("watch", "watch", "watch fan-out: {watch_watchers:,} watchers on one prefix, a gRPC stream "
                                       "each; {watch_events} puts as fast as they go"),
    "watch-shared": _fanout("watch", "watch-shared", "watch fan-out: {watch_watchers:,} watchers, watchers on one "
                                                     "connection share a stream (clientv3's default)"),
    "lease": Workload("lease", "lease", "brainload",
                      "{lease_leases:,} x (lease grant + put with lease), then the {lease_ttl} s expiries",
                      "grant_put_per_s", "grant+put/s"),
    "keepalive": Workload("keepalive", "keepalive", "brainload",
                          "{keepalive_leases:,} leases kept alive through ONE LeaseKeepAlive stream, at most "
                          "{keepalive_window:,} keep-alives in flight, {keepalive_duration:g} s; nothing may "
                          "expire (TTL {keepalive_ttl} s)", "keepalives_per_s", "keep-alives/s"),
    "k8s-mix": Workload("k8s-mix", "k8s-mix", "brainload",
                        "Kubernetes mix: {k8s_nodes:,} node leases renewed every 10 s + {k8s_pod_rate} pod status "
                        "updates/s over {k8s_pods:,} pods, {k8s_duration:g} s, open loop (the rate is fixed, "
                        "so latency is the measure)", "latency_ms.p99", "p99 ms", higher_better=False),
    "node-capacity": Workload("node-capacity", "node-capacity", "brainload node-capacity",
                              "node capacity: " + _CAPACITY, "capacity_nodes", "nodes"),
    "check-perf": Workload("check-perf", "check-perf", "etcdctl", "etcdctl check perf --load {check_perf_load}",
                           "writes_per_s", "writes/s"),
    "restart": Workload("restart", "restart", "brainload load + harness probe",
                        "restart with {restart_keys:,} keys of {restart_val} B after SIGTERM: start until a "
                        "linearizable Get of one key answers (the keys counted after it)",
                        "ready_after_s", "s", higher_better=False, latency="", samples="ready_after_s_samples"),
    "restart-kill9": Workload("restart", "restart", "brainload load + harness probe",
                              "the same after {restart_tail:,} overwrites and kill -9 at once (brain: a journal "
                              "tail just under its 32 MiB checkpoint threshold to replay)",
                              "ready_after_kill9_s", "s", higher_better=False, latency="", source="restart",
                              samples="ready_after_kill9_s_samples"),
    "rss": Workload("restart", "restart", "brainload load + harness probe",
                    "resident memory after loading the {restart_keys:,} keys", "rss_after_load_kb", "MiB",
                    higher_better=False, latency="", source="restart", scale=1 / 1024),
    # Scale (issue 17): one data set of Kubernetes shapes per server, then reads of all of it and restarts.
    "scale-load": Workload("scale", "scale-load", "brainload scale-load",
                           "scale: load {scale_keys:,} keys of Kubernetes shapes ({scale_mix_text}), then "
                           "{scale_overwrite:.0%} of them "
                           "overwritten; {scale_clients} clients, Txns of {scale_batch} puts", "puts_per_s", "puts/s",
                           latency=""),
    "scale-rss": Workload("scale", "scale-load", "brainload scale-load",
                          "scale: resident memory after the load", "rss_after_load_kb", "MiB", higher_better=False,
                          latency="", source="scale-load", scale=1 / 1024),
    **{f"scale-list-{n}": Workload("scale", "scale-list", "brainload scale-read",
                                   f"scale: paginated list of the pods (the largest prefix by bytes), limit {n:,}, "
                                   f"at the first page's revision, every page's count checked (kube-apiserver's "
                                   f"hasMore = len(kvs) < count)", "keys_per_s", "keys/s", latency="")
       for n in SCALE_LIMITS},
    "scale-stream": Workload("scale", "scale-stream", "brainload scale-read",
                             "scale: the same list by KV.RangeStream (etcd 3.7; \"unsupported\" where the server "
                             "answers Unimplemented)", "keys_per_s", "keys/s", latency=""),
    "scale-count": _ops("scale", "scale-count", "brainload",
                        "scale: count_only over /registry/ (all {scale_keys:,} keys), one client, count checked"),
    "scale-keys-only": Workload("scale", "scale-keys-only", "brainload scale-read",
                                "scale: keys_only Range of all {scale_keys:,} keys in one response (kube-apiserver's "
                                "size estimate)", "keys_per_s", "keys/s", latency=""),
    "scale-watch": Workload("scale", "scale-watch", "brainload scale-read",
                            "scale: watch of the pods from the revision before the load, until every event of the "
                            "load arrived", "keys_per_s", "events/s", latency=""),
    "scale-restart": Workload("scale", "scale-restart", "brainload scale-load + harness probe",
                              "scale: restart after SIGTERM: start until a linearizable Get of one key answers "
                              "(every key under /registry/ counted after it)", "ready_after_s", "s", higher_better=False, latency="",
                              samples="ready_after_s_samples"),
    "scale-restart-kill9": Workload("scale", "scale-restart", "brainload scale-load + harness probe",
                                    "scale: the same after {scale_tail:,} overwrites and kill -9 at once",
                                    "ready_after_kill9_s", "s", higher_better=False, latency="",
                                    source="scale-restart", samples="ready_after_kill9_s_samples"),
    # Mutual TLS: every server on https:// with client-certificate auth, the tools presenting one
    # (etcd 3.6 and 3.7 in two configurations each, default and -fast).
    **{f"mtls-put-c{c}": _ops("mtls-put", "put", "benchmark", f"mutual TLS: put, 256 B values, {c} clients", c)
       for c in (64, 256)},
    **{f"mtls-txn-put-c{c}": _ops("mtls-txn-put", "txn-put", "brainload", f"mutual TLS: txn-put, {c} clients", c)
       for c in (64, 256)},
    **{f"mtls-range-l-c{c}": _ops("mtls-range", "range-l", "benchmark",
                                  f"mutual TLS: range, one key, linearizable, {c} clients", c) for c in (64, 256)},
    "mtls-watch": _fanout("mtls-watch", "watch",
                          "mutual TLS: watch fan-out, {watch_watchers:,} watchers, a gRPC stream each"),
    "mtls-watch-shared": _fanout("mtls-watch", "watch-shared",
                                 "mutual TLS: watch fan-out, {watch_watchers:,} watchers, shared streams"),
    "mtls-keepalive": Workload("mtls-keepalive", "keepalive", "brainload",
                               "mutual TLS: {keepalive_leases:,} leases kept alive through ONE LeaseKeepAlive "
                               "stream", "keepalives_per_s", "keep-alives/s"),
    # Clusters: 3 brains on 3 nats-servers (brain) against 3 etcd 3.6 members (etcd-3.6).
    **{f"cluster-put-c{c}": _ops("cluster-load", "put", "benchmark", f"cluster: put, {c} clients over every endpoint",
                                 c) for c in (64, 256)},
    **{f"cluster-txn-put-c{c}": _ops("cluster-load", "txn-put", "brainload",
                                     f"cluster: txn-put, {c} clients over every endpoint", c) for c in (64, 256)},
    **{f"cluster-range-l-c{c}": _ops("cluster-load", "range-l", "benchmark",
                                     f"cluster: range, one key, linearizable, {c} clients over every endpoint "
                                     "(brain at `brain serve`'s default: read lease {brain_read_lease})", c)
       for c in (64, 256)},
    # The same on a brain cluster with the read lease set the other way than brain's default (the group whose
    # setting is the default does not run, benchmarks/cluster_groups.py): off, every linearizable read waits
    # for a barrier record the journal's quorum acknowledged; on, the leader answers within its lease.
    # LEASE_ROWS pairs them with the default rows.
    **{f"cluster-range-l-barrier-c{c}": _ops("cluster-read-barrier", "range-l", "benchmark",
                                             f"cluster: range, one key, linearizable, {c} clients over every "
                                             "endpoint, brain with --read-lease=false (every read confirmed "
                                             "by a barrier record)", c)
       for c in (64, 256)},
    **{f"cluster-range-l-lease-c{c}": _ops("cluster-read-lease", "range-l", "benchmark",
                                           f"cluster: range, one key, linearizable, {c} clients over every "
                                           "endpoint, brain with --read-lease=true (the leader answers within "
                                           "its read lease)", c)
       for c in (64, 256)},
    "cluster-watch": _fanout("cluster-load", "watch", "cluster: watch fan-out, {watch_watchers:,} watchers (a stream "
                                                      "each) over every endpoint"),
    "cluster-watch-shared": _fanout("cluster-load", "watch-shared",
                                    "cluster: watch fan-out, {watch_watchers:,} watchers, shared streams"),
    # cluster-failover: brain and etcd both at etcd's election timeout and heartbeat (cluster_groups.py).
    "cluster-failover": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                 "cluster: acknowledged writes lost over every failover run (clustercheck "
                                 "verify after the kills)", "lost", "writes lost", higher_better=False,
                                 latency="", agg="sum"),
    "cluster-pause-leader": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                     "cluster: write pause after kill -9 of the leader (brain's, etcd's), both at "
                                     "etcd's election timeout (--election-timeout 1000 --heartbeat-interval 100 "
                                     "on every member), p99 of every kill", "leader_pauses_s", "s (p99 of kills)",
                                     higher_better=False, latency="", source="cluster-failover", agg="p99"),
    "cluster-pause-isolate": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                      "cluster: write pause while the leader (brain's, etcd's) is isolated: "
                                      "SIGSTOP of its process for {failover_isolate_seconds:g} s, then SIGCONT, "
                                      "both at etcd's election timeout (1,000 ms), p99 of every isolation",
                                      "isolate_pauses_s", "s (p99 of isolations)",
                                      higher_better=False, latency="", source="cluster-failover", agg="p99"),
    "cluster-pause-nats": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                   "cluster: write pause after kill -9 of the NATS stream leader's nats-server "
                                   "(brain), p99 of every kill", "nats_pauses_s", "s (p99 of kills)",
                                   higher_better=False, latency="", source="cluster-failover", agg="p99"),
    "cluster-pause-nats-excess": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                          "cluster: after kill -9 of the NATS stream leader's nats-server, how "
                                          "long after the new stream leader took over writes resumed: the end of "
                                          "the write pause minus the new leader's own leader_since (every "
                                          "nats-server's /jsz polled every 50 ms from before the kill), unclipped: "
                                          "negative when writes resumed first; p99 of every kill",
                                          "nats_excess_pauses_s", "s (p99 of kills)",
                                          higher_better=False, latency="", source="cluster-failover", agg="p99"),
    "cluster-pause-nats-roll": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                        "cluster: write pause in a planned restart of each nats-server (brain): "
                                        "stream leader stepped down, lame duck mode, start; p99 of every server",
                                        "nats_restart_pauses_s", "s (p99 of restarts)",
                                        higher_better=False, latency="", source="cluster-failover", agg="p99"),
    "cluster-pause-restart": Workload("cluster-failover", "failover", "clustercheck write + verify",
                                      "cluster: write pause after SIGTERM of a member in a rolling restart (every "
                                      "member in turn, the leader included), p99 of every restart",
                                      "restart_pauses_s", "s (p99 of restarts)",
                                      higher_better=False, latency="", source="cluster-failover", agg="p99"),
    # The same faults that brain's election timeout decides, on brain at `brain serve`'s own timings.
    "cluster-failover-brain-defaults": Workload("cluster-failover-brain-defaults", "failover",
                                                "clustercheck write + verify",
                                                "cluster: acknowledged writes lost over every failover run of brain "
                                                "at `brain serve`'s default election timeout "
                                                "({brain_election_timeout_ms} ms, heartbeat "
                                                "{brain_heartbeat_interval_ms} ms)", "lost", "writes lost",
                                                higher_better=False, latency="", agg="sum"),
    "cluster-pause-leader-brain-defaults": Workload(
        "cluster-failover-brain-defaults", "failover", "clustercheck write + verify",
        "cluster: write pause after kill -9 of brain's leader, brain at `brain serve`'s default election timeout "
        "({brain_election_timeout_ms} ms, heartbeat {brain_heartbeat_interval_ms} ms), p99 of every kill",
        "leader_pauses_s", "s (p99 of kills)", higher_better=False, latency="",
        source="cluster-failover-brain-defaults", agg="p99"),
    "cluster-pause-isolate-brain-defaults": Workload(
        "cluster-failover-brain-defaults", "failover", "clustercheck write + verify",
        "cluster: write pause while brain's leader is isolated ({failover_isolate_seconds:g} s), brain at "
        "`brain serve`'s default election timeout ({brain_election_timeout_ms} ms), p99 of every isolation",
        "isolate_pauses_s", "s (p99 of isolations)", higher_better=False, latency="",
        source="cluster-failover-brain-defaults", agg="p99"),
    "cluster-node-capacity": Workload("cluster-node-capacity", "node-capacity", "brainload node-capacity",
                                      "cluster: node capacity over every endpoint: " + _CAPACITY, "capacity_nodes",
                                      "nodes"),
}

# The linearizable range rows by brain's read lease: {clients: {"default": brain at brain serve's default,
# "off": with --read-lease=false, "on": with --read-lease=true}}; the default row is also etcd's.
LEASE_ROWS = {c: {"default": f"cluster-range-l-c{c}", "off": f"cluster-range-l-barrier-c{c}",
                  "on": f"cluster-range-l-lease-c{c}"} for c in (64, 256)}


def measured_in(group: str, kind: str | None = None) -> list[str]:
    """The workloads ``group`` runs (of one ``kind`` if given), in catalogue order."""
    return [name for name, w in WORKLOADS.items()
            if w.group == group and not w.source and (kind is None or w.kind == kind)]


def clients_of(group: str) -> tuple:
    """The client counts of a group's workloads that have one, each once."""
    return tuple(dict.fromkeys(WORKLOADS[w].clients for w in measured_in(group) if WORKLOADS[w].clients))


def mode_of(workload: str) -> str:
    """plain, mtls, cluster or scale: which mode of the run a workload belongs to."""
    for mode, prefix in (("mtls", MTLS), ("cluster", CLUSTER), ("scale", SCALE)):
        if workload.startswith(prefix):
            return mode
    return "plain"
