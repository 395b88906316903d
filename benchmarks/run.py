"""Benchmark brain against etcd 3.4, 3.6 and 3.7 and kine (sqlite) on loopback.

    python -m benchmarks.run            # the full run (make bench), ~1 h 45 min (estimated)
    python -m benchmarks.run --smoke    # every workload for a second or two (make bench-smoke)

One server at a time, each start on a fresh data dir and free ports.  For
each workload group the servers take turns (A B C D A B C D ...) for
``--rounds`` rounds; the report takes the median per server.  Load comes from
etcd's own ``benchmark`` tool (put, range) and from ``brainload`` (the rest),
the same binaries for every server.  Server CPU time (process group
utime+stime from /proc) is read before and after each measured phase and
divided by its operations.  Under mutual TLS etcd 3.6 and 3.7 run twice, in
their default listener configuration and with the fast gRPC listener
(benchmarks/servers.py); a target against etcd is judged against the better
of the two.  The restart group times ``restart_samples`` starts of each kind
per server and records each start's CPU time.

Results: ``<out>/<date>.json`` (every run, raw), ``<out>/<date>.md`` and PNG
plots, and with the full run the table in the top-level README.  A server
that fails a workload gets the error recorded and the run moves on; a server
whose binary is missing is skipped with the reason in the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks import cluster as clusters
from benchmarks.cluster import ClusterFlavor, all_cluster_flavors
from benchmarks import report
from benchmarks.probes import count_prefix, head_revision, put_key
from benchmarks.servers import REPO_ROOT, Flavor, Server, ServerError, StartOptions, all_flavors, make_root, tool_path
from tests.support.tls import TestPKI, make_test_pki


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    name: str
    rounds: int
    duration: float            # seconds of each timed phase (put, range, txn-put, list, count, watch)
    put_clients: tuple = (1, 64, 256)
    range_clients: tuple = (64, 256)
    txn_clients: tuple = (64, 256)
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
    # Overwrites before the kill -9: 120,000 x 1,079 B of brain journal payload (measured per 1 KiB
    # Put) = 123.5 MiB, 96.5% of brain's first checkpoint threshold (128 MiB; 500k records and 60 s
    # are reached later at this size and rate), so brain replays its largest journal tail.
    restart_tail: int = 120_000
    # Starts timed per restart row (SIGTERM, kill -9) on the one loaded data dir: a row's value is
    # their median, its target is judged on the worst.
    restart_samples: int = 3
    check_perf: bool = True
    check_perf_load: str = "l"
    settle: float = 2.0        # seconds between the restart load and the RSS reading
    slow_group: float = 90.0   # a server whose first round of a group takes longer runs it only once
    probe_per_client: int = 4  # requests per client in benchmark's calibration pass
    # Mutual TLS mode (issue 10): the unary workloads at these client counts.
    mtls_clients: tuple = (64, 256)
    # Clusters (issue 9): 3 brains on 3 nats-servers against 3 etcd 3.6 members.
    cluster_size: int = 3
    cluster_clients: tuple = (64, 256)
    failover_leader_kills: int = 3   # per round: kill -9 of the leader (brain's, etcd's)
    failover_nats_kills: int = 2     # per round, brain only: kill -9 of the NATS stream leader
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
    check_perf=False, settle=0.0, probe_per_client=2,
    keepalive_leases=200, keepalive_ttl=2, keepalive_window=100, keepalive_duration=2.5,
    failover_leader_kills=1, failover_nats_kills=1,
    failover_rate=200.0, failover_warmup=1.5, failover_settle=1.0,
)


def conns_for(clients: int) -> int:
    """gRPC connections for a client count: one per 8 clients, at least one."""
    return max(1, clients // 8)


# ---------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------


class ToolError(RuntimeError):
    pass


# The server the tools are aimed at; a tool whose server died is stopped at once.
_current_server: Server | None = None


PHASE_MARK = "brainload-phase: "  # a tool's stderr line marking a phase edge ("timed begin", "timed end")


def _run_tool(cmd: list[str], timeout: float, log_dir: Path, tag: str, on_mark=None) -> tuple[int, str, str]:
    """Run a load tool; stdout/stderr go to files in ``log_dir`` and are returned.

    ``on_mark(name)`` is called as soon as the tool prints a PHASE_MARK line
    (the stderr file is read every 20 ms then, instead of every 0.5 s).
    Raises ToolError when it outlives ``timeout`` or when the server under test exits meanwhile."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{tag}.out", log_dir / f"{tag}.err"
    why = None
    with open(out_path, "wb") as out, open(err_path, "wb") as err, open(err_path, "rb") as err_reader:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        pending = b""

        def scan_marks(final: bool = False) -> None:
            nonlocal pending
            if on_mark is None:
                return
            pending += err_reader.read()
            *lines, pending = pending.split(b"\n")
            if final:
                lines.append(pending)
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(PHASE_MARK):
                    on_mark(text[len(PHASE_MARK):].strip())

        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5 if on_mark is None else 0.02)
                    # A tool that exits within a poll of its last mark: the marks
                    # not seen yet are read now (a little late, the server idle).
                    scan_marks(final=True)
                    break
                except subprocess.TimeoutExpired:
                    pass
                scan_marks()
                if time.monotonic() > deadline:
                    why = f"timed out after {timeout:.0f}s"
                elif _current_server is not None and not _current_server.alive():
                    srv = _current_server
                    state = (srv.describe() if hasattr(srv, "describe")
                             else f"code {srv.proc.returncode if srv.proc else None}")
                    why = (f"stopped: the server exited ({state}); "
                           f"server log tail: {_tail(srv.log_tail(1000), 500)}")
                if why:
                    break
        finally:
            if proc.poll() is None:  # timeout, dead server, or an interrupt of the harness
                proc.kill()
                proc.wait()
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    if why:
        raise ToolError(f"{tag}: {Path(cmd[0]).name} {why}; its stderr tail: {_tail(stderr, 300)}")
    return rc, stdout, stderr


def _tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return text[-n:] if len(text) > n else text


