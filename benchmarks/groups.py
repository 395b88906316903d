"""The groups: which workloads run on which servers, on what start, in what order.

A group is the unit of a server start: its workloads (the catalogue's, in
catalogue order) run one after another on one fresh server, or one fresh
cluster for the cluster groups.  For each group the servers take turns, the
order rotated by one place per round and per group (``round_order``), so no
server always runs first or last.  The mutual TLS groups start every server
with the run's certificates; etcd's fast gRPC configurations run in those
alone (``servers_for``).  Five kinds of group are more than their workloads:
list starts from a data dir loaded once per server (a template), restart
loads its keys and times starts, scale loads a Kubernetes-shaped data set
and reads all of it before timing starts, cluster-failover kills leaders
under a writer, and the node-capacity groups run steps of rising load, each
on a fresh start (benchmarks/capacity.py).
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import cluster as clusters
from benchmarks import profiles
from benchmarks.capacity import Capacity
from benchmarks.cluster import ClusterFlavor
from benchmarks.cluster_groups import CLUSTER_GROUPS, brain_serve_defaults, runs_on
from benchmarks.machine import du_kb
from benchmarks.probes import count_prefix, head_revision, put_key
from benchmarks.servers import QUOTA_8G, Flavor, Server, ServerError, StartOptions, tool_path
from benchmarks.settings import conns_for
from benchmarks.tools import ToolError, ToolRunner, parse_check_perf, tail
from benchmarks.workloads import CLUSTER, MTLS, SCALE_LIMITS, UNSUPPORTED, WORKLOADS, measured_in
from tests.support.tls import TestPKI, make_test_pki

GROUPS = ["put", "range", "txn-put", "list", "watch", "lease", "keepalive", "k8s-mix", "check-perf", "restart", "scale",
          "node-capacity",
          "mtls-put", "mtls-range", "mtls-txn-put", "mtls-watch", "mtls-keepalive",
          "cluster-load", "cluster-read-barrier", "cluster-read-lease", "cluster-failover",
          "cluster-failover-brain-defaults", "cluster-node-capacity"]
# --groups also takes these names for several groups at once.
GROUP_SETS = {
    "plain": [g for g in GROUPS if not g.startswith((MTLS, CLUSTER))],
    "mtls": [g for g in GROUPS if g.startswith(MTLS)],
    "cluster": [g for g in GROUPS if g.startswith(CLUSTER)],
}

RANGE_KEY = "/bench/range/key"
LIST_PREFIX = "/bench/list/"
RESTART_PREFIX = "/bench/restart/"
SCALE_REGISTRY = "/registry/"
# The restart samples' readiness key: put before the first sample, outside every counted prefix.
READY_MARKER = "/bench/ready-marker"
# The scale group runs on the servers issue 17 compares (etcd 3.7 for its KV.RangeStream).
SCALE_SERVERS = ("brain", "etcd-3.6", "etcd-3.7")
# The node-capacity group's servers (issue 24): brain against the etcd releases kube-apiserver runs on, and
# brain as two groups (node Leases and Events in one, the rest in the other) against one brain.
CAPACITY_SERVERS = ("brain", "brain-groups", "etcd-3.6", "etcd-3.7")


def scale_quota(keys: int) -> int:
    """The scale run's --quota-backend-bytes: 8 GiB, or 4 KiB per key when more (etcd's bbolt file was
    3.6 KB per key after the 100,000-key load, every revision of ~1 KB values in half-full pages; at 10M
    keys a smaller quota would stop etcd with "mvcc: database space exceeded")."""
    return max(QUOTA_8G, keys * 4096)


def now_s() -> float:
    return time.monotonic()


def etcdctl_binary() -> str | None:
    """The etcdctl of check-perf: etcd 3.6's from build.sh, else one on PATH."""
    p = tool_path("etcdctl-3.6")
    return str(p) if p else shutil.which("etcdctl")


def servers_for(group: str, flavors: list, cluster_flavors: list, brain_defaults: dict | None = None) -> list:
    """The servers a group runs on: clusters for the cluster groups (those benchmarks/cluster_groups.py
    runs it on under brain's defaults, ``brain_defaults``: brain serve's own unless given); the TLS-only
    configurations (etcd's fast gRPC listener) in the mutual TLS groups alone; a configuration made for
    some groups (brain-groups: node-capacity) in those alone."""
    flavors = [f for f in flavors if not f.only_in or group in f.only_in]
    if group.startswith(CLUSTER):
        defaults = brain_serve_defaults() if brain_defaults is None else brain_defaults
        return [c for c in cluster_flavors if runs_on(group, c.name, defaults)]
    if group.startswith(MTLS):
        return flavors
    if group == "scale":
        return [f for f in flavors if f.name in SCALE_SERVERS]
    if group == "node-capacity":
        return [f for f in flavors if f.name in CAPACITY_SERVERS]
    return [f for f in flavors if not f.tls_only]


def round_order(flavors: list, group_index: int, rnd: int) -> list:
    """The servers of one round, rotated by one place per round and per group
    (A B C D, B C D A, ...), so no server always runs first or last."""
    k = (group_index - 1 + rnd - 1) % len(flavors) if flavors else 0
    return flavors[k:] + flavors[:k]


