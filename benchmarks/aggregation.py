"""A benchmark run's records as cells: per (workload, server) the median of the
successful runs and what it rests on, and brain's ratios to a peer between
cells of one run (the rules: benchmarks/report.py's docstring)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.workloads import ONCE_GROUPS, UNSUPPORTED, WORKLOADS, group_rounds, mode_of


SERVERS = ["brain", "etcd-3.6", "etcd-3.6-fast", "etcd-3.7", "etcd-3.7-fast", "etcd-3.4", "kine"]


PEERS = ["etcd-3.6", "etcd-3.7", "etcd-3.4", "kine"]


# etcd's fast gRPC configuration of a peer (mutual TLS only): a ratio there uses the better of the two.
FAST_CONFIG = {"etcd-3.6": "etcd-3.6-fast", "etcd-3.7": "etcd-3.7-fast"}


# A restart target is judged on the worst of at least this many starts.
MIN_RESTART_SAMPLES = 3


def planned_runs(workload: str, settings: dict | None) -> int:
    """How many runs per server the harness makes of ``workload``."""
    w = WORKLOADS.get(workload)
    base = (w.source or workload) if w else workload
    group = w.group if w else workload
    if group in ONCE_GROUPS:
        return group_rounds(group, 1, (settings or {}).get("scale_rounds") or 1)
    # A merged run's workloads keep the rounds that run planned.
    merged = ((settings or {}).get("rounds_of_merged") or {}).get(base)
    return int(merged or (settings or {}).get("rounds") or 1)


def numeric(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _raw(run: dict, workload: str):
    """The workload's metric as the run recorded it (a number, a list, or None), failed runs too."""
    v = run.get("result", {})
    for part in WORKLOADS[workload].metric.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def metric_of(run: dict, workload: str):
    w = WORKLOADS.get(workload)
    if w is None or not run.get("ok"):
        return None
    v = _raw(run, workload)
    if isinstance(v, list):  # a pooled row: the run's largest sample
        v = max((x for x in v if numeric(x) is not None), default=None)
    v = numeric(v)
    return v * w.scale if v is not None else None