def brainload(sub: str, endpoint: str, args: list, timeout: float, log_dir: Path, tag: str,
              tls: TestPKI | None = None, on_mark=None) -> dict:
    exe = tool_path("brainload")
    if exe is None:
        raise ToolError("brainload not built (run benchmarks/build.sh)")
    cmd = [str(exe), sub, "--endpoints", endpoint, *map(str, args), *(tls.tool_flags() if tls else [])]
    rc, stdout, stderr = _run_tool(cmd, timeout, log_dir, tag, on_mark=on_mark)
    result = None
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    if result is None:
        raise ToolError(f"brainload {sub} exit {rc}, no JSON result; stderr tail: {_tail(stderr)}")
    result["_cmd"] = " ".join(cmd[1:])
    # "failure" is brainload's error text (txn-put's numeric "failed" counts else-branches).
    if result.get("failure") or isinstance(result.get("failed"), str):
        result["_error"] = result.get("failure") or result["failed"]
    elif rc != 0:
        result["_error"] = f"exit code {rc}: {_tail(stderr, 300)}"
    return result


_BENCH_PCT = re.compile(r"^\s*([\d.]+)% in ([\d.]+) secs", re.M)
_BENCH_FIELD = re.compile(r"^\s*(Total|Slowest|Fastest|Average|Stddev|Requests/sec):\s*([\d.]+)", re.M)
_BENCH_ERR = re.compile(r"^\s*\[(\d+)\]\s+(.*)$", re.M)


def parse_benchmark(text: str) -> dict:
    """etcd's ``benchmark`` text summary -> brainload-shaped result."""
    fields = {k: float(v) for k, v in _BENCH_FIELD.findall(text)}
    pct = {float(p): float(s) * 1000 for p, s in _BENCH_PCT.findall(text)}
    errors = {}
    if "Error distribution:" in text:
        for n, msg in _BENCH_ERR.findall(text.split("Error distribution:", 1)[1]):
            errors[msg.strip()] = int(n)
    rps = fields.get("Requests/sec", 0.0)
    secs = fields.get("Total", 0.0)
    res = {
        "ops": int(round(rps * secs)),
        "errors": sum(errors.values()),
        "seconds": secs,
        "ops_per_s": rps,
        "latency_ms": {
            "p50": pct.get(50.0), "p90": pct.get(90.0), "p99": pct.get(99.0),
            "max": fields["Slowest"] * 1000 if "Slowest" in fields else None,
            "mean": fields["Average"] * 1000 if "Average" in fields else None,
        },
    }
    if errors:
        res["first_error"] = next(iter(errors))
        res["error_kinds"] = errors
    return res


def etcd_benchmark(endpoint: str, clients: int, sub: list, total: int, timeout: float, log_dir: Path,
                   tag: str, tls: TestPKI | None = None) -> dict:
    exe = tool_path("benchmark")
    if exe is None:
        raise ToolError("benchmark not built")
    cmd = [str(exe), "--endpoints", endpoint, "--clients", str(clients), "--conns", str(conns_for(clients)),
           *(tls.tool_flags() if tls else []), *sub, "--total", str(total)]
    rc, stdout, stderr = _run_tool(cmd, timeout, log_dir, tag)
    res = parse_benchmark(stdout)
    res["_cmd"] = " ".join(cmd[1:])
    res["clients"] = clients
    if rc != 0:
        res["_error"] = f"exit code {rc}: {_tail(stderr, 300)}"
    elif res["ops"] == 0:
        res["_error"] = res.get("first_error") or f"no successful requests; stderr tail: {_tail(stderr, 300)}"
    return res


_PERF_LINE = re.compile(r"^(PASS|FAIL)(?::\s*(.*))?$|^(Slowest request took too long|Stddev too high):?\s*(.*)$")


def parse_check_perf(text: str, rc: int) -> dict:
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    checks = []
    for ln in lines:
        m = _PERF_LINE.match(ln)
        if m and (m.group(2) or m.group(4)):
            checks.append(ln)
    verdict = "PASS" if rc == 0 and "PASS" in lines else "FAIL"
    res: dict = {"pass": verdict == "PASS", "checks": checks}
    m = re.search(r"(?:Throughput is|Throughput too low:)\s*(\d+) writes/s", text)
    if m:
        res["writes_per_s"] = int(m.group(1))
    m = re.search(r"Slowest request took(?: too long)?:?\s*([\d.]+)s", text)
    if m:
        res["slowest_s"] = float(m.group(1))
    m = re.search(r"Stddev (?:is|too high:)\s*([\d.]+)s", text)
    if m:
        res["stddev_s"] = float(m.group(1))
    return res


# ---------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------


def now_s() -> float:
    return time.monotonic()


