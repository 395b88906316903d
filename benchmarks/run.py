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

This module is the command and the run's bookkeeping.  The rest:
workloads.py (the catalogue: every workload once), settings.py (full and
smoke sizes), groups.py (which workloads on which servers, rotation),
tools.py (running and parsing the load tools), servers.py and cluster.py
(the servers, on tests/support/harness.py), probes.py (the harness's own
gRPC calls), machine.py (machine facts), report.py and the modules it
names (the report), targets.py (the targets it judges).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

from benchmarks import cluster as clusters
from benchmarks import render, report
from benchmarks.cluster import all_cluster_flavors
from benchmarks.cluster_groups import CLUSTER_GROUPS, ETCD_TIMEOUTS, brain_serve_defaults, describe, redundant
from benchmarks.groups import GROUP_SETS, GROUPS, Groups, etcdctl_binary, now_s, round_order, servers_for
from benchmarks.machine import (brain_checkpoint_thresholds, first_line, go_module_version, load_average,
                                machine_facts)
from benchmarks.servers import REPO_ROOT, Flavor, all_flavors, make_root, tool_path
from benchmarks.settings import FULL, SMOKE, Settings
from benchmarks.workloads import CLUSTER, ONCE_GROUPS, UNSUPPORTED, group_rounds, measured_in
from tests.support.binaries import clustercheck_binary