def nearest_rank(samples: list, q: float):
    """The q-quantile by nearest rank: the smallest sample with at least q of them at or below it
    (with fewer than 100 samples, p99 is the largest)."""
    xs = sorted(samples)
    if not xs:
        return None
    import math

    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def aggregate(data: dict) -> dict:
    """{workload: {server: {...medians, n (successful runs), planned, errors}}}"""
    out: dict = {}
    derived = {}
    for name, meta in WORKLOADS.items():
        if meta.source:
            derived.setdefault(meta.source, []).append(name)
    for run in data["runs"]:
        for w in [run["workload"], *derived.get(run["workload"], [])]:
            if w not in WORKLOADS:
                continue
            cell = out.setdefault(w, {}).setdefault(run["server"], {"runs": [], "failures": []})
            (cell["runs"] if run.get("ok") else cell["failures"]).append(run)
    for w, by_server in out.items():
        meta = WORKLOADS[w]
        for s, cell in by_server.items():
            runs = cell["runs"]
            res = [r.get("result", {}) for r in runs]
            # The run(s) the cell comes from: a merged report's runs carry their file.
            cell["sources"] = sorted({r.get("source") or "" for r in runs + cell["failures"]})
            cell["n"] = len(runs)
            cell["planned"] = planned_runs(w, data["meta"].get("settings"))
            cell["value"] = _median([metric_of(r, w) for r in runs])
            cell["values"] = [metric_of(r, w) for r in runs]
            cell["p50"] = _median([numeric((x.get("latency_ms") or {}).get("p50")) for x in res])
            cell["p99"] = _median([numeric((x.get("latency_ms") or {}).get("p99")) for x in res])
            if meta.agg == "p99":
                samples = [x * meta.scale for r in runs for x in (_raw(r, w) or []) if numeric(x) is not None]
                cell["samples"] = samples
                cell["value"] = nearest_rank(samples, 0.99)
                cell["p50"], cell["p99"] = nearest_rank(samples, 0.5), cell["value"]
                cell["max"] = max(samples) if samples else None
            elif meta.samples:
                samples = []
                for r in runs:
                    xs = (r.get("result") or {}).get(meta.samples)
                    one = metric_of(r, w)
                    samples += [x for x in xs if numeric(x) is not None] if isinstance(xs, list) and xs else (
                        [one] if one is not None else [])
                cell["samples"] = cell["values"] = samples
                cell["value"] = _median(samples)
                cell["worst"] = (max(samples) if meta.higher_better is False else min(samples)) if samples else None
            elif meta.agg == "sum":
                every = [numeric(_raw(r, w)) for r in runs + cell["failures"]]
                every = [x * meta.scale if meta.scale != 1 else x for x in every if x is not None]
                cell["value"] = sum(every) if every else None
                cell["values"] = every
                cell["reported"] = len(every)
            cell["cpu_us_per_op"] = _median([r.get("cpu_us_per_op") for r in runs])
            cell["op_errors"] = sum(int(x.get("errors") or 0) for x in res)
            cell["error"] = cell["failures"][0]["error"] if cell["failures"] else None
            extra = {}
            for key in ("expire_seconds", "on_schedule", "ready_after_kill9_s", "rss_after_load_kb",
                        "rss_after_restart_kb", "rss_after_restart_read_kb", "stop_seconds", "keys_loaded",
                        "load_keys_per_s", "du_kb", "cpu_to_ready_s", "cpu_to_ready_kill9_s", "tail_writes",
                        "tail_seconds", "journal_tail_bytes",
                        "checkpoints_during_tail", "seconds_from_restart_to_kill9", "count_after_kill9",
                        "revision_after_kill9", "events_delivered", "writes_per_s", "slowest_s", "stddev_s",
                        "longest_gap_s", "grant_seconds", "keepalives_during_grant", "expired_answers",
                        "acked", "unknown", "acked_per_s", "longest_pause_s", "client_cpu_s",
                        "committer_us_per_op", "client_cpu_share", "first_fail_nodes"):
                v = _median([numeric(x.get(key)) for x in res])
                if v is not None:
                    extra[key] = v
            for key in ("lease_latency_ms", "pod_latency_ms"):
                v = _median([numeric((x.get(key) or {}).get("p99")) for x in res])
                if v is not None:
                    extra[key + "_p99"] = v
            for key in ("cpu_to_ready_s_samples", "cpu_to_ready_kill9_s_samples", "ready_after_s_samples",
                        "ready_after_kill9_s_samples"):
                xs = [x for r in res for x in (r.get(key) or []) if numeric(x) is not None]
                if xs:
                    extra[key] = xs
            if any(x.get(UNSUPPORTED) for x in res):
                extra[UNSUPPORTED] = next(str(x.get("detail", "")) for x in res if x.get(UNSUPPORTED))
            if any("pass" in x for x in res):
                extra["pass"] = all(x.get("pass") for x in res)
            if any("bounded" in x for x in res):  # a node-capacity search: False when no step failed
                extra["bounded"] = all(x.get("bounded") for x in res)
            partial = [r.get("partial") for r in runs if r.get("partial")]
            if partial:
                extra["partial"] = partial[0]
            cell["extra"] = extra
    return out


def servers_in(data: dict) -> list[str]:
    ran = {r["server"] for r in data["runs"]}
    return [s for s in SERVERS if s in ran]


@dataclass(frozen=True)
class Ratio:
    """brain's cell over a peer's: ``value`` (None when there is none, ``why`` says why), the
    peer server whose cell was used (under mutual TLS the better of etcd's two configurations)."""

    value: float | None
    peer: str = ""
    why: str = ""            # "runs differ", "partial", "unbounded", or "" (a cell missing)
    default_only: bool = False  # a mutual TLS row whose etcd fast gRPC configuration was not measured
    bound: str = ""          # a node capacity whose search never failed a step: "≥" (brain's), "≤" (the peer's)