class Bench:
    def __init__(self, settings: Settings, flavors: list[Flavor], groups: list[str], out_dir: Path,
                 tmp_root: Path, keep: bool, readme: bool):
        self.s = settings
        self.flavors = flavors
        # The clusters of the selected servers that have one (brain, etcd-3.6).
        self.cluster_flavors = [c for c in all_cluster_flavors() if c.name in [f.name for f in flavors]]
        self._tls: TestPKI | None = None
        self.groups = groups
        self.out_dir = out_dir
        self.root = tmp_root
        self.keep = keep
        self.readme = readme
        self.t0 = now_s()
        self.runs: list[dict] = []
        self.notes: list[str] = []
        self.templates: dict[str, Path | str] = {}
        self.untimed = 0.0  # seconds of the current group spent on one-off setup (the list template)
        self.stamp = _dt.datetime.now().strftime("%Y-%m-%d")
        self.json_path, self.md_path = self._paths()
        self.meta = self._meta()
        self.use_benchmark = tool_path("benchmark") is not None
        if not self.use_benchmark:
            self.notes.append("etcd's `benchmark` tool is not built: put and range use brainload instead.")

    # -- bookkeeping -------------------------------------------------------
    def _paths(self) -> tuple[Path, Path]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        base = self.stamp if self.s.name == "full" else f"{self.stamp}-{self.s.name}"
        n = 1
        name = base
        while (self.out_dir / f"{name}.json").exists():
            n += 1
            name = f"{base}-{n}"
        self.base = name
        return self.out_dir / f"{name}.json", self.out_dir / f"{name}.md"

    def _meta(self) -> dict:
        servers = {}
        for f in all_flavors():
            ok, why = f.available()
            selected = f.name in [x.name for x in self.flavors]
            servers[f.name] = {
                "selected": selected, "available": ok, "reason": why,
                "version": f.version() if ok else None, "flags": f.flags_note(),
                "measured_process": f.process_note,
            }
        tools = {}
        for name in ("benchmark", "brainload", "etcdctl-3.6"):
            p = tool_path(name)
            tools[name] = _go_module_version(p) if p else None
        etcdctl = self._etcdctl()
        tools["etcdctl (check perf)"] = _first_line_of([etcdctl, "version"]) if etcdctl else None
        clusters_meta = {}
        if any(g.startswith("cluster") for g in self.groups):
            for c in self.cluster_flavors:
                ok, why = c.available()
                clusters_meta[c.name] = {"available": ok, "reason": why, "version": c.version() if ok else None,
                                         "flags": c.flags_note(), "measured_process": c.process_note,
                                         "size": self.s.cluster_size}
            path, why = clusters._binary(_clustercheck_binary)
            tools["clustercheck"] = _go_module_version(Path(path)) if path else f"missing: {why}"
        return {
            "settings": dataclasses.asdict(self.s),
            "groups": self.groups,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine_facts(self.root),
            "servers": servers,
            "tools": tools,
            "conns_rule": "gRPC connections = max(1, clients // 8)",
            "order_rule": "servers take turns; the order rotates by one place per round and per group",
            "restart_rule": ("restart: SIGTERM, then start until a linearizable count_only Range over the loaded "
                             "keys answers (count checked); restart-kill9: the same after restart_tail overwrites "
                             "and kill -9 (brain: its journal holds the tail, below the first checkpoint "
                             "threshold; etcd and kine: whatever their WAL holds)"),
            "brain_checkpoint_thresholds": _brain_checkpoint_thresholds(),
            "clusters": clusters_meta,
            "mtls_rule": ("mtls- workloads: every server on https:// with client-certificate auth (etcd and brain: "
                          "--cert-file --key-file --trusted-ca-file --client-cert-auth; kine: --server-cert-file "
                          "--server-key-file --trusted-ca-file, which makes it require a client certificate), "
                          "a CA and certificates made for the run; the load generators present a client "
                          "certificate of that CA.  etcd 3.6 and 3.7 run in two configurations: default (one "
                          "--listen-client-urls for gRPC and HTTP, as kubeadm deploys it; under TLS etcd then "
                          "serves gRPC through Go's net/http handler, etcd-io/etcd#15402) and fast gRPC "
                          "(-fast: --listen-client-http-urls on a second port, so the client port the load uses "
                          "is grpc-go's own server); a ratio or target against etcd uses the better of the two"),
            "cluster_rule": ("cluster- workloads: a 3-replica brain (`brain serve --journal-url`) on 3 nats-servers "
                             "with `jetstream { sync_interval: always }` against 3 etcd 3.6 members, every process "
                             "on this machine; the load generators get every member's endpoint; server CPU is "
                             "that of every process of the cluster (brain: 3 brains + 3 nats-servers)"),
            "failover_rule": ("cluster-failover: clustercheck's open-loop writer over every endpoint "
                              f"({self.s.failover_rate:g} writes/s asked, 16 connections) while the leader is "
                              "killed with SIGKILL (brain: also the NATS stream leader's nats-server), restarted, "
                              "and the next kill waits until every member serves; a kill's write pause is the "
                              "longest gap between acknowledged writes that begins within 3 s of it; afterwards "
                              "clustercheck verify reads every acknowledged write back at its revision"),
        }

    def elapsed(self) -> str:
        s = int(now_s() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"

    def say(self, msg: str) -> None:
        print(f"[{self.elapsed()}] {msg}", flush=True)

    def save(self, final: bool = False) -> None:
        self.meta["notes"] = self.notes
        self.meta["elapsed_s"] = round(now_s() - self.t0, 1)
        if final:
            self.meta["finished"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
            self.meta["machine"]["load_average_end"] = _load_average()
        data = {"meta": self.meta, "runs": self.runs}
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        tmp.replace(self.json_path)

    def record(self, server: str, workload: str, rnd: int, result: dict | None = None, *,
               error: str | None = None, tool: str = "", cpu_s: float | None = None,
               mem: dict | None = None, extra: dict | None = None) -> dict:
        result = dict(result or {})
        cmd = result.pop("_cmd", None)
        if cmd:  # the run's temporary paths (certificates) are this machine's, not the result's
            cmd = cmd.replace(str(self.root), "<tmp-root>")
        if cpu_s is not None and cpu_s != cpu_s:  # NaN: the server was gone
            cpu_s = None
        err = error or result.pop("_error", None)
        ops = result.get("ops") or 0
        if err is None and not ops and workload not in ("restart", "check-perf"):
            err = result.get("first_error") or "no successful operations"
        rec = {
            "server": server, "workload": workload, "round": rnd, "tool": tool,
            "ok": err is None, "error": err, "cmd": cmd, "result": result,
            "cpu_s": cpu_s,
            "cpu_us_per_op": (cpu_s * 1e6 / ops) if (cpu_s is not None and ops) else None,
            "memory_kb": mem or {},
        }
        if extra:
            rec.update(extra)
        self.runs.append(rec)
        self.say(f"  {server:9s} {workload:14s} r{rnd}: {report.one_line(rec)}")
        return rec

    def workloads_of(self, group: str) -> list[str]:
        s = self.s
        return {
            "put": [f"put-c{c}" for c in s.put_clients],
            "range": [f"range-{k}-c{c}" for k in "ls" for c in s.range_clients],
            "txn-put": [f"txn-put-c{c}" for c in s.txn_clients],
            "list": ["list", "count"],
            "watch": ["watch", "watch-shared"],
            "mtls-put": [f"mtls-put-c{c}" for c in s.mtls_clients],
            "mtls-range": [f"mtls-range-l-c{c}" for c in s.mtls_clients],
            "mtls-txn-put": [f"mtls-txn-put-c{c}" for c in s.mtls_clients],
            "mtls-watch": ["mtls-watch", "mtls-watch-shared"],
            "cluster-load": [f"cluster-{w}-c{c}" for w in ("put", "txn-put", "range-l") for c in s.cluster_clients]
            + ["cluster-watch", "cluster-watch-shared"],
        }.get(group, [group])

    def flavors_of(self, group: str) -> list:
        """The servers a group runs on: clusters for the cluster groups; the TLS-only
        configurations (etcd's fast gRPC listener) in the mutual TLS groups alone."""
        if group.startswith("cluster"):
            return self.cluster_flavors
        if group.startswith("mtls-"):
            return self.flavors
        return [f for f in self.flavors if not f.tls_only]

    @property
    def tls(self) -> TestPKI:
        """The run's CA and certificates (made on first use)."""
        if self._tls is None:
            self._tls = make_test_pki(self.root / "pki")
        return self._tls

    # -- server handling -----------------------------------------------------
    def server(self, flavor: Flavor, tag: str, opts: StartOptions | None = None) -> Server:
        return Server(flavor, self.root / f"{flavor.name}-{tag}", opts or StartOptions(), ready_timeout=300.0)

    def measured(self, srv: Server, fn):
        """Run ``fn()`` and return (result, server CPU seconds it cost, memory after).

        A server that is down beforehand (it died in an earlier workload) is started again on
        its data dir; one that dies during ``fn`` turns the result into an error with its log."""
        if not srv.alive():
            self.say(f"  {srv.flavor.name} is not running (exit code {srv.proc and srv.proc.returncode}); "
                     f"starting it again")
            srv.kill()
            srv.start()
        c0 = srv.cpu_seconds()
        res = fn()
        if not srv.alive():
            rc = srv.proc.returncode if srv.proc else None
            if isinstance(res, dict):
                res["_error"] = (f"server exited (code {rc}) during the run; log tail: "
                                 f"{_tail(srv.log_tail(1500), 1200)}")
            return res, None, {}
        return res, (srv.cpu_seconds() - c0), srv.memory()

    def finish(self, srv: Server) -> None:
        try:
            srv.stop()
        finally:
            if not self.keep:
                srv.remove()

    # -- main loop ------------------------------------------------------------
    def run(self) -> int:
        s = self.s
        sel = ", ".join(f.name for f in self.flavors)
        self.say(f"{s.name} run: servers {sel}; groups {', '.join(self.groups)}; {s.rounds} round(s); "
                 f"temp root {self.root}; results {self.json_path}")
        for name, info in self.meta["servers"].items():
            if info["selected"] and not info["available"]:
                self.say(f"skipping {name}: {info['reason']}")
        self.flavors = [f for f in self.flavors if self.meta["servers"][f.name]["available"]]
        for name, info in self.meta.get("clusters", {}).items():
            if not info["available"]:
                self.say(f"skipping the {name} cluster: {info['reason']}")
                self.notes.append(f"{name} cluster skipped: {info['reason']}")
        self.cluster_flavors = [c for c in self.cluster_flavors
                                if self.meta.get("clusters", {}).get(c.name, {}).get("available")
                                and self.meta["servers"][c.name]["available"]]
        for gi, g in enumerate(self.groups, 1):
            rounds = 1 if g in ("restart", "check-perf") else s.rounds
            slow: dict[str, float] = {}
            for rnd in range(1, rounds + 1):
                for f in self.round_order(gi, rnd, self.flavors_of(g)):
                    if f.name in slow:
                        continue
                    self.say(f"[group {gi}/{len(self.groups)}] {g} round {rnd}/{rounds}: {f.name}")
                    t = now_s()
                    self.untimed = 0.0
                    try:
                        getattr(self, "group_" + g.replace("-", "_"))(f, rnd)
                    except Exception as e:  # keep going: record and move on
                        self.say(f"  {f.name} {g}: harness error {e!r}")
                        done = {(r["workload"]) for r in self.runs if r["server"] == f.name and r["round"] == rnd}
                        for w in self.workloads_of(g):
                            if w not in done:
                                self.record(f.name, w, rnd, error=f"harness error: {e!r}",
                                            extra={"traceback": traceback.format_exc()[-2000:]})
                    took = now_s() - t - self.untimed
                    # A cluster's rounds are long by design (every workload on one start): always all.
                    if rnd == 1 and rounds > 1 and took > s.slow_group and not g.startswith("cluster"):
                        slow[f.name] = took
                        note = (f"{f.name}: {g} ran once (its first round took {took:.0f} s, over the "
                                f"{s.slow_group:.0f} s after which a server's group is not repeated)")
                        self.notes.append(note)
                        self.say("  " + note)
                self.save()
        self.save(final=True)
        report.write_all(self.json_path, self.md_path, readme=self.readme)
        self.say(f"done in {self.elapsed()}: {self.md_path}")
        return 0

    def round_order(self, group_index: int, rnd: int, flavors: list | None = None) -> list:
        """The servers of one round, rotated by one place per round and per group
        (A B C D, B C D A, ...), so no server always runs first or last."""
        flavors = self.flavors if flavors is None else flavors
        k = (group_index - 1 + rnd - 1) % len(flavors) if flavors else 0
        return flavors[k:] + flavors[:k]

    def _with_server(self, f: Flavor, rnd: int, tag: str, workloads: list[str], body,
                     opts: StartOptions | None = None, template: Path | None = None) -> None:
        """Start a fresh server (from a template data dir if given), run body(srv), stop it.
        A start failure is recorded against every workload of the group."""
        global _current_server
        srv = self.server(f, f"{tag}-r{rnd}", opts)
        _current_server = srv
        try:
            if template is not None:
                shutil.copytree(template, srv.data_dir)
            try:
                srv.start()
            except ServerError as e:
                for w in workloads:
                    self.record(f.name, w, rnd, error=f"server did not start: {e}"[:2000])
                return
            body(srv)
        finally:
            self.finish(srv)

    def _with_cluster(self, cf: ClusterFlavor, rnd: int, tag: str, workloads: list[str], body) -> None:
        """Start a fresh cluster, run body(target), stop it (and remove its data unless --keep).
        A start failure is recorded against every workload of the group."""
        global _current_server
        _current_server = None
        root = self.root / f"{cf.name}-{tag}-r{rnd}"
        t = now_s()
        try:
            target = cf.start(root, self.s.cluster_size, lifetime=3600.0)
        except ServerError as e:
            for w in workloads:
                self.record(cf.name, w, rnd, error=f"cluster did not start: {e}"[:2000])
            return
        self.say(f"  {cf.name} cluster up in {now_s() - t:.1f} s: {target.endpoint}")
        _current_server = target
        try:
            body(target)
        finally:
            _current_server = None
            target.stop()
            if not self.keep:
                shutil.rmtree(root, ignore_errors=True)

    # -- groups -----------------------------------------------------------------
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
                res, cpu, mem = self.measured(srv, lambda: brainload(
                    sub, ep, args, s.duration + 120, logs, workload, tls=tls))
                self.record(name, workload, rnd, res, tool="brainload", cpu_s=cpu, mem=mem)
            except ToolError as e:
                self.record(name, workload, rnd, error=str(e), tool="brainload")
            return
        if kind == "put":
            sub = ["put", "--key-size", "8", "--val-size", str(s.val_size), "--key-space-size", str(s.keyspace)]
        else:
            sub = ["range", RANGE_KEY, "--consistency", "l" if kind == "range-l" else "s"]
        try:
            # Calibration (and warm-up): a short pass sizes --total for ~duration seconds.
            probe_total = max(200, clients * s.probe_per_client)
            probe = etcd_benchmark(ep, clients, sub, probe_total, 120, logs, workload + "-probe", tls=tls)
            if probe.get("_error"):
                self.record(name, workload, rnd, probe, tool="benchmark")
                return
            total = int(max(clients * 10, min(probe["ops_per_s"] * s.duration, 5_000_000)))
            res, cpu, mem = self.measured(srv, lambda: etcd_benchmark(
                ep, clients, sub, total, s.duration * 10 + 120, logs, workload, tls=tls))
            res["probe_ops_per_s"] = probe["ops_per_s"]
            self.record(name, workload, rnd, res, tool="benchmark", cpu_s=cpu, mem=mem)
        except ToolError as e:
            self.record(name, workload, rnd, error=str(e), tool="benchmark")

    def _mtls(self) -> StartOptions:
        return StartOptions(tls=self.tls)

    # put -------------------------------------------------------------------
    def _put_on(self, srv, rnd: int, mode: str, clients) -> None:
        for c in clients:
            self._bench_or_load(srv, f"{mode}put-c{c}", rnd, c, "put")

    def group_put(self, f: Flavor, rnd: int) -> None:
        clients = self.s.put_clients
        self._with_server(f, rnd, "put", self.workloads_of("put"), lambda srv: self._put_on(srv, rnd, "", clients))

    def group_mtls_put(self, f: Flavor, rnd: int) -> None:
        clients = self.s.mtls_clients
        self._with_server(f, rnd, "mtls-put", self.workloads_of("mtls-put"),
                          lambda srv: self._put_on(srv, rnd, "mtls-", clients), self._mtls())

    # range -----------------------------------------------------------------
    def _range_on(self, srv, rnd: int, mode: str, kinds: str, clients) -> None:
        put_key(_probe_endpoint(srv), RANGE_KEY.encode(), b"v" * self.s.val_size, tls=srv.opts.tls)
        for k in kinds:
            for c in clients:
                self._bench_or_load(srv, f"{mode}range-{k}-c{c}", rnd, c, f"range-{k}")

    def group_range(self, f: Flavor, rnd: int) -> None:
        clients = self.s.range_clients
        self._with_server(f, rnd, "range", self.workloads_of("range"),
                          lambda srv: self._range_on(srv, rnd, "", "ls", clients))

    def group_mtls_range(self, f: Flavor, rnd: int) -> None:
        clients = self.s.mtls_clients
        self._with_server(f, rnd, "mtls-range", self.workloads_of("mtls-range"),
                          lambda srv: self._range_on(srv, rnd, "mtls-", "l", clients), self._mtls())

    # txn-put ---------------------------------------------------------------
    def _txn_put_on(self, srv, rnd: int, mode: str, clients) -> None:
        s = self.s
        for c in clients:
            self._load(srv, f"{mode}txn-put-c{c}", rnd, "txn-put", [
                "--clients", c, "--conns", conns_for(c), "--duration", f"{s.duration}s",
                "--prefix", f"/bench/txn/c{c}/", "--keys", min(s.keyspace, 10_000), "--val-size", s.val_size,
            ], timeout=s.duration + 300)

    def group_txn_put(self, f: Flavor, rnd: int) -> None:
        clients = self.s.txn_clients
        self._with_server(f, rnd, "txn-put", self.workloads_of("txn-put"),
                          lambda srv: self._txn_put_on(srv, rnd, "", clients))

    def group_mtls_txn_put(self, f: Flavor, rnd: int) -> None:
        clients = self.s.mtls_clients
        self._with_server(f, rnd, "mtls-txn-put", self.workloads_of("mtls-txn-put"),
                          lambda srv: self._txn_put_on(srv, rnd, "mtls-", clients), self._mtls())

    def _load(self, srv: Server, workload: str, rnd: int, sub: str, args: list, timeout: float) -> dict | None:
        ep, tls = _tool_endpoint(srv), srv.opts.tls
        try:
            res, cpu, mem = self.measured(srv, lambda: brainload(sub, ep, args, timeout,
                                                                  srv.root / "tools", workload, tls=tls))
            return self.record(srv.flavor.name, workload, rnd, res, tool="brainload", cpu_s=cpu, mem=mem)
        except ToolError as e:
            return self.record(srv.flavor.name, workload, rnd, error=str(e), tool="brainload")

    def _list_template(self, f: Flavor) -> Path | str:
        """Load the list prefix once per server, stop it, keep the data dir as a template."""
        if f.name in self.templates:
            return self.templates[f.name]
        s = self.s
        global _current_server
        srv = self.server(f, "list-template")
        _current_server = srv
        self.say(f"  {f.name}: loading {s.list_keys} keys for the list template")
        t0 = now_s()
        try:
            srv.start()
            t = now_s()
            res = brainload("load", srv.endpoint, [
                "--count", s.list_keys, "--clients", 64, "--conns", 8, "--prefix", LIST_PREFIX,
                "--val-size", s.val_size], 3600, srv.root / "tools", "list-load")
            if res.get("_error") or (res.get("ops") or 0) < s.list_keys:
                raise ToolError(f"load: {res.get('_error') or res.get('first_error')} "
                                f"({res.get('ops')} of {s.list_keys} keys)")
            self.say(f"  {f.name}: loaded in {now_s() - t:.1f}s ({res.get('ops_per_s', 0):.0f} keys/s)")
            srv.stop()
            tpl = self.root / "templates" / f.name
            tpl.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(srv.data_dir, tpl)
            self.templates[f.name] = tpl
        except (ServerError, ToolError, OSError) as e:
            self.templates[f.name] = f"list template: {e}"[:2000]
        finally:
            srv.remove()
            self.untimed += now_s() - t0
        return self.templates[f.name]

    def group_list(self, f: Flavor, rnd: int) -> None:
        s = self.s
        wl = ["list", "count"]
        tpl = self._list_template(f)
        if isinstance(tpl, str):
            for w in wl:
                self.record(f.name, w, rnd, error=tpl)
            return

        def body(srv):
            common = ["--clients", s.list_clients, "--conns", conns_for(s.list_clients),
                      "--duration", f"{s.duration}s", "--prefix", LIST_PREFIX]
            self._load(srv, "list", rnd, "list", [*common, "--limit", s.list_limit, "--expect", s.list_keys],
                       timeout=s.duration + 600)
            self._load(srv, "count", rnd, "count", [*common, "--expect", s.list_keys], timeout=s.duration + 600)
        self._with_server(f, rnd, "list", wl, body, template=tpl)

    # watch -----------------------------------------------------------------
    def _watch_on(self, srv, rnd: int, mode: str) -> None:
        """Fan-out: W watchers on one prefix, E puts as fast as they go (rate 0).  Twice: one gRPC
        stream per watcher, then clientv3's default (watchers on one connection share a stream)."""
        s = self.s
        common = ["--watchers", s.watch_watchers, "--events", s.watch_events, "--writers", s.watch_writers,
                  "--rate", 0, "--val-size", s.val_size, "--conns", conns_for(s.watch_watchers),
                  "--timeout", f"{s.watch_timeout}s"]
        self._load(srv, f"{mode}watch", rnd, "watch", [*common, "--prefix", "/bench/watch/"], timeout=400)
        self._load(srv, f"{mode}watch-shared", rnd, "watch", [*common, "--prefix", "/bench/watch-shared/",
                                                              "--share-streams"], timeout=400)

    def group_watch(self, f: Flavor, rnd: int) -> None:
        self._with_server(f, rnd, "watch", self.workloads_of("watch"), lambda srv: self._watch_on(srv, rnd, ""))

    def group_mtls_watch(self, f: Flavor, rnd: int) -> None:
        self._with_server(f, rnd, "mtls-watch", self.workloads_of("mtls-watch"),
                          lambda srv: self._watch_on(srv, rnd, "mtls-"), self._mtls())

    # keepalive ---------------------------------------------------------------
    def _keepalive_on(self, srv, rnd: int, workload: str) -> None:
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
            res = brainload("keepalive", _tool_endpoint(srv), args, s.keepalive_duration + 600, srv.root / "tools",
                            workload, tls=srv.opts.tls, on_mark=on_mark)
        except ToolError as e:
            self.record(name, workload, rnd, error=str(e), tool="brainload")
            return
        cpu = None
        if "timed begin" in marks and "timed end" in marks:
            cpu = marks["timed end"] - marks["timed begin"]
        if not srv.alive():
            res["_error"] = f"server exited during the run; log tail: {_tail(srv.log_tail(1500), 1200)}"
        self.record(name, workload, rnd, res, tool="brainload", cpu_s=cpu, mem=srv.memory() if srv.alive() else {})

    def group_keepalive(self, f: Flavor, rnd: int) -> None:
        self._with_server(f, rnd, "keepalive", ["keepalive"], lambda srv: self._keepalive_on(srv, rnd, "keepalive"))

    def group_mtls_keepalive(self, f: Flavor, rnd: int) -> None:
        self._with_server(f, rnd, "mtls-keepalive", ["mtls-keepalive"],
                          lambda srv: self._keepalive_on(srv, rnd, "mtls-keepalive"), self._mtls())

    # clusters ----------------------------------------------------------------
    def group_cluster_load(self, cf: ClusterFlavor, rnd: int) -> None:
        """On one cluster start: put, txn-put and linearizable range at each client count with every
        endpoint given to the load generator, then watch fan-out (streams spread over the members)."""
        clients = self.s.cluster_clients

        def body(target):
            self._put_on(target, rnd, "cluster-", clients)
            self._txn_put_on(target, rnd, "cluster-", clients)
            self._range_on(target, rnd, "cluster-", "l", clients)
            self._watch_on(target, rnd, "cluster-")
        self._with_cluster(cf, rnd, "cluster-load", self.workloads_of("cluster-load"), body)

    def group_cluster_failover(self, cf: ClusterFlavor, rnd: int) -> None:
        """kill -9 of the leader (and of the NATS stream leader under brain) under a writer; every
        acknowledged write is read back afterwards."""
        s = self.s
        plan = clusters.FailoverPlan(leader_kills=s.failover_leader_kills,
                                     nats_kills=s.failover_nats_kills if cf.name == "brain" else 0,
                                     rate=s.failover_rate, warmup=s.failover_warmup, settle=s.failover_settle)

        def body(target):
            res = clusters.failover(target, plan, target.root / "tools", f"r{rnd}", say=self.say)
            error = None
            if res.get("lost") or res.get("writer_violations") or res.get("verify_violations"):
                error = (f"{res.get('lost')} acknowledged writes lost, {res.get('writer_violations')} writer and "
                         f"{res.get('verify_violations')} verify violations: "
                         f"{res.get('verify_problems') or res.get('writer_revision_problems')}")
            elif res.get("skipped_kills"):
                error = f"kills skipped, the writer's time ran out: {res['skipped_kills']}"
            self.record(cf.name, "cluster-failover", rnd, res, tool="clustercheck write + verify", error=error)
        self._with_cluster(cf, rnd, "cluster-failover", ["cluster-failover"], body)

    def group_lease(self, f: Flavor, rnd: int) -> None:
        s = self.s

        def body(srv):
            self._load(srv, "lease", rnd, "lease", [
                "--leases", s.lease_leases, "--ttl", s.lease_ttl, "--clients", 64, "--conns", 8,
                "--prefix", "/bench/lease/", "--val-size", s.val_size], timeout=s.lease_ttl + 600)
        self._with_server(f, rnd, "lease", ["lease"], body)

    def group_k8s_mix(self, f: Flavor, rnd: int) -> None:
        s = self.s

        def body(srv):
            self._load(srv, "k8s-mix", rnd, "k8s-mix", [
                "--nodes", s.k8s_nodes, "--pods", s.k8s_pods, "--pod-rate", s.k8s_pod_rate,
                "--duration", f"{s.k8s_duration}s", "--registry", "/registry/"], timeout=s.k8s_duration + 600)
        self._with_server(f, rnd, "k8s-mix", ["k8s-mix"], body)

    def _etcdctl(self) -> str | None:
        p = tool_path("etcdctl-3.6")
        return str(p) if p else shutil.which("etcdctl")

    def group_check_perf(self, f: Flavor, rnd: int) -> None:
        etcdctl = self._etcdctl()
        if etcdctl is None:
            self.record(f.name, "check-perf", rnd, error="etcdctl not found")
            return
        load = self.s.check_perf_load

        def body(srv):
            cmd = [etcdctl, "--endpoints", srv.endpoint, "check", "perf", "--load", load]
            try:
                (rc, out, err), cpu, mem = self.measured(srv, lambda: _run_tool(
                    cmd, 300, srv.root / "tools", "check-perf"))
            except ToolError as e:
                self.record(f.name, "check-perf", rnd, error=str(e), tool="etcdctl")
                return
            res = parse_check_perf(out + "\n" + err, rc)
            res["_cmd"] = " ".join(cmd[1:])
            if "writes_per_s" in res:
                res["ops"] = res["writes_per_s"] * 60
                res["ops_per_s"] = res["writes_per_s"]
            error = None
            if "writes_per_s" not in res:
                error = f"check perf exit {rc}: {_tail(out + err, 400)}"
            self.record(f.name, "check-perf", rnd, res, tool="etcdctl", cpu_s=cpu, mem=mem, error=error)
        self._with_server(f, rnd, "check-perf", ["check-perf"], body)

    def group_restart(self, f: Flavor, rnd: int) -> None:
        """Load N keys of 1 KiB and read RSS; then ``restart_samples`` times: SIGTERM + start, T
        overwrites (for brain: a journal tail just under its first checkpoint threshold), kill -9 +
        start.  Each start is timed until a linearizable count_only Range over the N keys answers
        (its count checked), with the server's CPU time from spawn to ready.  One sample of a
        restart is one start: the row gives their median and worst, the target is the worst."""
        s = self.s
        name = f.name
        global _current_server
        srv = self.server(f, "restart", StartOptions(big_quota=True))
        _current_server = srv
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
                res = brainload("load", srv.endpoint, [
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
                    self.say(f"  {name}: {loaded} keys loaded in {spent:.0f}s ({rate:.0f}/s)")
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
            srv.count_prefix = RESTART_PREFIX.encode()  # ready = a linearizable count answers
            if out["count_after_load"] != loaded:
                error = f"{out['count_after_load']} keys found after the load, {loaded} loaded"
            sigterm, kill9 = [], []
            out["sigterm_samples"], out["kill9_samples"] = sigterm, kill9
            for i in range(s.restart_samples if error is None else 0):
                error = self._restart_sample(srv, loaded, i, sigterm, kill9)
                self.say(f"  {name}: restart sample {i + 1}/{s.restart_samples}: SIGTERM "
                         f"{_sample_line(sigterm[-1:], 'ready_after_s', 'cpu_to_ready_s')}, kill -9 "
                         f"{_sample_line(kill9[-1:], 'ready_after_kill9_s', 'cpu_to_ready_kill9_s')}"
                         + (f"; {error}" if error else ""))
                if error:
                    break
            _summarise_restart(out, sigterm, kill9)
            out["ops"] = loaded
            self.record(name, "restart", rnd, out, tool="brainload load + harness probe",
                        cpu_s=cpu_total, error=error, extra={"partial": out.get("load_error")})
        except (ServerError, ToolError, OSError) as e:
            _summarise_restart(out, out.get("sigterm_samples") or [], out.get("kill9_samples") or [])
            self.record(name, "restart", rnd, out, error=str(e)[:2000], tool="brainload load + harness probe")
        finally:
            self.finish(srv)

    def _restart_sample(self, srv: Server, loaded: int, i: int, sigterm: list, kill9: list) -> str | None:
        """One SIGTERM restart and one kill -9 restart (after the tail), appended to the lists;
        returns what was wrong, if anything."""
        s = self.s
        # 1. SIGTERM, start (brain's shutdown writes a checkpoint: no journal to replay).
        one: dict = {"stop_seconds": round(srv.stop(grace=120), 3)}
        sigterm.append(one)
        one["ready_after_s"] = round(srv.start(), 3)
        one["cpu_to_ready_s"] = round(srv.ready_cpu_s, 2)
        restarted = now_s()
        one["count_after_restart"] = srv.ready_count
        one["rss_after_restart_kb"] = srv.memory().get("rss_kb")
        time.sleep(s.settle / 2)
        one["rss_after_restart_read_kb"] = srv.memory().get("rss_kb")
        if one["count_after_restart"] != loaded:
            return f"{one['count_after_restart']} keys found after SIGTERM restart {i + 1}, {loaded} loaded"

        # 2. The tail: overwrites of the first keys (the count stays), then at once kill -9.
        tail = min(s.restart_tail, loaded)
        two: dict = {}
        kill9.append(two)
        before = _journal_gauges(srv)
        res = brainload("load", srv.endpoint, [
            "--count", tail, "--start", 0, "--clients", 64, "--conns", 8, "--prefix", RESTART_PREFIX,
            "--val-size", s.restart_val], s.restart_load_cap + 600, srv.root / "tools", f"restart-tail-{i + 1}")
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
        two["count_after_kill9"] = srv.ready_count
        two["revision_after_kill9"] = head_revision(srv.endpoint)
        two["recovery_log"] = _recovery_lines(srv.log_tail(20000))
        if res.get("_error") or two["tail_writes"] < tail:
            return (f"tail {i + 1}: {res.get('_error') or res.get('first_error')} "
                    f"({two['tail_writes']} of {tail} writes)")
        if two["count_after_kill9"] != loaded:
            return f"{two['count_after_kill9']} keys found after kill -9 restart {i + 1}, {loaded} loaded"
        if two["revision_after_kill9"] != two["revision_before_kill9"]:
            return (f"revision {two['revision_after_kill9']} after kill -9 {i + 1}, "
                    f"{two['revision_before_kill9']} acknowledged before it")
        if two.get("checkpoints_during_tail"):
            return f"a checkpoint ran during tail {i + 1}, so kill -9 did not meet the largest tail"
        return None


def _sample_line(samples: list[dict], ready: str, cpu: str) -> str:
    if not samples or samples[-1].get(ready) is None:
        return "–"
    x = samples[-1]
    return f"{x[ready]:.2f} s ({x.get(cpu, float('nan')):.2f} s CPU)"


def _summarise_restart(out: dict, sigterm: list[dict], kill9: list[dict]) -> None:
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


RESTART_PREFIX = "/bench/restart/"


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


RANGE_KEY = "/bench/range/key"
LIST_PREFIX = "/bench/list/"


def _tool_endpoint(srv) -> str:
    """What the load tools get: https://host:port under TLS, else host:port (a cluster: every member)."""
    return srv.url if srv.opts.tls else srv.endpoint


def _probe_endpoint(srv) -> str:
    """One endpoint for the harness's own calls (a cluster's first member)."""
    return getattr(srv, "probe_endpoint", srv.endpoint)


def _clustercheck_binary() -> str:
    from tests.support.binaries import clustercheck_binary

    return clustercheck_binary()


def du_kb(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for fn in files:
            try:
                total += os.lstat(os.path.join(dirpath, fn)).st_blocks * 512
            except OSError:
                pass
    return total // 1024


# ---------------------------------------------------------------------------
# Machine facts
# ---------------------------------------------------------------------------


def _first_line_of(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def _go_module_version(path: Path) -> str:
    """`go version -m`: the main module and version a Go binary was built from."""
    go = shutil.which("go")
    if go:
        try:
            out = subprocess.run([go, "version", "-m", str(path)], capture_output=True, text=True, timeout=20).stdout
            mod = re.search(r"^\s*mod\s+(\S+)\s+(\S+)", out, re.M)
            gov = re.search(r":\s*(go[\d.]+)", out)
            deps = dict(re.findall(r"^\s*dep\s+(go\.etcd\.io/etcd/\S+|github\.com/k3s-io/kine)\s+(\S+)", out, re.M))
            bits = [f"{mod.group(1)} {mod.group(2)}" if mod else path.name]
            for k in ("go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/etcdctl/v3", "github.com/k3s-io/kine"):
                if k in deps:
                    bits.append(f"{k} {deps[k]}")
            if gov:
                bits.append(gov.group(1))
            return ", ".join(bits)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return path.name


def _brain_checkpoint_thresholds() -> dict:
    """brain's defaults: a checkpoint starts when any one is reached."""
    from brain.engine.config import EngineConfig

    c = EngineConfig(data_dir="")
    return {"seconds": c.checkpoint_interval_seconds, "journal_bytes": c.checkpoint_journal_bytes,
            "memtable_records": c.checkpoint_memtable_records}


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine shows here."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_facts(tmp_root: Path) -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    fs = _first_line_of(["stat", "-f", "-c", "%T", str(tmp_root)])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1) if mem_kb else None,
        "python": platform.python_version(),
        "data_dir_fs": fs,
        "load_average_start": _load_average(),
    }


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

GROUPS = ["put", "range", "txn-put", "list", "watch", "lease", "keepalive", "k8s-mix", "check-perf", "restart",
          "mtls-put", "mtls-range", "mtls-txn-put", "mtls-watch", "mtls-keepalive",
          "cluster-load", "cluster-failover"]
# --groups also takes these names for several groups at once.
GROUP_SETS = {
    "plain": [g for g in GROUPS if not g.startswith(("mtls-", "cluster-"))],
    "mtls": [g for g in GROUPS if g.startswith("mtls-")],
    "cluster": [g for g in GROUPS if g.startswith("cluster-")],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="every workload briefly, one round (CI)")
    names = [f.name for f in all_flavors()]
    ap.add_argument("--servers", default=",".join(names),
                    help=f"comma-separated subset of {','.join(names)} (default: all; the -fast etcd "
                         f"configurations run in the mutual TLS groups only)")
    ap.add_argument("--groups", help="comma-separated subset of " + ",".join(GROUPS) + ", or of the sets "
                    + ", ".join(f"{k} ({' '.join(v)})" for k, v in GROUP_SETS.items()) + " (default: all)")
    ap.add_argument("--rounds", type=int, help="alternating rounds per workload (full: 3, smoke: 1)")
    ap.add_argument("--duration", type=float, help="seconds per timed phase (full: 4, smoke: 1)")
    ap.add_argument("--restart-samples", type=int,
                    help=f"SIGTERM and kill -9 starts timed per server in the restart group "
                         f"(default {FULL.restart_samples})")
    ap.add_argument("--out", type=Path, help="results directory (default benchmarks/results; smoke: a temp dir)")
    ap.add_argument("--tmp-root", help="parent of the data dirs (default: the system temp dir; use a disk, "
                                       "not tmpfs, or fsync costs nothing)")
    ap.add_argument("--keep", action="store_true", help="keep data dirs and tool logs")
    ap.add_argument("--readme", action=argparse.BooleanOptionalAction, default=None,
                    help="write the summary table into README.md (default: on for full runs to benchmarks/results)")
    a = ap.parse_args(argv)

    settings = SMOKE if a.smoke else FULL
    if a.rounds:
        settings = dataclasses.replace(settings, rounds=a.rounds)
    if a.duration:
        settings = dataclasses.replace(settings, duration=a.duration)
    if a.restart_samples:
        settings = dataclasses.replace(settings, restart_samples=a.restart_samples)
    wanted = [x.strip() for x in a.servers.split(",") if x.strip()]
    known = {f.name: f for f in all_flavors()}
    bad = [w for w in wanted if w not in known]
    groups = []
    for g in (x.strip() for x in (a.groups or ",".join(GROUPS)).split(",")):
        for one in GROUP_SETS.get(g, [g] if g else []):
            if one not in groups:
                groups.append(one)
    groups = [g for g in GROUPS if g in groups] + [g for g in groups if g not in GROUPS]
    bad += [g for g in groups if g not in GROUPS]
    if bad:
        ap.error(f"unknown server or group: {', '.join(bad)}")
    if a.groups is None and not settings.check_perf:
        groups.remove("check-perf")  # the smoke leaves it out unless asked for by name
    tmp_root = make_root(a.tmp_root)
    if a.keep:
        os.environ["KEEP_TEST_DIRS"] = "1"  # the cluster helpers keep their directories too
    default_out = REPO_ROOT / "benchmarks" / "results"
    out = a.out or (default_out if not a.smoke else tmp_root / "results")
    readme = a.readme if a.readme is not None else (not a.smoke and out.resolve() == default_out.resolve())
    flavors = [known[w] for w in known if w in wanted]
    bench = Bench(settings, flavors, groups, out, tmp_root, a.keep, readme)
    if not settings.check_perf:
        bench.notes.append("`etcdctl check perf` is not part of the smoke run (it always takes 60 s per server).")
    try:
        return bench.run()
    except KeyboardInterrupt:
        bench.say("interrupted; writing what there is")
        bench.save(final=True)
        report.write_all(bench.json_path, bench.md_path, readme=False)
        return 130
    finally:
        if not a.keep:
            shutil.rmtree(tmp_root / "templates", ignore_errors=True)
            for p in tmp_root.iterdir() if tmp_root.exists() else []:
                if p.name != "results":
                    shutil.rmtree(p, ignore_errors=True)
            if not (tmp_root / "results").exists():
                shutil.rmtree(tmp_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
