"""The targets the report judges, as data: which issue asked for each, the
workload and peer it compares, and its goal.  benchmarks/judging.py judges
them (``judging.targets``); nothing else names an issue.

An issue's targets are judged when the run measured a workload of its mode
(``plain`` always).  A goal is written as the report shows it: an operator
and a bound (">= 1.5", "<= 10 s": a unit after the bound is for the reader),
a bare number for equality ("0"), or "PASS".

The kinds of target:

  ratio              brain's cell over ``peer``'s for ``workload`` (``key``: the
                     value, p99 or CPU per op); under mutual TLS against the
                     better of etcd's two configurations
  restart            brain's worst start of a restart row's samples
  restart-ratio      brain's worst start over ``peer``'s median start, same row and run
  rss                brain's RSS over ``peer``'s after the restart load
  check-perf         etcdctl check perf's verdict on brain
  cluster-vs-single  brain's cluster over a single brain (``versus``, of the same run)
  pause              the p99 write pause of a kill (with ``peer``'s figure in the note; with
                     ``versus``, brain's and ``peer``'s on that row, both at the same settings)
  lost               acknowledged writes lost, summed over every run

Both restart kinds are judged only on at least MIN_RESTART_SAMPLES starts
of every server they name (benchmarks/aggregation.py): fewer is n/a, unless a
restart target is already missed.

A target with ``at_keys`` is asked of the scale group at that data set size:
a run with fewer ``scale_keys`` shows its value in the note and is n/a.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Issue:
    number: str
    title: str
    mode: str  # plain, mtls or cluster (benchmarks.workloads.mode_of)


@dataclass(frozen=True)
class Target:
    issue: str
    kind: str
    name: str  # {workload}, {peer}, {versus}, {keys} (the restart load's key count) and {scale_keys} are filled in
    workload: str
    goal: str
    peer: str = ""
    key: str = "value"
    versus: str = ""
    at_keys: int = 0  # judged only on a scale run of at least this many keys


ISSUES = (
    Issue("5", "issue 5: single node, plaintext", "plain"),
    Issue("10", "issue 10: mutual TLS", "mtls"),
    Issue("9", "issue 9: brain cluster on NATS JetStream vs etcd 3.6 cluster", "cluster"),
    Issue("18", "issue 18: the brain cluster under faults and planned restarts vs etcd 3.6", "cluster"),
    Issue("17", "issue 17: scale, Kubernetes-shaped data sets of 1M and 10M keys", "scale"),
)

_THROUGHPUT = "{workload}: brain/{peer} throughput"
_EVENTS = "{workload}: brain/{peer} delivered events/s"
_DELIVERY = "{workload}: brain/{peer} p99 delivery latency"
_UNARY = ("put-c64", "put-c256", "txn-put-c64", "txn-put-c256", "range-l-c64", "range-l-c256")


def _ratio(issue: str, name: str, workload: str, peer: str, goal: str, key: str = "value") -> Target:
    return Target(issue, "ratio", name, workload, goal, peer, key)


TARGETS = (
    # Issue 5: one server, plaintext.
    *[_ratio("5", _THROUGHPUT, w, "etcd-3.6", ">= 1.5") for w in _UNARY],
    *[_ratio("5", _THROUGHPUT, w, "etcd-3.6", ">= 3") for w in ("list", "count")],
    *[t for w in ("watch", "watch-shared") for t in (_ratio("5", _EVENTS, w, "etcd-3.6", ">= 1"),
                                                     _ratio("5", _DELIVERY, w, "etcd-3.6", "<= 1", "p99"))],
    Target("5", "restart", "restart (SIGTERM) with {keys}: brain seconds, worst sample", "restart", "<= 10 s"),
    Target("5", "restart", "restart (kill -9) with {keys}: brain seconds, worst sample", "restart-kill9", "<= 10 s"),
    *[Target("5", "rss", "RSS after loading {keys}: brain/{peer}", "rss", "<= 1", peer)
      for peer in ("etcd-3.6", "etcd-3.4")],
    *[_ratio("5", _THROUGHPUT, w, "kine", ">= 10") for w in ("put-c1", "put-c64", "put-c256")],
    Target("5", "check-perf", "etcdctl check perf --load l on brain", "check-perf", "PASS"),
    # Issue 10: mutual TLS, brain / etcd 3.6 (the better of its default and fast gRPC configurations).
    *[t for w in _UNARY for t in (_ratio("10", _THROUGHPUT, "mtls-" + w, "etcd-3.6", ">= 1.5"),
                                  _ratio("10", "{workload}: brain/{peer} server CPU per op", "mtls-" + w,
                                         "etcd-3.6", "< 1", "cpu_us_per_op"))],
    *[t for w in ("mtls-watch", "mtls-watch-shared") for t in (_ratio("10", _EVENTS, w, "etcd-3.6", ">= 1"),
                                                               _ratio("10", _DELIVERY, w, "etcd-3.6", "<= 1", "p99"))],
    _ratio("10", "{workload}: brain/{peer} keep-alives/s, nothing expired", "mtls-keepalive", "etcd-3.6", ">= 1"),
    # Issue 9: the clusters.
    *[_ratio("9", "{workload}: brain cluster/{peer} cluster throughput", w, "etcd-3.6", ">= 1.0")
      for w in ("cluster-put-c64", "cluster-put-c256", "cluster-txn-put-c64", "cluster-txn-put-c256")],
    *[Target("9", "cluster-vs-single", "{workload}: brain cluster/single brain ({versus}) throughput",
             "cluster-" + w, ">= 1.5", versus=w) for w in ("range-l-c64", "range-l-c256")],
    # brain's leader kills are judged at `brain serve`'s default election timeout, what an operator gets; the
    # note gives both clusters at etcd's timeout (cluster-pause-leader), the comparison of the servers.
    Target("9", "pause", "write pause after kill -9 of brain's leader at brain's default election timeout, p99 (s)",
           "cluster-pause-leader-brain-defaults", "<= 3 s", peer="etcd-3.6", versus="cluster-pause-leader"),
    Target("9", "pause", "write pause after kill -9 of the NATS stream leader, p99 (s)", "cluster-pause-nats",
           "<= 7 s"),
    # Issue 18: failover faster than etcd's, planned restarts without a pause.
    Target("18", "pause", "write pause after kill -9 of brain's leader at brain's default election timeout, p99 (s)",
           "cluster-pause-leader-brain-defaults", "<= 1 s", peer="etcd-3.6", versus="cluster-pause-leader"),
    Target("18", "pause", "write pause after SIGTERM of each member in a rolling restart, p99 (s)",
           "cluster-pause-restart", "<= 0.5 s", peer="etcd-3.6"),
    Target("18", "pause", "write pause after kill -9 of the NATS stream leader beyond NATS's own election, p99 (s)",
           "cluster-pause-nats-excess", "<= 0.5 s"),
    Target("18", "pause", "write pause in a planned restart of each nats-server (step-down, lame duck), p99 (s)",
           "cluster-pause-nats-roll", "<= 0.5 s"),
    Target("9", "lost", "acknowledged writes lost over every brain failover run", "cluster-failover", "0"),
    Target("9", "lost", "acknowledged writes lost over every brain failover run at brain's default election timeout",
           "cluster-failover-brain-defaults", "0"),
    # Issue 17: the scale group, asked at 1M keys (the default run) and at 10M (--scale-keys 10000000).
    Target("17", "ratio", "RSS after loading {scale_keys}: brain/{peer}", "scale-rss", "<= 0.5", "etcd-3.6",
           at_keys=1_000_000),
    *[Target("17", "ratio", "{workload} ({scale_keys}): brain/{peer} keys/s", w, goal, "etcd-3.6",
             at_keys=1_000_000)
      for w, goal in (("scale-list-500", ">= 3"), ("scale-list-10000", ">= 3"), ("scale-keys-only", ">= 2"))],
    Target("17", "ratio", "scale-count ({scale_keys}): brain/{peer} counts/s", "scale-count", ">= 20", "etcd-3.6",
           at_keys=1_000_000),
    Target("17", "ratio", "scale-stream ({scale_keys}): brain/{peer} keys/s by RangeStream", "scale-stream", ">= 3",
           "etcd-3.7", at_keys=1_000_000),
    # brain's worst start against etcd's median one: a single slow start of brain's counts, one of etcd's
    # does not make the ratio.
    *[Target("17", "restart-ratio", "{workload} ({scale_keys}): brain's worst start / {peer}'s median, seconds",
             w, "<= 1", "etcd-3.6", at_keys=10_000_000) for w in ("scale-restart", "scale-restart-kill9")],
)

_GOAL = re.compile(r"^(>=|<=|<|>)?\s*([\d.]+)")
_OPS = {">=": float.__ge__, "<=": float.__le__, "<": float.__lt__, ">": float.__gt__, None: float.__eq__}


def met(goal: str, value: float | None) -> bool:
    """Whether ``value`` meets a numeric ``goal`` (None never does)."""
    m = _GOAL.match(goal)
    if m is None:
        raise ValueError(f"not a numeric goal: {goal!r}")
    return value is not None and _OPS[m.group(1)](float(value), float(m.group(2)))