def same_run(a: dict, b: dict) -> bool:
    """Two cells (aggregate entries) come from one run: every run of both has the same source."""
    return len(set(a.get("sources") or [""]) | set(b.get("sources") or [""])) == 1


def _lower_better(workload: str, key: str) -> bool:
    return key in ("p99", "p50", "cpu_us_per_op") or not WORKLOADS[workload].higher_better


def compare(agg: dict, workload: str, peer: str, key: str = "value") -> Ratio:
    """brain's ``key`` over the peer's, for one workload.  Only cells of one run are compared;
    under mutual TLS the peer is the better of etcd's default and fast gRPC configurations
    (better at ``key``: the higher throughput, the lower latency or CPU)."""
    cells = agg.get(workload, {})
    bc = cells.get("brain") or {}
    names = [peer]
    if mode_of(workload) == "mtls" and peer in FAST_CONFIG:
        names.append(FAST_CONFIG[peer])
    b = bc.get(key)
    found = [(n, cells[n]) for n in names if n in cells and cells[n].get(key) is not None]
    if b is None or not found:
        return Ratio(None)
    if (bc.get("extra") or {}).get("partial") or any((c.get("extra") or {}).get("partial") for _, c in found):
        return Ratio(None, why="partial")
    if not all(same_run(bc, c) for _, c in found):
        return Ratio(None, why="runs differ")
    pick = min if _lower_better(workload, key) else max
    name, cell = pick(found, key=lambda nc: nc[1][key])
    p = cell[key]
    if p == 0:
        return Ratio(None, name)
    bound = ""
    if key == "value":  # a capacity is a lower bound when its search never saw a step fail
        open_b, open_p = ((c.get("extra") or {}).get("bounded") is False for c in (bc, cell))
        if open_b and open_p:
            return Ratio(None, name, why="unbounded")
        bound = "≥" if open_b else "≤" if open_p else ""
    return Ratio(b / p, name, default_only=len(names) > 1 and len(found) < len(names), bound=bound)


def restart_ratio(agg: dict, workload: str, peer: str) -> Ratio:
    """brain's worst start over the peer's median start (a restart row's samples), cells of one run."""
    cells = agg.get(workload, {})
    b, p = cells.get("brain") or {}, cells.get(peer) or {}
    if b.get("worst") is None or not p.get("value"):
        return Ratio(None)
    if (b.get("extra") or {}).get("partial") or (p.get("extra") or {}).get("partial"):
        return Ratio(None, why="partial")
    if not same_run(b, p):
        return Ratio(None, why="runs differ")
    return Ratio(b["worst"] / p["value"], peer)


def too_few_starts(agg: dict, workload: str, servers) -> str:
    """Which of ``servers`` have fewer than MIN_RESTART_SAMPLES starts in a restart row ("" if none)."""
    few = []
    for s in servers:
        n = len(((agg.get(workload) or {}).get(s) or {}).get("samples") or [])
        if n < MIN_RESTART_SAMPLES:
            few.append(f"{s} {n} sample{'s' if n != 1 else ''}")
    return (", ".join(few) + f", {MIN_RESTART_SAMPLES} needed") if few else ""


def ratio(agg: dict, workload: str, peer: str, key: str = "value"):
    """brain's median over the peer's; None when either is missing, a partial (capped) run, or
    the two cells come from different runs."""
    return compare(agg, workload, peer, key).value


def short_of_runs(agg: dict, workload: str, servers) -> list[str]:
    """Servers whose cell has fewer successful runs than planned, as 'kine 2/3'."""
    out = []
    for s in servers:
        c = agg.get(workload, {}).get(s)
        if c is not None and c.get("value") is not None and c["n"] < c["planned"]:
            out.append(f"{s} {c['n']}/{c['planned']}")
    return out
