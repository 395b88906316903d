"""The node-capacity groups (issue 24): how large a Kubernetes cluster's writes a server takes.

    python -m benchmarks.run --groups node-capacity            # brain, etcd 3.6 and etcd 3.7
    python -m benchmarks.run --groups cluster-node-capacity    # brain's cluster against etcd 3.6's

One step is one ``brainload node-capacity`` run at N nodes (benchmarks/BUILD.md): every node renews its
Lease every 10 s (N/10 GuaranteedUpdate Txns a second) beside 50 pod creates, 50 pod status updates and
100 leased events a second, open loop, latency from each operation's scheduled time; the step passes when
every kind's p99 is within 1 s (SIG Scalability's SLO for mutating calls), at least 97% of the offered
rate is achieved and at most 0.1% of the operations fail.  Per server N ramps from ``capacity_start`` by
``capacity_factor`` until a step fails, then is bisected between the last pass and the first failure
until they are within ``capacity_resolution`` of each other (``Search``); the capacity is the largest N
that passed below the smallest that failed.

Every step runs on a freshly started server (a fresh cluster) with a new data dir: the step's leases and
pods are preloaded untimed, then the window runs.  Not one server for every step, compacted and settled
between them: that would carry each step's history into the next (etcd's bbolt file keeps its freed
pages and only a defrag, which kube-apiserver never runs, shrinks it; brain's journal, checkpoints and
memory), and the backlog of a failed step into the step after it, so one step's verdict would depend on
the steps before it, and differently for each server.  A fresh start costs every server the same few
seconds and gives each step the same state whatever ran before it.  A step longer than kube-apiserver's
compaction interval (5 min) compacts within itself as the apiserver does (brainload does).

Each step records the brainload result; the server's CPU (its process group's utime+stime; a cluster's,
every process of it) over the window and the drain, which brainload's phase marks bracket, per
successful operation; brain's committer thread's CPU (the thread that decides writes, named
``brain-committer`` in /proc/<pid>/task/*/comm; in a cluster the leader's, asked before the step and
again after it, with every replica's beside it) per operation; the load generator's share of the
machine's CPU; and the load average at the step's start.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field

from benchmarks.cluster_groups import CLUSTER_GROUPS
from benchmarks.machine import load_average
from benchmarks.servers import QUOTA_8G, BrainGroups, ServerError, StartOptions
from benchmarks.tools import ToolError, tail
from benchmarks.workloads import CLUSTER

COMMITTER = "brain-committer"  # the OS name of brain's thread that decides writes (brain/thread_names.py)
REGISTRY = "/registry/"


@dataclass
class Search:
    """Which N to try next: a ramp from ``start`` by ``factor`` until a step fails (down from ``start``
    when the first fails), then a bisection between the last pass and the first failure until the gap is
    at most ``resolution`` of the pass.  Every N is a multiple of ``quantum``; the ramp stops at
    ``max_nodes`` and the whole search after ``max_steps``."""

    start: int
    factor: float = 2.0
    resolution: float = 0.05
    quantum: int = 100
    max_nodes: int = 2_560_000
    max_steps: int = 14
    tried: list[tuple[int, bool]] = field(default_factory=list)

    def add(self, nodes: int, passed: bool) -> None:
        self.tried.append((nodes, passed))

    @property
    def first_fail(self) -> int | None:
        """The smallest N that failed."""
        return min((n for n, ok in self.tried if not ok), default=None)

    @property
    def last_pass(self) -> int | None:
        """The largest N that passed below the first failure (a pass above it is noise, not capacity)."""
        ff = self.first_fail
        return max((n for n, ok in self.tried if ok and (ff is None or n < ff)), default=None)

    def _round(self, x: float) -> int:
        return max(self.quantum, int(round(x / self.quantum)) * self.quantum)

    def next(self) -> int | None:
        """The next N to try, or None when the search is over (``stopped`` says why)."""
        return self._next()[0]

    @property
    def stopped(self) -> str:
        """Why the search ended (or "" while it goes on)."""
        return self._next()[1]

    def _next(self) -> tuple[int | None, str]:
        if not self.tried:
            return self._round(self.start), ""
        lo, hi = self.last_pass, self.first_fail
        if hi is not None and lo is not None and hi - lo <= self.resolution * lo:
            return None, f"bisected: {hi:,} failed, {lo:,} passed ({(hi - lo) / lo:.1%} apart)"
        if len(self.tried) >= self.max_steps:
            return None, f"step limit: {self.max_steps} step{'s' if self.max_steps != 1 else ''}"
        if hi is None:  # ramping up
            if lo >= self.max_nodes:
                return None, f"ceiling: {lo:,} nodes passed, the ramp's ceiling"
            return min(self._round(lo * self.factor), self.max_nodes), ""
        if lo is None:  # even the smallest tried failed: down
            n = self._round(hi / self.factor)
            if n >= hi:
                return None, f"floor: {hi:,} nodes failed, the smallest step"
            return n, ""
        mid = self._round((lo + hi) / 2)
        if not lo < mid < hi:
            return None, f"bisected: {hi:,} failed, {lo:,} passed (no multiple of {self.quantum} between)"
        return mid, ""


def summarise(steps: list[dict], search: Search) -> tuple[dict, float | None, str | None]:
    """The record of one server's search: (result, the server CPU seconds of the step at capacity, an
    error when no step passed).  The result's ops, rate, latency and CPU are those of the step at
    capacity (the largest N that passed below the first failure); ``steps`` holds every step."""
    cap, ff = search.last_pass, search.first_fail
    at = next((x for x in steps if x["nodes"] == cap and x["pass"]), None)
    out = {"capacity_nodes": cap or 0, "bounded": ff is not None and cap is not None, "first_fail_nodes": ff,
           "stopped": search.stopped, "steps": steps,
           "search": {"start": search.start, "factor": search.factor, "resolution": search.resolution,
                      "quantum": search.quantum, "max_nodes": search.max_nodes, "max_steps": search.max_steps},
           "steps_seconds": round(sum(x.get("step_seconds") or 0.0 for x in steps), 1)}
    above = sorted(x["nodes"] for x in steps if x["pass"] and ff is not None and x["nodes"] > ff)
    if above:
        out["passes_above_first_fail"] = above
    if at is None:
        first = steps[0] if steps else {}
        why = first.get("error") or "; ".join(first.get("fail_reasons") or []) or "no step ran"
        out["ops"] = 0
        return out, None, f"no step passed (the first, {first.get('nodes', 0):,} nodes: {why})"[:2000]
    for key in ("offered_per_s", "server_cpu_us_per_op", "committer_us_per_op", "client_cpu_share",
                "worst_p99_ms", "worst_kind"):
        out[key] = at.get(key)
    out["ops"] = at.get("ops") or 0
    out["ops_per_s"] = at.get("achieved_per_s")
    out["latency_ms"] = (at.get("load") or {}).get("latency_ms")
    return out, at.get("server_cpu_s"), None


def step_figures(res: dict, cpu: tuple | None, committer: tuple | None, leader: str | None = None) -> dict:
    """One step's row from brainload's result and the readings at its phase marks: ``cpu`` (server CPU
    seconds at begin, at end), ``committer`` ({member: committer thread CPU seconds} at begin, at end).
    The committer is the ``leader``'s where a cluster named one, else the busiest (a single server's
    only one; in a cluster the leader's decides writes, the followers' apply them)."""
    ops = res.get("ops") or 0
    lat = res.get("latency_ms_by_kind") or {}
    worst = max(lat, key=lambda k: (lat[k] or {}).get("p99") or 0.0, default=None)
    row = {"offered_per_s": res.get("offered_per_s"), "achieved_per_s": res.get("ops_per_s"),
           "ops": ops, "scheduled": (res.get("scheduled") or {}).get("total"),
           "failures": (res.get("failures") or {}).get("total"), "fail_reasons": res.get("fail_reasons") or [],
           "p99_ms": (res.get("latency_ms") or {}).get("p99"),
           "worst_kind": worst, "worst_p99_ms": (lat.get(worst) or {}).get("p99") if worst else None,
           "p99_ms_by_kind": {k: (v or {}).get("p99") for k, v in lat.items()},
           "schedule_lag_p99_ms": (res.get("schedule_lag_ms") or {}).get("p99"),
           "client_cpu_s": res.get("client_cpu_s"), "client_cpu_share": res.get("client_cpu_share"),
           "server_cpu_s": None, "server_cpu_us_per_op": None,
           "committer_cpu_s": None, "committer_us_per_op": None}
    if cpu is not None and cpu[0] == cpu[0] and cpu[1] == cpu[1]:  # not NaN: the server was up at both marks
        row["server_cpu_s"] = round(cpu[1] - cpu[0], 3)
        if ops:
            row["server_cpu_us_per_op"] = round((cpu[1] - cpu[0]) * 1e6 / ops, 1)
    if committer is not None:
        begin, end = committer
        by_member = {m: round(end[m] - begin[m], 3) for m in end if m in begin}
        if by_member:
            deciding = by_member[leader] if leader in by_member else max(by_member.values())
            row["committer_cpu_s_by_member"] = by_member
            row["committer_cpu_s"] = deciding
            if ops:
                row["committer_us_per_op"] = round(deciding * 1e6 / ops, 1)
    return row


class Capacity:
    """Runs the search of one node-capacity group on one server (or cluster) and records it, through
    ``groups`` (benchmarks.groups.Groups: the session, its settings and its tool runner)."""

    def __init__(self, groups) -> None:
        self.groups = groups
        self.session = groups.session
        self.s = groups.s

    def search(self, workload: str, flavor) -> Search:
        s = self.s
        if workload.startswith(CLUSTER):
            steps = s.capacity_cluster_max_steps
        elif flavor.name == BrainGroups.name:
            steps = s.capacity_groups_max_steps
        else:
            steps = s.capacity_max_steps
        return Search(start=s.capacity_start, factor=s.capacity_factor, resolution=s.capacity_resolution,
                      quantum=s.capacity_quantum, max_nodes=s.capacity_max_nodes, max_steps=steps)

    def run(self, workload: str, flavor, rnd: int) -> None:
        search = self.search(workload, flavor)
        steps: list[dict] = []
        while (nodes := search.next()) is not None:
            step = self._step(workload, flavor, rnd, nodes, len(steps) + 1)
            steps.append(step)
            search.add(nodes, step["pass"])
            self.session.say(f"  {flavor.name} {workload} step {len(steps)}: {step_line(step)}")
        result, cpu, error = summarise(steps, search)
        self.session.say(f"  {flavor.name} {workload}: {result['capacity_nodes']:,} nodes ({result['stopped']})")
        self.session.record(flavor.name, workload, rnd, result, tool="brainload node-capacity", cpu_s=cpu,
                            error=error)

    def _args(self, nodes: int, by_kind: dict[str, str]) -> list:
        """brainload node-capacity's flags for one step; ``by_kind``: the endpoints of the kinds that do not
        go to the target's one endpoint (brain-groups': leases and events to their group, pods to the main)."""
        s = self.s
        args = ["--nodes", nodes, "--duration", f"{s.capacity_seconds:g}s", "--drain", f"{s.capacity_drain:g}s",
                "--pods", s.capacity_pods, "--clients", s.capacity_clients, "--conns", s.capacity_conns,
                "--compact-interval", f"{s.capacity_compact_interval:g}s", "--registry", REGISTRY]
        for kind, endpoint in by_kind.items():
            args += [f"--endpoints-{kind}", endpoint]
        return args

    def _step(self, workload: str, flavor, rnd: int, nodes: int, i: int) -> dict:
        """One step on a fresh server (cluster): start, brainload node-capacity, stop."""
        s = self.s
        t0 = time.monotonic()
        step: dict = {"nodes": nodes, "pass": False, "error": None, "load_average_start": load_average()}
        cluster = workload.startswith(CLUSTER)
        try:
            target = self._start_cluster(flavor, rnd, i) if cluster else self._start_server(flavor, rnd, i)
        except ServerError as e:
            step["error"] = f"{'cluster' if cluster else 'server'} did not start: {e}"[:2000]
            step["step_seconds"] = round(time.monotonic() - t0, 1)
            return step
        step["start_seconds"] = round(time.monotonic() - t0, 1)
        if cluster:
            step["leader"] = target.leader_name()
        marks: dict[str, tuple] = {}

        def on_mark(mark: str) -> None:
            marks[mark] = (target.cpu_seconds(), target.thread_cpu(COMMITTER))

        try:
            self.groups.tools.target = target
            res = self.groups.tools.brainload(
                "node-capacity", target.url if target.opts.tls else target.endpoint,
                self._args(nodes, target.endpoints_by_kind()),
                s.capacity_seconds + s.capacity_drain + nodes / 1000 + 300, target.root / "tools",
                f"node-capacity-{i}-{nodes}", on_mark=on_mark)
            if not target.alive():
                res["_error"] = f"server exited during the step; log tail: {tail(target.log_tail(1500), 1200)}"
            elif cluster:
                step["leader_after"] = target.leader_name()
        except ToolError as e:
            res = {"_error": str(e)}
        finally:
            self.groups.tools.target = None
            self._stop(target, cluster)
        step["cmd"] = res.pop("_cmd", None)
        if step["cmd"]:
            step["cmd"] = step["cmd"].replace(str(self.session.root), "<tmp-root>")
        error = res.pop("_error", None)
        begin, end = marks.get("timed begin"), marks.get("timed end")
        step.update(step_figures(res, (begin[0], end[0]) if begin and end else None,
                                 (begin[1], end[1]) if begin and end else None, step.get("leader")))
        step["load"] = res
        step["error"] = str(error)[:2000] if error else None
        step["pass"] = error is None and res.get("pass") is True
        step["step_seconds"] = round(time.monotonic() - t0, 1)
        return step

    def _start_server(self, flavor, rnd: int, i: int):
        # etcd's quota raised as for the restart and scale runs (and brain's the same): a step's history
        # until its compaction stays far below 8 GiB, so the quota never decides a step.
        srv = self.groups.server(flavor, f"capacity-r{rnd}-s{i}", StartOptions(quota_bytes=QUOTA_8G))
        try:
            srv.start()
        except ServerError:
            self.groups.finish(srv)
            raise
        return srv

    def _start_cluster(self, cf, rnd: int, i: int):
        root = self.session.root / f"{cf.name}-cluster-node-capacity-r{rnd}-s{i}"
        args = CLUSTER_GROUPS["cluster-node-capacity"].member_args(cf.name)
        try:
            return cf.start(root, self.s.cluster_size, lifetime=3600.0, extra_args=args)
        except ServerError:
            if not self.session.keep:
                shutil.rmtree(root, ignore_errors=True)
            raise

    def _stop(self, target, cluster: bool) -> None:
        if not cluster:
            self.groups.finish(target)
            return
        target.stop()
        if not self.session.keep:
            shutil.rmtree(target.root, ignore_errors=True)


def step_line(step: dict) -> str:
    """A step as the progress line and the report say it."""
    if step.get("error"):
        return f"{step['nodes']:,} nodes: ERROR {' '.join(str(step['error']).split())[:300]}"
    verdict = "pass" if step["pass"] else "FAIL (" + "; ".join(step.get("fail_reasons") or []) + ")"
    bits = [f"{step['nodes']:,} nodes", f"{_n(step.get('achieved_per_s'))}/{_n(step.get('offered_per_s'))} ops/s",
            f"p99 {_n(step.get('p99_ms'))} ms (worst kind {step.get('worst_kind')} {_n(step.get('worst_p99_ms'))} ms)"]
    if step.get("server_cpu_us_per_op") is not None:
        bits.append(f"server {_n(step['server_cpu_us_per_op'])} µs/op")
    if step.get("committer_us_per_op") is not None:
        bits.append(f"committer {_n(step['committer_us_per_op'])} µs/op")
    if step.get("client_cpu_share") is not None:
        bits.append(f"client {step['client_cpu_share']:.0%} of the CPUs")
    return ", ".join(bits) + f": {verdict}"


def _n(x) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"