class Groups:
    """Runs one round of a group on one server (``run``) and records every workload of it in
    ``session`` (benchmarks.run.Bench: its settings, temp root, ``record`` and ``say``)."""

    def __init__(self, session):
        self.session = session
        self.s = session.s
        self.tools = ToolRunner()
        self.use_benchmark = tool_path("benchmark") is not None
        self._pki: TestPKI | None = None
        self.templates: dict[str, Path | str] = {}
        self.untimed = 0.0  # seconds of the current group spent on one-off setup (the list template)

    def run(self, group: str, flavor, rnd: int) -> None:
        """Round ``rnd`` of ``group`` on ``flavor`` (a cluster flavor for the cluster groups)."""
        self.untimed = 0.0
        if group == "restart":
            return self._restart(flavor, rnd)
        if group == "scale":
            return self._scale(flavor, rnd)
        if group.startswith("cluster-failover"):
            return self._failover(group, flavor, rnd)
        if group in ("node-capacity", "cluster-node-capacity"):
            return Capacity(self).run(group, flavor, rnd)
        workloads = measured_in(group)

        def body(srv) -> None:
            self._measure_each(srv, rnd, workloads)
        if group.startswith(CLUSTER):
            return self._with_cluster(flavor, rnd, group, workloads, body)
        template = None
        if group == "list":
            template = self._list_template(flavor)
            if isinstance(template, str):
                for w in workloads:
                    self.session.record(flavor.name, w, rnd, error=template)
                return
        if group == "check-perf" and etcdctl_binary() is None:
            self.session.record(flavor.name, "check-perf", rnd, error="etcdctl not found")
            return
        opts = StartOptions(tls=self.tls) if group.startswith(MTLS) else None
        self._with_server(flavor, rnd, group, workloads, body, opts, template)

    @property
    def tls(self) -> TestPKI:
        """The run's CA and certificates (made on first use)."""
        if self._pki is None:
            self._pki = make_test_pki(self.session.root / "pki")
        return self._pki

    # -- server handling -----------------------------------------------------
    def server(self, flavor: Flavor, tag: str, opts: StartOptions | None = None) -> Server:
        """A server of ``flavor`` in a fresh directory of the run's temp root (not started)."""
        return Server(flavor, self.session.root / f"{flavor.name}-{tag}", opts or StartOptions(),
                      ready_timeout=300.0)

    def measured(self, srv: Server, fn):
        """Run ``fn()`` and return (result, server CPU seconds it cost, memory after).

        A server that is down beforehand (it died in an earlier workload) is started again on
        its data dir; one that dies during ``fn`` turns the result into an error with its log."""
        if not srv.alive():
            self.session.say(f"  {srv.flavor.name} is not running (exit code "
                             f"{srv.proc and srv.proc.returncode}); starting it again")
            srv.kill()
            srv.start()
        c0 = srv.cpu_seconds()
        res = fn()
        if not srv.alive():
            rc = srv.proc.returncode if srv.proc else None
            if isinstance(res, dict):
                res["_error"] = (f"server exited (code {rc}) during the run; log tail: "
                                 f"{tail(srv.log_tail(1500), 1200)}")
            return res, None, {}
        return res, (srv.cpu_seconds() - c0), srv.memory()

    def finish(self, srv: Server) -> None:
        try:
            srv.stop()
        finally:
            if not self.session.keep:
                srv.remove()

    def _with_server(self, f: Flavor, rnd: int, tag: str, workloads: list[str], body,
                     opts: StartOptions | None = None, template: Path | None = None) -> None:
        """Start a fresh server (from a template data dir if given), run body(srv), stop it.
        A start failure is recorded against every workload of the group."""
        srv = self.server(f, f"{tag}-r{rnd}", opts)
        self.tools.target = srv
        try:
            if template is not None:
                shutil.copytree(template, srv.data_dir)
            try:
                srv.start()
            except ServerError as e:
                for w in workloads:
                    self.session.record(f.name, w, rnd, error=f"server did not start: {e}"[:2000])
                return
            body(srv)
        finally:
            self.finish(srv)

    def _with_cluster(self, cf: ClusterFlavor, rnd: int, tag: str, workloads: list[str], body) -> None:
        """Start a fresh cluster, run body(target), stop it (and remove its data unless --keep).
        A start failure is recorded against every workload of the group."""
        self.tools.target = None
        root = self.session.root / f"{cf.name}-{tag}-r{rnd}"
        t = now_s()
        args = CLUSTER_GROUPS[tag].member_args(cf.name)
        try:
            target = cf.start(root, self.s.cluster_size, lifetime=3600.0, extra_args=args)
        except ServerError as e:
            for w in workloads:
                self.session.record(cf.name, w, rnd, error=f"cluster did not start: {e}"[:2000],
                                    extra={"member_args": list(args)})
            return
        self.session.say(f"  {cf.name} cluster up in {now_s() - t:.1f} s: {target.endpoint}"
                         + (f" (every member: {' '.join(args)})" if args else ""))
        self.tools.target = target
        first = len(self.session.runs)
        try:
            body(target)
        finally:
            for rec in self.session.runs[first:]:  # what each member ran with, beside its figures
                rec["member_args"] = list(args)
            self.tools.target = None
            target.stop()
            if not self.session.keep:
                shutil.rmtree(root, ignore_errors=True)

    def _measure_each(self, srv, rnd: int, workloads: list[str]) -> None:
        """The workloads of one start, one after another; the key of the range workloads is put
        before the first of them."""
        key_put = False
        for w in workloads:
            kind = WORKLOADS[w].kind
            if kind.startswith("range-") and not key_put:
                put_key(_probe_endpoint(srv), RANGE_KEY.encode(), b"v" * self.s.val_size, tls=srv.opts.tls)
                key_put = True
            self._measure(srv, rnd, w, kind)

    def _measure(self, srv, rnd: int, workload: str, kind: str) -> None:
        s = self.s
        if kind in ("put", "range-l", "range-s"):
            self._bench_or_load(srv, workload, rnd, WORKLOADS[workload].clients, kind)
        elif kind == "txn-put":
            c = WORKLOADS[workload].clients
            self._load(srv, workload, rnd, "txn-put", [
                "--clients", c, "--conns", conns_for(c), "--duration", f"{s.duration}s",
                "--prefix", f"/bench/txn/c{c}/", "--keys", min(s.keyspace, 10_000), "--val-size", s.val_size,
            ], timeout=s.duration + 300)
        elif kind in ("list", "count"):
            common = ["--clients", s.list_clients, "--conns", conns_for(s.list_clients),
                      "--duration", f"{s.duration}s", "--prefix", LIST_PREFIX]
            limit = ["--limit", s.list_limit] if kind == "list" else []
            self._load(srv, workload, rnd, kind, [*common, *limit, "--expect", s.list_keys], timeout=s.duration + 600)
        elif kind in ("watch", "watch-shared"):
            # Fan-out: W watchers on one prefix, E puts as fast as they go (rate 0); one gRPC
            # stream per watcher, or clientv3's default (watchers on one connection share a stream).
            shared = kind == "watch-shared"
            self._load(srv, workload, rnd, "watch", [
                "--watchers", s.watch_watchers, "--events", s.watch_events, "--writers", s.watch_writers,
                "--rate", 0, "--val-size", s.val_size, "--conns", conns_for(s.watch_watchers),
                "--timeout", f"{s.watch_timeout}s", "--prefix", f"/bench/{kind}/",
                *(["--share-streams"] if shared else [])], timeout=400)
        elif kind == "keepalive":
            self._keepalive(srv, rnd, workload)
        elif kind == "lease":
            self._load(srv, workload, rnd, "lease", [
                "--leases", s.lease_leases, "--ttl", s.lease_ttl, "--clients", 64, "--conns", 8,
                "--prefix", "/bench/lease/", "--val-size", s.val_size], timeout=s.lease_ttl + 600)
        elif kind == "k8s-mix":
            self._load(srv, workload, rnd, "k8s-mix", [
                "--nodes", s.k8s_nodes, "--pods", s.k8s_pods, "--pod-rate", s.k8s_pod_rate,
                "--duration", f"{s.k8s_duration}s", "--registry", "/registry/"], timeout=s.k8s_duration + 600)
        elif kind == "check-perf":
            self._check_perf(srv, rnd, workload)
        else:
            raise ValueError(f"{workload}: no load of kind {kind!r} runs on a plain start")

    def _bench_or_load(self, srv: Server, workload: str, rnd: int, clients: int, kind: str) -> None:
        """put / range-l / range-s with etcd's benchmark (calibrated to ~duration) or brainload."""
        s, name = self.s, srv.flavor.name
        logs = srv.root / "tools"
        ep, tls = _tool_endpoint(srv), srv.opts.tls
        if not self.use_benchmark:
            args = ["--clients", clients, "--conns", conns_for(clients), "--duration", f"{s.duration}s",
                    "--val-size", s.val_size]
            if kind == "put":
                args += ["--prefix", "/bench/put/", "--keys", s.keyspace]
                sub = "put"
            else:
                args += ["--prefix", "/bench/range/", "--keys", 1]
                if kind == "range-s":
                    args.append("--serializable")
                sub = "range"
            try:
                res, cpu, mem = self.measured(srv, lambda: self.tools.brainload(
                    sub, ep, args, s.duration + 120, logs, workload, tls=tls))
                self.session.record(name, workload, rnd, res, tool="brainload", cpu_s=cpu, mem=mem)
            except ToolError as e:
                self.session.record(name, workload, rnd, error=str(e), tool="brainload")
            return
        if kind == "put":
            sub = ["put", "--key-size", "8", "--val-size", str(s.val_size), "--key-space-size", str(s.keyspace)]
        else:
            sub = ["range", RANGE_KEY, "--consistency", "l" if kind == "range-l" else "s"]
        try:
            # Calibration (and warm-up): a short pass sizes --total for ~duration seconds.
            probe_total = max(200, clients * s.probe_per_client)
            probe = self.tools.etcd_benchmark(ep, clients, sub, probe_total, 120, logs, workload + "-probe",
                                              tls=tls)
            if probe.get("_error"):
                self.session.record(name, workload, rnd, probe, tool="benchmark")
                return
            total = int(max(clients * 10, min(probe["ops_per_s"] * s.duration, 5_000_000)))
            res, cpu, mem = self.measured(srv, lambda: self.tools.etcd_benchmark(
                ep, clients, sub, total, s.duration * 10 + 120, logs, workload, tls=tls))
            res["probe_ops_per_s"] = probe["ops_per_s"]
            self.session.record(name, workload, rnd, res, tool="benchmark", cpu_s=cpu, mem=mem)
        except ToolError as e:
            self.session.record(name, workload, rnd, error=str(e), tool="benchmark")

    def _load(self, srv: Server, workload: str, rnd: int, sub: str, args: list, timeout: float) -> dict | None:
        ep, tls = _tool_endpoint(srv), srv.opts.tls
        try:
            res, cpu, mem = self.measured(srv, lambda: self.tools.brainload(sub, ep, args, timeout,
                                                                            srv.root / "tools", workload, tls=tls))
            return self.session.record(srv.flavor.name, workload, rnd, res, tool="brainload", cpu_s=cpu,
                                       mem=mem)
        except ToolError as e:
            return self.session.record(srv.flavor.name, workload, rnd, error=str(e), tool="brainload")

    def _list_template(self, f: Flavor) -> Path | str:
        """Load the list prefix once per server, stop it, keep the data dir as a template."""
        if f.name in self.templates:
            return self.templates[f.name]
        s = self.s
        srv = self.server(f, "list-template")
        self.tools.target = srv
        self.session.say(f"  {f.name}: loading {s.list_keys} keys for the list template")
        t0 = now_s()
        try:
            srv.start()
            t = now_s()
            res = self.tools.brainload("load", srv.endpoint, [
                "--count", s.list_keys, "--clients", 64, "--conns", 8, "--prefix", LIST_PREFIX,
                "--val-size", s.val_size], 3600, srv.root / "tools", "list-load")
            if res.get("_error") or (res.get("ops") or 0) < s.list_keys:
                raise ToolError(f"load: {res.get('_error') or res.get('first_error')} "
                                f"({res.get('ops')} of {s.list_keys} keys)")
            self.session.say(f"  {f.name}: loaded in {now_s() - t:.1f}s ({res.get('ops_per_s', 0):.0f} keys/s)")
            srv.stop()
            tpl = self.session.root / "templates" / f.name
            tpl.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(srv.data_dir, tpl)
            self.templates[f.name] = tpl
        except (ServerError, ToolError, OSError) as e:
            self.templates[f.name] = f"list template: {e}"[:2000]
        finally:
            srv.remove()
            self.untimed += now_s() - t0
        return self.templates[f.name]

    def _keepalive(self, srv, rnd: int, workload: str) -> None:
        """N leases kept alive through one LeaseKeepAlive stream; the server's CPU is read at the
        edges of brainload's timed phase (its phase marks), not over the grants before it."""
        s = self.s
        name = srv.flavor.name
        marks: dict[str, float] = {}

        def on_mark(mark: str) -> None:
            marks[mark] = srv.cpu_seconds()

        args = ["--leases", s.keepalive_leases, "--ttl", s.keepalive_ttl, "--window", s.keepalive_window,
                "--duration", f"{s.keepalive_duration}s", "--clients", 64, "--conns", 8, "--prefix", "/bench/",
                "--val-size", s.val_size]
        try:
            res = self.tools.brainload("keepalive", _tool_endpoint(srv), args, s.keepalive_duration + 600,
                                       srv.root / "tools", workload, tls=srv.opts.tls, on_mark=on_mark)
        except ToolError as e:
            self.session.record(name, workload, rnd, error=str(e), tool="brainload")
            return
        cpu = None
        if "timed begin" in marks and "timed end" in marks:
            cpu = marks["timed end"] - marks["timed begin"]
        if not srv.alive():
            res["_error"] = f"server exited during the run; log tail: {tail(srv.log_tail(1500), 1200)}"
        self.session.record(name, workload, rnd, res, tool="brainload", cpu_s=cpu,
                            mem=srv.memory() if srv.alive() else {})

    def _check_perf(self, srv, rnd: int, workload: str) -> None:
        etcdctl = etcdctl_binary()
        load = self.s.check_perf_load
        cmd = [etcdctl, "--endpoints", srv.endpoint, "check", "perf", "--load", load]
        try:
            (rc, out, err), cpu, mem = self.measured(srv, lambda: self.tools.run(
                cmd, 300, srv.root / "tools", "check-perf"))
        except ToolError as e:
            self.session.record(srv.flavor.name, workload, rnd, error=str(e), tool="etcdctl")
            return
        res = parse_check_perf(out + "\n" + err, rc)
        res["_cmd"] = " ".join(cmd[1:])
        if "writes_per_s" in res:
            res["ops"] = res["writes_per_s"] * 60
            res["ops_per_s"] = res["writes_per_s"]
        error = None
        if "writes_per_s" not in res:
            error = f"check perf exit {rc}: {tail(out + err, 400)}"
        self.session.record(srv.flavor.name, workload, rnd, res, tool="etcdctl", cpu_s=cpu, mem=mem, error=error)

    def _failover(self, group: str, cf: ClusterFlavor, rnd: int) -> None:
        """kill -9 of the leader, the leader isolated (SIGSTOP), under brain also kill -9 of the NATS
        stream leader and a planned restart of every nats-server, then a rolling restart (SIGTERM),
        under a writer; every acknowledged write is read back afterwards.  cluster-failover-brain-defaults
        does only the faults brain's election timeout decides (the kills and isolations of the leader)."""
        s = self.s
        brain = cf.name == "brain"
        every = group == "cluster-failover"
        plan = clusters.FailoverPlan(leader_kills=s.failover_leader_kills,
                                     nats_kills=s.failover_nats_kills if brain and every else 0,
                                     rolling_restarts=s.failover_rolling_restarts if every else 0,
                                     leader_isolations=s.failover_isolations,
                                     nats_rolling_restarts=s.failover_nats_rolling_restarts if brain and every else 0,
                                     isolate_seconds=s.failover_isolate_seconds,
                                     rate=s.failover_rate, warmup=s.failover_warmup, settle=s.failover_settle)
        [workload] = measured_in(group)

        def body(target):
            res = clusters.failover(target, plan, target.root / "tools", f"r{rnd}", say=self.session.say)
            error = None
            if res.get("lost") or res.get("writer_violations") or res.get("verify_violations"):
                error = (f"{res.get('lost')} acknowledged writes lost, {res.get('writer_violations')} writer and "
                         f"{res.get('verify_violations')} verify violations: "
                         f"{res.get('verify_problems') or res.get('writer_revision_problems')}")
            elif res.get("fault_error"):
                error = f"the cluster did not come back from a fault: {res['fault_error']}"[:2000]
            elif res.get("skipped_kills"):
                error = f"kills skipped, the writer's time ran out: {res['skipped_kills']}"
            self.session.record(cf.name, workload, rnd, res, tool="clustercheck write + verify", error=error)
        self._with_cluster(cf, rnd, group, [workload], body)

    def _restart(self, f: Flavor, rnd: int) -> None:
        """Load N keys of 1 KiB and read RSS; then ``restart_samples`` times: SIGTERM + start, T
        overwrites (for brain: a journal tail just under its first checkpoint threshold), kill -9 +
        start.  Each start is timed until a linearizable count_only Range over the N keys answers
        (its count checked), with the server's CPU time from spawn to ready.  One sample of a
        restart is one start: the row gives their median and worst, the target is the worst."""
        s = self.s
        name = f.name
        srv = self.server(f, "restart", StartOptions(quota_bytes=QUOTA_8G))
        self.tools.target = srv
        out: dict = {"keys_target": s.restart_keys, "val_size": s.restart_val,
                     "samples_planned": s.restart_samples}
        cpu_total = 0.0
        error = None
        try:
            srv.start()
            t = now_s()
            loaded = 0
            chunk_no = 0
            while loaded < s.restart_keys:
                n = min(s.restart_chunk, s.restart_keys - loaded)
                c0 = srv.cpu_seconds()
                res = self.tools.brainload("load", srv.endpoint, [
                    "--count", n, "--start", loaded, "--clients", 64, "--conns", 8, "--prefix", RESTART_PREFIX,
                    "--val-size", s.restart_val], s.restart_load_cap + 600, srv.root / "tools",
                    f"restart-load-{chunk_no:03d}")
                cpu_total += srv.cpu_seconds() - c0
                chunk_no += 1
                loaded += int(res.get("ops") or 0)
                if res.get("_error") or (res.get("ops") or 0) < n:
                    out["load_error"] = res.get("_error") or res.get("first_error") or "short load"
                    break
                spent = now_s() - t
                rate = loaded / spent if spent > 0 else 0
                out.update(load_seconds=round(spent, 1), load_keys_per_s=round(rate, 1))
                if loaded < s.restart_keys:
                    projected = spent + (s.restart_keys - loaded) / max(rate, 1e-9)
                    self.session.say(f"  {name}: {loaded} keys loaded in {spent:.0f}s ({rate:.0f}/s)")
                    # Stop when the cap is spent, or early when the projection is far beyond it.
                    if spent > s.restart_load_cap or projected > 1.5 * s.restart_load_cap:
                        out["load_error"] = (f"stopped at {loaded} keys after {spent:.0f}s: loading "
                                             f"{s.restart_keys} would take ~{projected:.0f}s "
                                             f"(cap {s.restart_load_cap:.0f}s)")
                        break
            out["keys_loaded"] = loaded
            out["load_cpu_us_per_key"] = round(cpu_total * 1e6 / loaded, 1) if loaded else None
            time.sleep(s.settle)
            out["rss_after_load_kb"] = srv.memory().get("rss_kb")
            out["memory_after_load_kb"] = srv.memory()
            out["count_after_load"] = count_prefix(srv.endpoint, RESTART_PREFIX.encode())
            out["du_kb"] = du_kb(srv.data_dir)
            if out["count_after_load"] != loaded:
                error = f"{out['count_after_load']} keys found after the load, {loaded} loaded"
            tail = min(s.restart_tail, loaded)

            def write_tail(i: int) -> dict:  # overwrites of the first keys
                return self.tools.brainload("load", srv.endpoint, [
                    "--count", tail, "--start", 0, "--clients", 64, "--conns", 8, "--prefix", RESTART_PREFIX,
                    "--val-size", s.restart_val], s.restart_load_cap + 600, srv.root / "tools", f"restart-tail-{i + 1}")
            if error is None:
                error = self._restart_samples(srv, out, RESTART_PREFIX, loaded, s.restart_samples, tail, write_tail)
            else:
                summarise_restart(out, [], [])
            out["ops"] = loaded
            self.session.record(name, "restart", rnd, out, tool="brainload load + harness probe",
                        cpu_s=cpu_total, error=error, extra={"partial": out.get("load_error")})
        except (ServerError, ToolError, OSError) as e:
            summarise_restart(out, out.get("sigterm_samples") or [], out.get("kill9_samples") or [])
            self.session.record(name, "restart", rnd, out, error=str(e)[:2000], tool="brainload load + harness probe")
        finally:
            self.finish(srv)

    def _scale(self, f: Flavor, rnd: int) -> None:
        """Load ``scale_keys`` keys of Kubernetes shapes (brainload scale-load: Txn batches, then a
        share overwritten) and read RSS; then, one after another on that server: the pods listed in
        pages of each SCALE_LIMITS size and by RangeStream, count_only and keys_only over every key, a
        watch of the pods from before the load; last the restarts (SIGTERM, tail, kill -9).  Every
        read is checked against the counts the load reports, and recorded as its own workload."""
        s = self.s
        keys = s.scale_keys
        srv = Server(f, self.session.root / f"{f.name}-scale", StartOptions(quota_bytes=scale_quota(keys)),
                     ready_timeout=max(300.0, keys / 10_000))
        self.tools.target = srv
        slow = keys / 1000 + 600  # seconds any one step may take: 1,000 keys/s at the least
        try:
            srv.start()
        except ServerError as e:
            for w in measured_in("scale"):
                self.session.record(f.name, w, rnd, error=f"server did not start: {e}"[:2000])
            self.finish(srv)
            return
        try:
            load = self._scale_load(srv, rnd, keys, slow)
            if load is None:
                return
            # The restarts' ready marker goes in now: after the watch below, etcd may take no write for
            # minutes (its catch-up of the watch from before the load runs on after the client gave up).
            put_key(srv.endpoint, READY_MARKER.encode(), b"ready", tls=srv.opts.tls)
            kinds = load["result"]["kinds"]
            pods = kinds["pods"]
            list_args = ["--prefix", pods["prefix"], "--expect", pods["keys"], "--op-timeout", f"{slow:.0f}s"]
            for limit in SCALE_LIMITS:
                self._scale_read(srv, rnd, f"scale-list-{limit}", slow, [*list_args, "--op", "list", "--limit", limit],
                                 profile=s.scale_profile)
            self._scale_read(srv, rnd, "scale-stream", slow, [*list_args, "--op", "stream"], profile=s.scale_profile)
            self._load(srv, "scale-count", rnd, "count", [
                "--clients", 1, "--duration", f"{s.duration}s", "--prefix", SCALE_REGISTRY, "--expect", keys,
                "--op-timeout", f"{slow:.0f}s"], timeout=slow)
            self._scale_read(srv, rnd, "scale-keys-only", slow, [
                "--op", "keys-only", "--prefix", SCALE_REGISTRY, "--expect", keys, "--op-timeout", f"{slow:.0f}s"],
                profile=s.scale_profile)
            watch_limit = min(slow, s.scale_watch_limit)
            self._scale_read(srv, rnd, "scale-watch", watch_limit + 60, [
                "--op", "watch", "--prefix", pods["prefix"], "--from-rev", load["result"]["rev_before"] + 1,
                "--expect", pods["puts"], "--op-timeout", f"{watch_limit:.0f}s"])
            self._scale_restarts(srv, rnd, keys, slow)
        finally:
            self.finish(srv)

    def _scale_args(self, keys: int) -> list:
        s = self.s
        return ["--keys", keys, "--seed", s.scale_seed, "--clients", s.scale_clients,
                "--conns", conns_for(s.scale_clients), "--batch", s.scale_batch, "--registry", SCALE_REGISTRY,
                "--mix", s.scale_mix,
                "--op-timeout", "120s"]

    def _scale_load(self, srv: Server, rnd: int, keys: int, slow: float) -> dict | None:
        """The data set, recorded as scale-load with the RSS after it; None (and every other scale
        workload recorded as not run) when the load or its count check failed."""
        s = self.s
        args = [*self._scale_args(keys), "--overwrites", int(keys * s.scale_overwrite)]
        try:
            res, cpu, mem = self.measured(srv, lambda: self.tools.brainload(
                "scale-load", srv.endpoint, args, 2 * slow, srv.root / "tools", "scale-load"))
        except ToolError as e:
            res, cpu, mem = {"_error": str(e)}, None, {}
        error = None
        if not res.get("_error"):
            time.sleep(s.settle)
            res["rss_after_load_kb"] = srv.memory().get("rss_kb")
            res["memory_after_load_kb"] = srv.memory()
            res["du_kb"] = du_kb(srv.data_dir)
            res["count_after_load"] = count_prefix(srv.endpoint, SCALE_REGISTRY.encode())
            if res["count_after_load"] != keys:
                error = f"{res['count_after_load']} keys found after the load of {keys}"
        rec = self.session.record(srv.flavor.name, "scale-load", rnd, res, tool="brainload scale-load",
                                  cpu_s=cpu, mem=mem, error=error)
        if not rec["ok"]:
            for w in measured_in("scale")[1:]:
                self.session.record(srv.flavor.name, w, rnd, error=f"not run: the load failed ({rec['error']})"[:2000])
            return None
        return rec

    def _scale_read(self, srv: Server, rnd: int, workload: str, timeout: float, args: list,
                    profile: bool = False) -> None:
        """One brainload scale-read, recorded; a server without the RPC (Unimplemented) is recorded as
        ``unsupported``, which is not a failure.  ``profile``: then the same read once more under the
        profilers (benchmarks/profiles.py), its summary added to the record as ``result["profile"]``."""
        name = srv.flavor.name
        try:
            res, cpu, mem = self.measured(srv, lambda: self.tools.brainload(
                "scale-read", _tool_endpoint(srv), args, timeout, srv.root / "tools", workload, tls=srv.opts.tls))
        except ToolError as e:
            self.session.record(name, workload, rnd, error=str(e), tool="brainload")
            return
        if res.get(UNSUPPORTED):  # nothing was read: no CPU per key
            cpu = None
        rec = self.session.record(name, workload, rnd, res, tool="brainload", cpu_s=cpu, mem=mem)
        if profile and rec["ok"] and not res.get(UNSUPPORTED):
            rec["result"]["profile"] = self._profiled_read(srv, workload, timeout, args)

    def _profiled_read(self, srv: Server, workload: str, timeout: float, args: list) -> dict:
        """The read once more, after its timed run: brainload writing a CPU profile of it, brain's server
        sampled by py-spy meanwhile; the summary of both (or what went wrong)."""
        out_dir = srv.root / "profiles"
        out_dir.mkdir(parents=True, exist_ok=True)
        cpu_profile = out_dir / f"{workload}.pprof"
        out: dict = {"run": "a second run of the same read under the profilers (the row's figures are the first's)"}
        python = srv.flavor.name == "brain"
        try:
            sampler = profiles.ServerSampler(srv.pid, out_dir / f"{workload}.py-spy.txt") if python else None
            c0 = srv.cpu_seconds()
            with sampler or contextlib.nullcontext():
                res = self.tools.brainload("scale-read", _tool_endpoint(srv), [*args, "--cpu-profile", cpu_profile],
                                           timeout, srv.root / "tools", f"{workload}-profiled", tls=srv.opts.tls)
            out.update(seconds=res.get("seconds"), keys=res.get("keys"), client_cpu_s=res.get("client_cpu_s"),
                       server_cpu_s=round(srv.cpu_seconds() - c0, 3))
            if res.get("_error"):
                out["error"] = str(res["_error"])[:1000]
                return out
            out["client"] = profiles.client_profile(cpu_profile)
            out["server"] = (sampler.summary() if sampler is not None
                             else f"not profiled: {srv.flavor.name} is not a Python process (py-spy samples brain)")
        except (RuntimeError, ToolError, OSError, subprocess.SubprocessError) as e:
            out["error"] = " ".join(str(e).split())[:1000]
        self.session.say(f"  {srv.flavor.name} {workload} profiled: " + profiles.one_line(out))
        return out

    def _scale_restarts(self, srv: Server, rnd: int, keys: int, slow: float) -> None:
        """``scale_restart_samples`` SIGTERM and kill -9 restarts, each ready when a linearizable Get of
        one key answers, then every key counted; the tail before each kill -9 overwrites ``scale_tail``
        keys."""
        s = self.s
        tail = min(s.scale_tail, keys)
        out: dict = {"keys": keys, "samples_planned": s.scale_restart_samples}

        def write_tail(i: int) -> dict:
            return self.tools.brainload("scale-load", srv.endpoint, [
                *self._scale_args(keys), "--create=false", "--overwrites", tail, "--pass", i + 2],
                slow, srv.root / "tools", f"scale-tail-{i + 1}")
        try:
            error = self._restart_samples(srv, out, SCALE_REGISTRY, keys, s.scale_restart_samples, tail, write_tail,
                                          marker_put=True)
        except (ServerError, ToolError, OSError) as e:
            out.setdefault("sigterm_samples", [])
            out.setdefault("kill9_samples", [])
            summarise_restart(out, out["sigterm_samples"], out["kill9_samples"])
            error = str(e)[:2000]
        out["ops"] = keys
        # The server's CPU in its starts (spawn to ready), so CPU per op is per key held.
        cpu = sum(x.get(k) or 0.0 for x in out["sigterm_samples"] + out["kill9_samples"]
                  for k in ("cpu_to_ready_s", "cpu_to_ready_kill9_s"))
        self.session.record(srv.flavor.name, "scale-restart", rnd, out, tool="brainload scale-load + harness probe",
                            cpu_s=cpu, error=error)

    def _restart_samples(self, srv: Server, out: dict, prefix: str, loaded: int, samples: int, tail: int,
                         write_tail, *, marker_put: bool = False) -> str | None:
        """``samples`` times a SIGTERM and a kill -9 restart (``_restart_sample``), each one said as it
        ends, until one goes wrong; their lists and summary go into ``out``.  Returns what was wrong.

        Ready is a linearizable Get of READY_MARKER, put here (outside ``prefix``), the same probe for
        every server; the ``loaded`` keys under ``prefix`` are counted after it, untimed.  ``marker_put``:
        the caller put it already (the scale group, before its reads: etcd takes no write while its watch
        from before the load catches up, which goes on after the watch's client gave up)."""
        if not marker_put:
            put_key(srv.endpoint, READY_MARKER.encode(), b"ready", tls=srv.opts.tls)
        srv.ready_key = READY_MARKER.encode()
        sigterm, kill9 = [], []
        out["sigterm_samples"], out["kill9_samples"] = sigterm, kill9
        out["ready_probe"] = f"a linearizable Get of {READY_MARKER}"
        error = None
        for i in range(samples):
            error = self._restart_sample(srv, prefix, loaded, i, sigterm, kill9, tail, write_tail)
            self.session.say(f"  {srv.flavor.name}: restart sample {i + 1}/{samples}: SIGTERM "
                             f"{_sample_line(sigterm[-1:], 'ready_after_s', 'cpu_to_ready_s')}, kill -9 "
                             f"{_sample_line(kill9[-1:], 'ready_after_kill9_s', 'cpu_to_ready_kill9_s')}"
                             + (f"; {error}" if error else ""))
            if error:
                break
        summarise_restart(out, sigterm, kill9)
        return error

    def _restart_sample(self, srv: Server, prefix: str, loaded: int, i: int, sigterm: list, kill9: list,
                        tail: int, write_tail) -> str | None:
        """One SIGTERM restart and one kill -9 restart after ``write_tail(i)`` (``tail`` overwrites of
        loaded keys: the count stays), appended to the lists; returns what was wrong, if anything."""
        s = self.s
        # 1. SIGTERM, start (brain's shutdown writes a checkpoint: no journal to replay).
        one: dict = {"stop_seconds": round(srv.stop(grace=120), 3)}
        sigterm.append(one)
        one["ready_after_s"] = round(srv.start(), 3)
        one["cpu_to_ready_s"] = round(srv.ready_cpu_s, 2)
        restarted = now_s()
        one["rss_after_restart_kb"] = srv.memory().get("rss_kb")
        one["count_after_restart"] = _count_after_ready(srv, prefix)
        time.sleep(s.settle / 2)
        one["rss_after_restart_read_kb"] = srv.memory().get("rss_kb")
        if not srv.ready_found:
            return f"{READY_MARKER} not found by the readiness Get after SIGTERM restart {i + 1}"
        if one["count_after_restart"] != loaded:
            return f"{one['count_after_restart']} keys found after SIGTERM restart {i + 1}, {loaded} loaded"

        # 2. The tail, then at once kill -9.
        two: dict = {}
        kill9.append(two)
        before = _journal_gauges(srv)
        res = write_tail(i)
        two["tail_writes"] = int(res.get("ops") or 0)
        two["tail_seconds"] = res.get("seconds")
        after = _journal_gauges(srv)
        two["revision_before_kill9"] = head_revision(srv.endpoint)
        two["seconds_from_restart_to_kill9"] = round(now_s() - restarted, 1)
        if before is not None and after is not None:
            two["journal_tail_bytes"] = int(after["journal_bytes"])
            two["checkpoints_during_tail"] = int(after["checkpoints"] - before["checkpoints"])
        srv.kill()
        two["ready_after_kill9_s"] = round(srv.start(), 3)
        two["cpu_to_ready_kill9_s"] = round(srv.ready_cpu_s, 2)
        found = srv.ready_found
        two["count_after_kill9"] = _count_after_ready(srv, prefix)
        two["revision_after_kill9"] = head_revision(srv.endpoint)
        two["recovery_log"] = _recovery_lines(srv.log_tail(20000))
        if res.get("_error") or two["tail_writes"] < tail:
            return (f"tail {i + 1}: {res.get('_error') or res.get('first_error')} "
                    f"({two['tail_writes']} of {tail} writes)")
        if not found:
            return f"{READY_MARKER} not found by the readiness Get after kill -9 restart {i + 1}"
        if two["count_after_kill9"] != loaded:
            return f"{two['count_after_kill9']} keys found after kill -9 restart {i + 1}, {loaded} loaded"
        if two["revision_after_kill9"] != two["revision_before_kill9"]:
            return (f"revision {two['revision_after_kill9']} after kill -9 {i + 1}, "
                    f"{two['revision_before_kill9']} acknowledged before it")
        if two.get("checkpoints_during_tail"):
            return f"a checkpoint ran during tail {i + 1}, so kill -9 did not meet the largest tail"
        return None