class Bench:
    """One run: its settings and servers, the record of every workload run, the JSON rewritten after
    every group, the report at the end; ``runner`` (benchmarks/groups.py) runs each round of a group."""

    def __init__(self, settings: Settings, flavors: list[Flavor], groups: list[str], out_dir: Path,
                 tmp_root: Path, keep: bool, readme: bool):
        self.s = settings
        self.flavors = flavors
        # The clusters of the selected servers that have one (brain, etcd-3.6).
        self.cluster_flavors = [c for c in all_cluster_flavors() if c.name in [f.name for f in flavors]]
        self.groups = groups
        self.out_dir = out_dir
        self.root = tmp_root
        self.keep = keep
        self.readme = readme
        self.t0 = now_s()
        self.runs: list[dict] = []
        self.notes: list[str] = []
        # What `brain serve` runs a replica with when given no flag: the cluster groups follow it.
        self.brain_defaults = brain_serve_defaults()
        self.stamp = _dt.datetime.now().strftime("%Y-%m-%d")
        self.json_path, self.md_path = self._paths()
        self.meta = self._meta()
        self.runner = Groups(self)
        if not self.runner.use_benchmark:
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
            tools[name] = go_module_version(p) if p else None
        etcdctl = etcdctl_binary()
        tools["etcdctl (check perf)"] = first_line([etcdctl, "version"]) if etcdctl else None
        clusters_meta = {}
        if any(g.startswith("cluster") for g in self.groups):
            for c in self.cluster_flavors:
                ok, why = c.available()
                clusters_meta[c.name] = {"available": ok, "reason": why, "version": c.version() if ok else None,
                                         "flags": c.flags_note(), "measured_process": c.process_note,
                                         "size": self.s.cluster_size}
            path, why = clusters.binary_or_reason(clustercheck_binary)
            tools["clustercheck"] = go_module_version(Path(path)) if path else f"missing: {why}"
        return {
            "settings": dataclasses.asdict(self.s),
            "groups": self.groups,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine_facts(self.root),
            "servers": servers,
            "tools": tools,
            "conns_rule": "gRPC connections = max(1, clients // 8)",
            "order_rule": "servers take turns; the order rotates by one place per round and per group",
            "restart_rule": ("restart: SIGTERM, then start until a linearizable Get of one key answers (the same "
                             "probe for every server, constant time whatever the data set; the loaded keys are "
                             "counted after it, untimed); restart-kill9: the same after restart_tail overwrites "
                             "and kill -9 (brain: its journal holds the tail, below the first checkpoint "
                             "threshold; etcd and kine: whatever their WAL holds)"),
            "brain_checkpoint_thresholds": brain_checkpoint_thresholds(),
            "clusters": clusters_meta,
            "brain_serve_defaults": self.brain_defaults,
            "cluster_member_args": {g: dict(CLUSTER_GROUPS[g].args) for g in self.groups if g in CLUSTER_GROUPS},
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
                              "killed with SIGKILL (brain: also the NATS stream leader's nats-server) and "
                              "restarted, while the leader is isolated (its process stopped with SIGSTOP for "
                              f"{self.s.failover_isolate_seconds:g} s, then SIGCONT: cut from its peers, from "
                              "NATS and from its clients, whose connections stay open), and (brain) while each "
                              "nats-server in turn is restarted as planned (the journal stream's leader stepped "
                              "down, lame duck mode, a start); the next fault waits until every member serves; "
                              "a fault's write pause is the longest gap between acknowledged writes that begins "
                              "within 3 s of it (a planned nats-server restart: while it runs); afterwards "
                              "clustercheck verify reads every acknowledged write back at its revision; every "
                              "member of both clusters runs at etcd's election timing (" + " ".join(ETCD_TIMEOUTS)
                              + ", etcd's defaults), so the pauses compare the servers, not their settings; "
                              "cluster-failover-brain-defaults: brain at `brain serve`'s defaults ("
                              + describe(self.brain_defaults) + "), the leader's kills and isolations only; "
                              "a fault row is the p99 and p50 (nearest rank) of every fault of every round"),
            "capacity_rule": ("node-capacity: brainload node-capacity steps (N node Leases renewed every 10 s "
                              f"plus 50 pod creates, 50 pod status updates and 100 leased events a second, "
                              f"kube-apiserver's Txns, open loop, {self.s.capacity_seconds:g} s windows), each on "
                              "a fresh start with the quota at 8 GiB; N ramps x"
                              f"{self.s.capacity_factor:g} from {self.s.capacity_start:,} until a step fails, then "
                              f"is bisected to {self.s.capacity_resolution:.0%}; a step passes when every kind's "
                              "p99 from its scheduled time is <= 1 s, >= 97% of the offered rate is achieved and "
                              "<= 0.1% of its operations fail; server CPU is read over the window and the drain, "
                              "brain's committer as the brain-committer thread's (a cluster's leader's); "
                              "brain-groups: `brain groups` with node Leases and Events in one brain and the pods "
                              "in another, its CPU every process's, its committer the busier group's"),
            "read_lease_rule": ("cluster- groups run brain at `brain serve`'s default read lease ("
                                + ("on" if self.brain_defaults["read_lease"] else "off") + "); the other setting "
                                "runs as labelled rows: cluster-read-barrier (--read-lease=false, every "
                                "linearizable read confirmed by a barrier record the journal's quorum "
                                "acknowledged) or cluster-read-lease (--read-lease=true), the one that is not "
                                "the default"),
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
            self.meta["machine"]["load_average_end"] = load_average()
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
        # A server without the RPC (brainload's "unsupported") did nothing, and did not fail.
        if err is None and not ops and workload not in ("restart", "check-perf") and not result.get(UNSUPPORTED):
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
        self.say(f"  {server:9s} {workload:14s} r{rnd}: {render.one_line(rec)}")
        return rec

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
            why = redundant(g, self.brain_defaults)
            if why and any(c.name == "brain" for c in self.cluster_flavors):
                self.notes.append(why)
                self.say(why)
            rounds = group_rounds(g, s.rounds, s.scale_rounds)
            slow: dict[str, float] = {}
            # Each group's rounds and the machine's load at its start and end: the report says per group
            # how often it ran and warns of a group that started on a machine that was not quiet.
            span = {"group": g, "rounds": rounds, "load_average_start": load_average(),
                    "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}
            self.meta.setdefault("group_runs", []).append(span)
            t_group = now_s()
            for rnd in range(1, rounds + 1):
                for f in round_order(servers_for(g, self.flavors, self.cluster_flavors, self.brain_defaults),
                                     gi, rnd):
                    if f.name in slow:
                        continue
                    self.say(f"[group {gi}/{len(self.groups)}] {g} round {rnd}/{rounds}: {f.name}")
                    t = now_s()
                    try:
                        self.runner.run(g, f, rnd)
                    except Exception as e:  # keep going: record and move on
                        self.say(f"  {f.name} {g}: harness error {e!r}")
                        done = {(r["workload"]) for r in self.runs if r["server"] == f.name and r["round"] == rnd}
                        for w in measured_in(g):
                            if w not in done:
                                self.record(f.name, w, rnd, error=f"harness error: {e!r}",
                                            extra={"traceback": traceback.format_exc()[-2000:]})
                    took = now_s() - t - self.runner.untimed
                    # A cluster's and the scale group's rounds are long by design: always all.
                    if rnd == 1 and rounds > 1 and took > s.slow_group and g not in ONCE_GROUPS \
                            and not g.startswith(CLUSTER):
                        slow[f.name] = took
                        note = (f"{f.name}: {g} ran once (its first round took {took:.0f} s, over the "
                                f"{s.slow_group:.0f} s after which a server's group is not repeated)")
                        self.notes.append(note)
                        self.say("  " + note)
                span["load_average_end"] = load_average()
                span["seconds"] = round(now_s() - t_group, 1)
                self.save()
        self.save(final=True)
        report.write_all(self.json_path, self.md_path, readme=self.readme)
        self.say(f"done in {self.elapsed()}: {self.md_path}")
        return 0


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
    ap.add_argument("--scale-keys", type=int,
                    help=f"keys of the scale group's data set (default {FULL.scale_keys:,}; the 10M run: 10000000)")
    ap.add_argument("--scale-mix", choices=("kubernetes", "small"),
                    help="value sizes of the scale data set: kubernetes (about 1 KiB a value; the default) or "
                         "small (about 540 B; the 10M run's, to fit 24 GiB)")
    ap.add_argument("--scale-rounds", type=int,
                    help=f"rounds of the scale group, servers alternating (default {FULL.scale_rounds}); the "
                         f"restart rows pool every round's starts")
    ap.add_argument("--scale-restart-samples", type=int,
                    help=f"SIGTERM and kill -9 starts per server in each scale round (default "
                         f"{FULL.scale_restart_samples})")
    ap.add_argument("--scale-watch-limit", type=float,
                    help=f"seconds the scale group's watch may take on any server before it is recorded as not "
                         f"finished (default {FULL.scale_watch_limit:g})")
    ap.add_argument("--profile-scale-reads", action="store_true",
                    help="run each read of the scale group once more under profilers: brainload's Go CPU profile "
                         "(decoding vs the rest) and py-spy on brain's server (by function); in the JSON and report")
    ap.add_argument("--capacity-start", type=int,
                    help=f"the node-capacity groups' first step, in nodes (default {FULL.capacity_start:,}; the "
                         f"ramp doubles it until a step fails, then bisects)")
    ap.add_argument("--capacity-seconds", type=float,
                    help=f"the node-capacity groups' step window in seconds (default {FULL.capacity_seconds:g})")
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
    if a.scale_keys:
        settings = dataclasses.replace(settings, scale_keys=a.scale_keys)
    if a.scale_mix:
        settings = dataclasses.replace(settings, scale_mix=a.scale_mix)
    for flag in ("scale_rounds", "scale_restart_samples", "scale_watch_limit"):
        if getattr(a, flag):
            settings = dataclasses.replace(settings, **{flag: getattr(a, flag)})
    if a.capacity_start:
        settings = dataclasses.replace(settings, capacity_start=a.capacity_start)
    if a.capacity_seconds:
        settings = dataclasses.replace(settings, capacity_seconds=a.capacity_seconds)
    if a.profile_scale_reads:
        settings = dataclasses.replace(settings, scale_profile=True)
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
    # The README's table is the latest full run's: a run of some groups or servers leaves it alone.
    whole = a.groups is None and set(wanted) == set(known)
    readme = a.readme if a.readme is not None else (not a.smoke and whole and out.resolve() == default_out.resolve())
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