def _count_after_ready(srv: Server, prefix: str) -> int | None:
    """The keys under ``prefix`` once the server is ready (a linearizable count, untimed: at 10M keys it
    costs etcd seconds)."""
    return count_prefix(srv.endpoint, prefix.encode(), timeout=900)


def _sample_line(samples: list[dict], ready: str, cpu: str) -> str:
    if not samples or samples[-1].get(ready) is None:
        return "–"
    x = samples[-1]
    return f"{x[ready]:.2f} s ({x.get(cpu, float('nan')):.2f} s CPU)"


def summarise_restart(out: dict, sigterm: list[dict], kill9: list[dict]) -> None:
    """The restart result's row values from its samples: each metric's list, median and worst
    (``<metric>_samples``, ``<metric>``, ``<metric>_worst``), and the first sample's other readings."""
    for samples, keys in ((sigterm, ("ready_after_s", "cpu_to_ready_s")),
                          (kill9, ("ready_after_kill9_s", "cpu_to_ready_kill9_s"))):
        for key in keys:
            xs = [x[key] for x in samples if x.get(key) is not None]
            out[key + "_samples"] = xs
            if xs:
                out[key] = round(statistics.median(xs), 3)
                out[key + "_worst"] = max(xs)
    if sigterm:
        for key in ("stop_seconds", "count_after_restart", "rss_after_restart_kb", "rss_after_restart_read_kb"):
            if key in sigterm[0]:
                out[key] = sigterm[0][key]
    if kill9:
        last = kill9[-1]
        for key in ("count_after_kill9", "revision_after_kill9", "revision_before_kill9", "recovery_log",
                    "seconds_from_restart_to_kill9", "tail_seconds"):
            if key in last:
                out[key] = last[key]
        out["tail_writes"] = min(x.get("tail_writes", 0) for x in kill9)
        tails = [x["journal_tail_bytes"] for x in kill9 if "journal_tail_bytes" in x]
        if tails:
            out["journal_tail_bytes"] = min(tails)
            out["checkpoints_during_tail"] = sum(x.get("checkpoints_during_tail", 0) for x in kill9)


def _journal_gauges(srv: Server) -> dict | None:
    """brain's journal bytes since its last checkpoint and checkpoint count (None for other servers)."""
    if srv.metrics_url is None:
        return None
    return {"journal_bytes": srv.metric("brain_journal_bytes_since_checkpoint") or 0.0,
            "checkpoints": srv.metric("brain_checkpoints_total") or 0.0}


def _recovery_lines(log: str) -> list[str]:
    """brain's own account of its last recovery (checkpoint load, journal replay)."""
    last = log.rsplit("=== start:", 1)[-1]
    return [ln.strip()[:300] for ln in last.splitlines()
            if "loaded checkpoint" in ln or "replayed" in ln or "recovered to revision" in ln]


def _tool_endpoint(srv) -> str:
    """What the load tools get: https://host:port under TLS, else host:port (a cluster: every member)."""
    return srv.url if srv.opts.tls else srv.endpoint


def _probe_endpoint(srv) -> str:
    """One endpoint for the harness's own calls (a cluster's first member)."""
    return getattr(srv, "probe_endpoint", srv.endpoint)
