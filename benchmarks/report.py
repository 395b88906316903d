"""Turn a benchmark JSON file into the markdown report, PNG plots and the README table.

    python -m benchmarks.report benchmarks/results/2026-01-01.json [--readme]

Medians are over the successful runs of each (workload, server); ratios are
brain's median over the peer's (for throughput higher is better, for times,
latencies, CPU and memory lower is better: the table says which).  A cell
backed by fewer successful runs than the workload was run for says so
("(2/3)"), and a target is only called met when brain and the peer both have
every run.  Under mutual TLS a ratio against etcd 3.6 or 3.7 divides by the
better of its two configurations (default and -fast, see
benchmarks/servers.py).  Restart rows are samples of starts: the cell is
their median and worst, the target is judged on the worst, and on no fewer
than MIN_RESTART_SAMPLES samples.

    python -m benchmarks.report FULL.json --merge RERUN.json [--merge RERUN2.json] --out NEW.json

writes NEW.json (and its report) with FULL's runs, except for the (server,
workload) pairs a re-run measured, which come from it.  Every run record
keeps the file it came from ("source"); a ratio is shown only when both of
its cells come from one run ("n/a (runs differ)" otherwise), a target
resting on cells of different runs is n/a, and the header lists every run
with its machine and load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.settings import FULL
from benchmarks.targets import ISSUES, TARGETS, Target, met
from benchmarks.workloads import (CLUSTER, LEASE_ROWS, MTLS, ONCE_GROUPS, SCALE, SCALE_MIXES, UNSUPPORTED, WORKLOADS,
                                  mode_of)

SERVERS = ["brain", "etcd-3.6", "etcd-3.6-fast", "etcd-3.7", "etcd-3.7-fast", "etcd-3.4", "kine"]
PEERS = ["etcd-3.6", "etcd-3.7", "etcd-3.4", "kine"]
# etcd's fast gRPC configuration of a peer (mutual TLS only): a ratio there uses the better of the two.
FAST_CONFIG = {"etcd-3.6": "etcd-3.6-fast", "etcd-3.7": "etcd-3.7-fast"}
# A restart target is judged on the worst of at least this many starts.
MIN_RESTART_SAMPLES = 3
README_BEGIN = "<!-- bench:begin -->"
README_END = "<!-- bench:end -->"


def planned_runs(workload: str, settings: dict | None) -> int:
    """How many runs per server the harness makes of ``workload``."""
    w = WORKLOADS.get(workload)
    base = (w.source or workload) if w else workload
    if (w.group if w else workload) in ONCE_GROUPS:
        return 1
    # A merged run's workloads keep the rounds that run planned.
    merged = ((settings or {}).get("rounds_of_merged") or {}).get(base)
    return int(merged or (settings or {}).get("rounds") or 1)


def title(workload: str, settings: dict | None = None, brain_defaults: dict | None = None) -> str:
    """A workload's title with the run's settings and the brain serve defaults it ran at filled in."""
    vals = dataclasses.asdict(FULL)
    vals.update(settings or {})
    vals["scale_mix_text"] = SCALE_MIXES.get(vals.get("scale_mix", "kubernetes"), vals.get("scale_mix"))
    d = brain_defaults or {}
    vals["brain_read_lease"] = {True: "on", False: "off"}.get(d.get("read_lease"), "not recorded")
    vals["brain_election_timeout_ms"] = d.get("election_timeout_ms", "?")
    vals["brain_heartbeat_interval_ms"] = d.get("heartbeat_interval_ms", "?")
    try:
        return WORKLOADS[workload].title.format(**vals)
    except (KeyError, ValueError):
        return WORKLOADS[workload].title


def _num(x):
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
        v = max((x for x in v if _num(x) is not None), default=None)
    v = _num(v)
    return v * w.scale if v is not None else None


def nearest_rank(samples: list, q: float):
    """The q-quantile by nearest rank: the smallest sample with at least q of them at or below it
    (with fewer than 100 samples, p99 is the largest)."""
    xs = sorted(samples)
    if not xs:
        return None
    import math

    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) or (isinstance(x, float) and abs(x) >= 1000):
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits - 1}f}" if abs(x) >= 1 else f"{x:.{digits}f}"


def one_line(rec: dict) -> str:
    """The progress line for one run."""
    if not rec.get("ok"):
        return "ERROR " + str(rec.get("error", ""))[:300].replace("\n", " ")
    r = rec.get("result", {})
    if r.get(UNSUPPORTED):
        return UNSUPPORTED + ": " + str(r.get("detail", ""))[:300]
    w = WORKLOADS.get(rec["workload"])
    bits = []
    if w:
        bits.append(f"{_fmt(_num(r.get(w.metric)))} {w.unit}")
    lat = r.get("latency_ms") or {}
    if lat.get("p99") is not None:
        bits.append(f"p50 {_fmt(lat.get('p50'))} ms p99 {_fmt(lat.get('p99'))} ms")
    if rec.get("cpu_us_per_op") is not None:
        bits.append(f"cpu {_fmt(rec['cpu_us_per_op'])} µs/op")
    if r.get("errors"):
        bits.append(f"{r['errors']} errors")
    for k in ("expire_seconds", "on_schedule", "pass", "ready_after_kill9_s", "rss_after_load_kb",
              "keys_loaded", "longest_gap_s", "expired"):
        if k in r:
            bits.append(f"{k} {_fmt(r[k]) if not isinstance(r[k], bool) else r[k]}")
    if r.get("kills"):
        bits.append(_kills_line(r))
    if rec.get("partial"):
        bits.append(f"PARTIAL: {rec['partial']}")
    return ", ".join(bits)


# ---------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------


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
            cell["p50"] = _median([_num((x.get("latency_ms") or {}).get("p50")) for x in res])
            cell["p99"] = _median([_num((x.get("latency_ms") or {}).get("p99")) for x in res])
            if meta.agg == "p99":
                samples = [x * meta.scale for r in runs for x in (_raw(r, w) or []) if _num(x) is not None]
                cell["samples"] = samples
                cell["value"] = nearest_rank(samples, 0.99)
                cell["p50"], cell["p99"] = nearest_rank(samples, 0.5), cell["value"]
                cell["max"] = max(samples) if samples else None
            elif meta.samples:
                samples = []
                for r in runs:
                    xs = (r.get("result") or {}).get(meta.samples)
                    one = metric_of(r, w)
                    samples += [x for x in xs if _num(x) is not None] if isinstance(xs, list) and xs else (
                        [one] if one is not None else [])
                cell["samples"] = cell["values"] = samples
                cell["value"] = _median(samples)
                cell["worst"] = (max(samples) if meta.higher_better is False else min(samples)) if samples else None
            elif meta.agg == "sum":
                every = [_num(_raw(r, w)) for r in runs + cell["failures"]]
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
                        "acked", "unknown", "acked_per_s", "longest_pause_s", "client_cpu_s"):
                v = _median([_num(x.get(key)) for x in res])
                if v is not None:
                    extra[key] = v
            for key in ("lease_latency_ms", "pod_latency_ms"):
                v = _median([_num((x.get(key) or {}).get("p99")) for x in res])
                if v is not None:
                    extra[key + "_p99"] = v
            for key in ("cpu_to_ready_s_samples", "cpu_to_ready_kill9_s_samples", "ready_after_s_samples",
                        "ready_after_kill9_s_samples"):
                xs = [x for r in res for x in (r.get(key) or []) if _num(x) is not None]
                if xs:
                    extra[key] = xs
            if any(x.get(UNSUPPORTED) for x in res):
                extra[UNSUPPORTED] = next(str(x.get("detail", "")) for x in res if x.get(UNSUPPORTED))
            if any("pass" in x for x in res):
                extra["pass"] = all(x.get("pass") for x in res)
            partial = [r.get("partial") for r in runs if r.get("partial")]
            if partial:
                extra["partial"] = partial[0]
            cell["extra"] = extra
    return out


@dataclass(frozen=True)
class Ratio:
    """brain's cell over a peer's: ``value`` (None when there is none, ``why`` says why), the
    peer server whose cell was used (under mutual TLS the better of etcd's two configurations)."""

    value: float | None
    peer: str = ""
    why: str = ""            # "runs differ", "partial", or "" (a cell missing)
    default_only: bool = False  # a mutual TLS row whose etcd fast gRPC configuration was not measured


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
    return Ratio(b / p, name, default_only=len(names) > 1 and len(found) < len(names))


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


def _ratio_cell(r: Ratio) -> str:
    if r.value is not None:
        return f"{r.value:.2f}" + (" (default only)" if r.default_only else "")
    return "n/a (runs differ)" if r.why == "runs differ" else "–"


def _extra(agg, w, s, k):
    return ((agg.get(w, {}).get(s) or {}).get("extra") or {}).get(k)


def short_of_runs(agg: dict, workload: str, servers) -> list[str]:
    """Servers whose cell has fewer successful runs than planned, as 'kine 2/3'."""
    out = []
    for s in servers:
        c = agg.get(workload, {}).get(s)
        if c is not None and c.get("value") is not None and c["n"] < c["planned"]:
            out.append(f"{s} {c['n']}/{c['planned']}")
    return out


def _from(cell: dict) -> str:
    """The run(s) a cell came from, as a note names them."""
    return ", ".join(x or "the base run" for x in cell.get("sources") or [""])


def _cells_note(agg: dict, workload: str, servers) -> str:
    """Which run each cell came from, for a target that compares cells of different runs."""
    cells = agg.get(workload, {})
    return "runs differ: " + "; ".join(f"{s} from {_from(cells[s])}" for s in servers if s in cells)


def targets(agg: dict, settings: dict | None = None) -> list[dict]:
    """The targets of benchmarks/targets.py, each: target, value, goal, status (pass / miss / n/a), a
    note and the issue that asked for it.  An issue's targets are judged only when the run measured a
    workload of its mode.

    A target whose workload failed on brain is a miss (the note carries the error); one whose
    peer did not run, whose restart load was cut short, whose cells come from different runs, or
    (mutual TLS) whose etcd fast gRPC configuration was not measured and the default alone would
    pass, is n/a."""
    t: list[dict] = []
    keys = f"{(settings or {}).get('restart_keys', 1_000_000):,} keys"
    scale_keys = (settings or {}).get("scale_keys", FULL.scale_keys)
    issue = ""

    def add(name, value, ok, goal, workload=None, note="", peer=None, also=(), na="", unjudged=""):
        """One row of the current ``issue``.  ``also``: further (workload, server) cells the value
        rests on, whose runs count too; ``na``: a reason the value cannot be called met (a miss
        stays a miss); ``unjudged``: a reason it can be called neither met nor missed."""
        b = (agg.get(workload, {}).get("brain") or {}) if workload else {}
        short = short_of_runs(agg, workload, ["brain"] + ([peer] if peer else [])) if workload else []
        for w2, s2 in also:
            short += [f"{w2} {x}" for x in short_of_runs(agg, w2, [s2])]
        if value is None and b.get("error") and b.get("value") is None:
            status, note = "miss", "brain failed: " + _oneline(b["error"], 160)
        elif value is None or note.startswith("partial"):
            status = "n/a"
        elif unjudged:
            status, note = "n/a", "; ".join(x for x in (note, unjudged) if x)
        elif ok and (short or na):
            # Not called met on fewer runs than planned, nor against a configuration not measured.
            status = "n/a"
            note = "; ".join(x for x in (note, na, ("only " + ", ".join(short) + " runs succeeded") if short
                                         else "") if x)
        else:
            status = "pass" if ok else "miss"
            if short:
                note = (note + "; " if note else "") + "only " + ", ".join(short) + " runs succeeded"
        t.append({"target": name, "value": value, "goal": goal, "status": status, "note": note, "issue": issue,
                  "ran": workload in agg})

    def add_ratio(name, w, peer, goal, key="value"):
        """A ratio target: brain over ``peer`` (under mutual TLS, the better etcd configuration)."""
        r = compare(agg, w, peer, key)
        note, na = "", ""
        if r.why == "runs differ":
            note = _cells_note(agg, w, ["brain", peer, FAST_CONFIG.get(peer, "")])
        elif r.why == "partial":
            note = "partial: a capped run"
        elif r.default_only:
            na = f"{FAST_CONFIG[peer]} (fast gRPC) not measured: against the default configuration alone"
        elif r.peer and r.peer != peer:
            note = f"against {r.peer}, the better configuration"
        add(name, r.value, met(goal, r.value), goal, w, note, peer=r.peer or peer, na=na)

    b = agg.get("restart", {}).get("brain") or {}
    partial = (b.get("extra") or {}).get("partial")
    pnote = f"partial load: {_oneline(partial, 160)}" if partial else ""

    def judge(spec: Target) -> None:
        w, peer = spec.workload, spec.peer
        name = spec.name.format(workload=w, peer=peer, versus=spec.versus, keys=keys,
                                scale_keys=f"{scale_keys:,} keys")
        if spec.at_keys > scale_keys:
            r = restart_ratio(agg, w, peer) if spec.kind == "restart-ratio" else compare(agg, w, peer, spec.key)
            add(name, None, False, spec.goal, w, f"asked at {spec.at_keys:,} keys (this run: brain/{peer} "
                f"{_fmt(r.value)})", peer=peer)
        elif spec.kind == "ratio":
            add_ratio(name, w, peer, spec.goal, spec.key)
        elif spec.kind == "restart":
            c = agg.get(w, {}).get("brain") or {}
            v, n = c.get("worst"), len(c.get("samples") or [])
            note = pnote or (f"worst of {n}, median {_fmt(c.get('value'))}" if v is not None else "")
            add(name, v, met(spec.goal, v), spec.goal, WORKLOADS[w].source or w, note,
                na=too_few_starts(agg, w, ["brain"]))
        elif spec.kind == "restart-ratio":
            r = restart_ratio(agg, w, peer)
            b, p = agg.get(w, {}).get("brain") or {}, agg.get(w, {}).get(peer) or {}
            note = ""
            if r.why == "runs differ":
                note = _cells_note(agg, w, ["brain", peer])
            elif r.why == "partial":
                note = "partial: a capped run"
            elif r.value is not None:
                note = (f"brain's worst {_fmt(b.get('worst'))} s of {len(b.get('samples') or [])}, {peer}'s median "
                        f"{_fmt(p.get('value'))} s of {len(p.get('samples') or [])}")
            # More starts can move the peer's median either way: on too few, not even a miss is known.
            add(name, r.value, met(spec.goal, r.value), spec.goal, w, note, peer=peer,
                unjudged=too_few_starts(agg, w, ["brain", peer]))
        elif spec.kind == "rss":
            r = compare(agg, w, peer)
            note = pnote or ("partial load on " + peer if _extra(agg, WORKLOADS[w].source, peer, "partial") else "")
            if r.why == "runs differ":
                note = _cells_note(agg, w, ["brain", peer])
            add(name, r.value, met(spec.goal, r.value), spec.goal, w, note, peer=peer)
        elif spec.kind == "check-perf":
            p = _extra(agg, w, "brain", "pass")
            add(name, None if p is None else (1.0 if p else 0.0), bool(p), spec.goal, w,
                "" if p is None else ("PASS" if p else "FAIL"))
        elif spec.kind == "cluster-vs-single":
            bcell = agg.get(w, {}).get("brain") or {}
            scell = agg.get(spec.versus, {}).get("brain") or {}
            bc, bs = bcell.get("value"), scell.get("value")
            r = bc / bs if bc is not None and bs else None
            note = ""
            if r is not None and not same_run(bcell, scell):  # measured in different runs: not comparable
                r, note = None, f"runs differ: the cluster from {_from(bcell)}, the single brain from {_from(scell)}"
            add(name, r, met(spec.goal, r), spec.goal, w, note, also=[(spec.versus, "brain")])
        elif spec.kind == "pause":
            c = agg.get(w, {}).get("brain") or {}
            v = c.get("value")
            n = len(c.get("samples") or [])
            note = f"{n} fault{'s' if n != 1 else ''}, p50 {_fmt(c.get('p50'))}" if v is not None else ""
            same = spec.versus or w  # the row where brain and the peer ran at the same settings
            e = (agg.get(same, {}).get(peer) or {}).get("value") if peer else None
            if spec.versus:
                vb = (agg.get(same, {}).get("brain") or {})
                if vb.get("value") is not None or e is not None:
                    note += (f"; both at etcd's election timeout ({same}): brain {_fmt(vb.get('value'))} s, "
                             f"{peer.replace('-', ' ')} {_fmt(e)} s")
            elif e is not None:
                note += f"; {peer.replace('-', ' ')}: {_fmt(e)} s"
            add(name, v, met(spec.goal, v), spec.goal, w, note.lstrip("; "))
        elif spec.kind == "lost":
            v = (agg.get(w, {}).get("brain") or {}).get("value")
            add(name, v, met(spec.goal, v), spec.goal, w)
        else:
            raise ValueError(f"{spec.name}: no target of kind {spec.kind!r}")

    for one in ISSUES:
        if one.mode != "plain" and not any(mode_of(w) == one.mode for w in agg):
            continue
        issue = one.number
        for spec in TARGETS:
            if spec.issue == issue:
                judge(spec)
    return t


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def _servers_in(data: dict) -> list[str]:
    ran = {r["server"] for r in data["runs"]}
    return [s for s in SERVERS if s in ran]


MODE_TITLES = {"plain": "plaintext, one server", "mtls": "mutual TLS, one server",
               "cluster": "clusters: 3 brains on 3 nats-servers (brain) vs 3 etcd 3.6 members (etcd-3.6)",
               "scale": "scale: one Kubernetes-shaped data set per server (brainload scale-load), one server"}


def run_labels(data: dict) -> dict[str, str]:
    """A letter per run of a merged report ({file: "A", ...}, base run first); {} for a single run."""
    files = []
    for x in data["meta"].get("sources") or []:
        if x["file"] not in files:
            files.append(x["file"])
    return {f: chr(ord("A") + i) for i, f in enumerate(files)} if len(files) > 1 else {}


def _run_mark(cell: dict, labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return " [" + ",".join(labels.get(x, "?") for x in cell.get("sources") or [""]) + "]"


def _spread(xs: list, noun: str) -> str:
    """How many samples a figure rests on and their range: "100-300, 3 runs", "1 run"."""
    xs = [x for x in xs if x is not None]
    if len(xs) == 1:
        return f"1 {noun}"
    if not xs:
        return f"0 {noun}s"
    return f"{_fmt(min(xs))}-{_fmt(max(xs))}, {len(xs)} {noun}s"


def _value_cell(c: dict | None, labels: dict[str, str]) -> str:
    """A summary cell: the figure and what it rests on: the median with the runs' range ("200 (100-300,
    3 runs)", "(2/3 runs)" when short of runs); a restart row's median start with the starts' range
    (its largest is the worst); a fault row's p99 with its p50 and the faults' range, all by nearest
    rank; and (merged reports) the letter of the run it comes from."""
    if c is None:
        return "–"
    if c["value"] is None and UNSUPPORTED in (c.get("extra") or {}):
        return UNSUPPORTED + _run_mark(c, labels)
    if c["value"] is None:
        return f"error (0/{c['planned']})" + _run_mark(c, labels) if c.get("error") else "–"
    cell = _fmt(c["value"])
    short = f"{c['n']}/{c['planned']} runs" if c["n"] < c["planned"] else ""
    if "worst" in c:  # a restart row: its samples are starts
        bits = [_spread(c.get("samples") or [], "sample"), short]
    elif c.get("max") is not None:  # a fault row: its value is the p99 of the samples
        bits = [f"p50 {_fmt(c['p50'])}", _spread(c.get("samples") or [], "sample"), short]
    elif "reported" in c:  # a sum over every run
        bits = [f"sum of {c['reported']} run{'s' if c['reported'] != 1 else ''}", short]
    else:
        bits = [short or _spread(c.get("values") or [], "run")]
        if short and len([x for x in c.get("values") or [] if x is not None]) > 1:
            bits.insert(0, _spread(c["values"], "run").rsplit(", ", 1)[0])
    cell += " (" + ", ".join(b for b in bits if b) + ")"
    if (c.get("extra") or {}).get("partial"):
        cell += " (partial)"
    return cell + _run_mark(c, labels)


def summary_table(data: dict, agg: dict, mode: str = "plain") -> list[str]:
    """One row per workload of ``mode``: the planned runs per server, each server's
    median (with "(n/N)" when only n of the N runs succeeded) and brain's ratios,
    which compare cells of one run only.  Only the servers that ran a workload of
    the mode get a column; under mutual TLS the ratio against etcd 3.6 / 3.7 uses
    the better of its two configurations."""
    ran = {s for w in agg if mode_of(w) == mode for s in agg[w]}
    servers = [s for s in _servers_in(data) if s in ran]
    peers = [p for p in PEERS if p in servers]
    labels = run_labels(data)
    best = " (better config)" if mode == "mtls" else ""
    head = ["workload", "unit", "runs"] + servers + [f"brain/{p}" + (best if p in FAST_CONFIG else "")
                                                     for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    settings = data["meta"].get("settings")
    for w, meta in WORKLOADS.items():
        if w not in agg or mode_of(w) != mode:
            continue
        row = [w, meta.unit + ("" if meta.higher_better else " (lower is better)"), str(planned_runs(w, settings))]
        row += [_value_cell(agg[w].get(s), labels) for s in servers]
        row += [_ratio_cell(compare(agg, w, p)) for p in peers]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def detail_tables(data: dict, agg: dict) -> list[str]:
    servers = _servers_in(data)
    labels = run_labels(data)
    out: list[str] = []
    for w, meta in WORKLOADS.items():
        if w not in agg or meta.source:
            continue
        out += [f"### {w}: {title(w, data['meta'].get('settings'), data['meta'].get('brain_serve_defaults'))}", ""]
        head = ["server", f"{meta.unit} median (n/planned)", "runs", "p50 ms", "p99 ms", "CPU µs/op", "op errors"]
        head += [f"brain/{p}" for p in PEERS if p in servers]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for s in servers:
            c = agg[w].get(s)
            if c is None:
                continue
            vals = ", ".join(_fmt(v) for v in c["values"] if v is not None)
            row = [s, f"{_fmt(c['value'])} ({c['n']}/{c['planned']})", vals or "–", _fmt(c["p50"]), _fmt(c["p99"]),
                   _fmt(c["cpu_us_per_op"]), str(c["op_errors"])]
            for p in PEERS:
                if p in servers:
                    row.append(_ratio_cell(compare(agg, w, p)) if s == "brain" else "")
            out.append("| " + " | ".join(row) + " |")
        notes = []
        for s in servers:
            c = agg[w].get(s)
            if c is None:
                continue
            ex = c.get("extra") or {}
            bits = []
            for k, v in ex.items():
                if k == "partial":
                    continue
                if isinstance(v, str):  # the server's answer to an RPC it lacks
                    bits.append(f"{k}: `{_oneline(v, 200)}`")
                elif isinstance(v, list):  # a restart's samples, in the order they were taken
                    bits.append(f"{k} {', '.join(_fmt(x) for x in v)}")
                elif k.endswith("_kb"):
                    bits.append(f"{k[:-3]} {v / 1024:,.0f} MiB")
                else:
                    bits.append(f"{k} {_fmt(v) if not isinstance(v, bool) else ('PASS' if v else 'FAIL')}")
            if ex.get("partial"):
                bits.append(f"partial: {ex['partial']}")
            if len(c.get("sources") or []) == 1 and labels:
                bits.append(f"run {_run_mark(c, labels).strip()} `{c['sources'][0]}`")
            if c.get("error"):
                bits.append(f"{len(c['failures'])} failed run(s), first error: `{_oneline(c['error'], 300)}`")
            if bits:
                notes.append(f"- {s}: " + "; ".join(bits))
            for run in sorted(c["runs"] + c["failures"], key=lambda r: r.get("round", 0)):
                kills = (run.get("result") or {}).get("kills")
                if kills:
                    notes.append(f"- {s} round {run.get('round')}: " + _kills_line(run["result"]))
                prof = (run.get("result") or {}).get("profile")
                if prof:
                    notes.append(f"- {s}, profiled: " + _profile_line(prof))
        out += [""] + notes + ([""] if notes else [])
    return out


def _kills_line(res: dict) -> str:
    """One failover run: each fault's write pause, then what the writer and the verify saw."""
    names = {"leader": "kill -9 of the leader", "nats": "kill -9 of the NATS stream leader",
             "restart": "SIGTERM restart of", "isolate": "SIGSTOP isolation of the leader",
             "nats-roll": "planned restart (step-down, lame duck) of nats-server"}
    kills = ", ".join(f"{names.get(k['fault'], k['fault'])} {k['member']}{' (leading)' if k.get('was_leader') else ''} "
                      f"{_fmt(k.get('write_pause_s'))} s"
                      + (f" (a new leader after {_fmt(k['leader_after_s'])} s)" if k.get("leader_after_s") is not None
                         else "")
                      + (f" (the new stream leader took over at {_fmt(k['stream_leader_since_s'])} s; writes resumed "
                         f"{_fmt(k['beyond_election_s'])} s after it)" if k.get("stream_leader_since_s") is not None
                         and k.get("beyond_election_s") is not None else "")
                      for k in res["kills"])
    return (f"write pauses after {kills}; {res.get('acked')} writes acknowledged "
            f"({res.get('unknown')} unknown outcomes), {res.get('verified')} read back, {res.get('lost')} lost, "
            f"{(res.get('writer_violations') or 0) + (res.get('verify_violations') or 0)} violations")


def _profile_line(prof: dict) -> str:
    """A read profiled on both sides (benchmarks/profiles.py): the client's CPU by class, the server's by
    function (its own samples, and with what it called)."""
    head = (f"{prof.get('run', 'a second run under the profilers')}: {_fmt(prof.get('seconds'))} s, client "
            f"{_fmt(prof.get('client_cpu_s'))} s of CPU (the whole process), server {_fmt(prof.get('server_cpu_s'))} s")
    if prof.get("error"):
        return f"{head}; the profile failed: `{_oneline(prof['error'], 300)}`"
    bits = [head]
    client = prof.get("client") or {}
    if client:
        bits.append(f"the client's {_fmt(client.get('cpu_s'))} s sampled: " + ", ".join(
            f"{x['class']} {_fmt(x['cpu_s'])} s ({x['share']:.0%})" for x in client.get("classes") or []))
        flat = [ln.split(None, 5) for ln in client.get("top") or [] if re.match(r"^\s*[\d.]+\w*\s+[\d.]+%", ln)]
        if flat:
            bits.append("its functions by own time (pprof -top): " + ", ".join(
                f"`{x[-1]}` {x[1]}" for x in flat[:6] if len(x) >= 6))
    server = prof.get("server")
    if isinstance(server, dict) and server.get("samples"):
        bits.append(f"the server's {server['samples']} samples (py-spy, non-idle threads) by function, own: "
                    + ", ".join(f"`{x['function']}` {x['share']:.0%}" for x in server["self"][:6])
                    + "; with what it called: "
                    + ", ".join(f"`{x['function']}` {x['share']:.0%}" for x in server["total"][:6]))
    elif isinstance(server, str):
        bits.append(server)
    return "; ".join(bits)


def _oneline(s: str, n: int) -> str:
    s = " ".join(str(s).split()).replace("`", "'").replace("|", "/")
    return s[:n] + ("…" if len(s) > n else "")


def header(data: dict) -> list[str]:
    m = data["meta"]
    mach = m.get("machine", {})
    st = m.get("settings", {})
    lines = [
        f"# brain benchmarks, {m.get('started', '?')[:10]} ({st.get('name', '?')} run)",
        "",
        ("Base run's machine" if m.get("merged") else "Machine")
        + f": {mach.get('nproc')} CPUs ({mach.get('cpu')}), {mach.get('memory_gib')} GiB RAM, "
        f"kernel {mach.get('kernel')}, data dirs on {mach.get('data_dir_fs')}; "
        f"load generators run on the same machine as the server.  "
        f"Started {m.get('started')}, took {m.get('elapsed_s', 0) / 60:.1f} min."
        + (f"  Load average (1, 5, 15 min) {mach['load_average_start']} at the start, "
           f"{mach.get('load_average_end', '?')} at the end: other work on the machine shares its CPUs."
           if mach.get("load_average_start") else ""),
        "",
        "| server | version | settings | measured process |",
        "|---|---|---|---|",
    ]
    for name, s in m.get("servers", {}).items():
        if not s.get("selected"):
            continue
        if s.get("available"):
            lines.append(f"| {name} | {s.get('version')} | {s.get('flags')} | {s.get('measured_process')} |")
        else:
            lines.append(f"| {name} | **skipped**: {s.get('reason')} | | |")
    for name, c in (m.get("clusters") or {}).items():
        label = f"{name} cluster of {c.get('size', 3)}"
        if c.get("available"):
            lines.append(f"| {label} | {c.get('version')} | {c.get('flags')} | {c.get('measured_process')} |")
        else:
            lines.append(f"| {label} | **skipped**: {c.get('reason')} | | |")
    lines += ["", "Tools: " + "; ".join(f"{k}: {v or 'missing'}" for k, v in m.get("tools", {}).items()) + ".", ""]
    order = m.get("order_rule") or ("servers took turns in a fixed order, "
                                    + ", ".join(s for s, v in m.get("servers", {}).items() if v.get("selected"))
                                    + " (brain always last)")
    lines += group_runs_section(data) + [""]
    lines.append(
        f"{st.get('duration')} s per timed phase, each group on a freshly started server; a cell is the median "
        f"of the successful runs with their range and count (\"200 (100-300, 3 runs)\"; \"2/3 runs\" when fewer "
        f"succeeded than ran), a restart row's the median of its starts with their range (the largest is the "
        f"worst), a fault row's the p99 of its faults with their p50 (both by nearest rank) and range; "
        f"{order}.  "
        f"put and range use etcd's `benchmark` tool (sized from a short calibration pass that also warms up), "
        f"everything else `brainload`.  {m.get('conns_rule', '')}.  CPU µs/op is the server process group's "
        f"utime+stime during the timed phase divided by its operations (load generator excluded).")
    if m.get("restart_rule"):
        lines += ["", "Restart runs: " + m["restart_rule"].split(": ", 1)[1] + "."]
    ran = {mode_of(r["workload"]) for r in data.get("runs", [])}
    if "mtls" in ran and m.get("mtls_rule"):
        lines += ["", "Mutual TLS, " + m["mtls_rule"] + "."]
    if "cluster" in ran:
        for key in ("cluster_rule", "failover_rule", "read_lease_rule"):
            if m.get(key):
                lines += ["", "Clusters, " + m[key] + "."]
    for merged in m.get("merged", []):
        # A merged run's workloads the base had are re-measurements; the others are new rows.
        added = merged.get("added", [])
        what = ("**Added** on {} ({}; {})" if added and len(added) == len(merged["workloads"])
                else "**Re-measured** on {} ({}; {})")
        lines += ["", what.format(merged['started'][:16].replace('T', ' '), merged['brain'], merged['order_rule'])
                      + f": {', '.join(merged['workloads'])} "
                      f"on {', '.join(merged.get('servers', []))}, from `{merged['file']}`; later "
                      f"re-measurements replace earlier ones."]
    lines += runs_section(data)
    notes = m.get("notes") or []
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return lines


def _load(x) -> str:
    return x if x else "not recorded"


# A 1-minute load average above this at the start of a group: the machine was not quiet.
QUIET_LOAD = 0.5


def _load1(text) -> float | None:
    """The 1-minute figure of a recorded load average ("1.97, 1.44, 1.20"), or None."""
    try:
        return float(str(text).split(",")[0])
    except ValueError:
        return None


def rounds_per_group(data: dict) -> dict[str, dict[str, int]]:
    """{group: {server: rounds that recorded a run}}, from the runs themselves."""
    out: dict[str, dict[str, set]] = {}
    for r in data.get("runs", []):
        w = WORKLOADS.get(r["workload"])
        if w is not None:
            out.setdefault(w.group, {}).setdefault(r["server"], set()).add(r.get("round"))
    return {g: {srv: len(rs) for srv, rs in by.items()} for g, by in out.items()}


def group_runs_section(data: dict) -> list[str]:
    """How many times each group ran (from its records: a group whose servers ran it a different number
    of times says so per server), and for runs that recorded it the load average at each group's start
    and end, with a warning for every group that started above QUIET_LOAD."""
    m = data["meta"]
    ran = rounds_per_group(data)
    spans = {x["group"]: x for x in m.get("group_runs") or []}
    order = [g for g in list(spans) + sorted(ran) if g in ran]
    order = list(dict.fromkeys(order))
    if not order:
        return []

    def times(g: str) -> str:
        counts = ran[g]
        if len(set(counts.values())) == 1:
            n = next(iter(counts.values()))
            return "once" if n == 1 else f"{n} times"
        return ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))

    lines = ["Each group ran per server (a fresh start each time; restart, check-perf and scale once by design, "
             "their rows' samples are starts or one run):"]
    if not spans:
        lines[0] += " " + "; ".join(f"{g} {times(g)}" for g in order) + "."
        start = _load1((m.get("machine") or {}).get("load_average_start"))
        if start is not None and start > QUIET_LOAD:
            lines += ["", f"**Not quiet**: the 1-minute load average was {start:.2f} at the start of the run (above "
                          f"{QUIET_LOAD}); other work shared the CPUs.  This run did not record the load per group."]
        return lines
    noisy = []
    lines += ["", "| group | ran | started | load average at start (1, 5, 15 min) | at end | |",
              "|---|---|---|---|---|---|"]
    for g in order:
        x = spans.get(g, {})
        load = _load1(x.get("load_average_start"))
        flag = ""
        if load is not None and load > QUIET_LOAD:
            flag = "**not quiet**"
            noisy.append(f"{g} ({load:.2f})")
        lines.append(f"| {g} | {times(g)} | {str(x.get('started', '?'))[11:16]} | {_load(x.get('load_average_start'))} "
                     f"| {_load(x.get('load_average_end'))} | {flag} |")
    if noisy:
        lines += ["", f"**Not quiet**: {len(noisy)} of {len(order)} groups started with a 1-minute load average above "
                      f"{QUIET_LOAD}: {', '.join(noisy)}; other work shared the CPUs with their servers and load "
                      f"generators, so their figures are low and noisy, and a ratio of them is one of that load."]
    return lines


def runs_section(data: dict) -> list[str]:
    """A merged report's runs: each one's machine and load, and the cells it supplies; then the rule
    that ratios and targets compare cells of one run only."""
    labels = run_labels(data)
    if not labels:
        return []
    supplied: dict[str, dict[str, set]] = {}
    for r in data["runs"]:
        supplied.setdefault(r.get("source") or "", {}).setdefault(r["server"], set()).add(r["workload"])
    lines = ["", "This report merges runs made at different times, on different machines or under different load:",
             "", "| run | file | started | machine | load average (1, 5, 15 min) at start | at end "
                 "| cells it supplies |", "|---|---|---|---|---|---|---|"]
    seen = set()
    for x in data["meta"].get("sources") or []:
        if x["file"] in seen:
            continue
        seen.add(x["file"])
        by_server = supplied.get(x["file"], {})
        cells = "; ".join(f"{s}: {', '.join(_ranges([w for w in WORKLOADS if w in by_server[s]]))}"
                          for s in SERVERS if s in by_server) or "none (every cell re-measured later)"
        lines.append(f"| {labels[x['file']]} | `{x['file']}` | {x.get('started', '?')[:16].replace('T', ' ')} | "
                     f"{x.get('machine', '?')} | {_load(x.get('load_start'))} | {_load(x.get('load_end'))} | "
                     f"{cells} |")
    lines += ["", "Every cell names the run it comes from ([A], [B], ...).  A ratio is given only when both of its "
                  "cells come from the same run, and reads \"n/a (runs differ)\" otherwise; a target resting on "
                  "cells of different runs is n/a.  Cells of different runs can still be read as absolute "
                  "figures of their own run."]
    return lines


def targets_section(agg: dict, settings: dict | None) -> list[str]:
    out: list[str] = []
    tg = targets(agg, settings)
    for issue in ISSUES:
        heading = issue.title
        rows = [t for t in tg if t["issue"] == issue.number]
        if not any(t["ran"] for t in rows):  # none of its workloads was part of this run
            continue
        if out:
            out.append("")
        out += [f"## Targets ({heading})", "", "| target | value | goal | status |", "|---|---|---|---|"]
        out += _target_rows([t for t in rows if t["ran"]])
        if not all(t["ran"] for t in rows):  # a run of some groups: the others' targets are not listed
            out += ["", f"{sum(not t['ran'] for t in rows)} of the issue's {len(rows)} targets rest on "
                        f"workloads this run did not measure."]
    return out


def _target_rows(rows: list[dict]) -> list[str]:
    out = []
    for t in rows:
        val = t["note"] if t["target"].startswith("etcdctl") else _fmt(t["value"])
        if t["note"] and not t["target"].startswith("etcdctl"):
            val += f" ({t['note']})"
        status = {"pass": "pass", "miss": "**miss**", "n/a": "n/a"}[t["status"]]
        out.append(f"| {t['target']} | {val or '–'} | {t['goal']} | {status} |")
    return out


def summary_tables(data: dict, agg: dict, level: str = "###") -> list[str]:
    """The summary table of each mode that ran, under a heading when there are several."""
    modes = [m for m in MODE_TITLES if any(mode_of(w) == m for w in agg)]
    out: list[str] = []
    for m in modes:
        if len(modes) > 1:
            out += [f"{level} {MODE_TITLES[m][0].upper()}{MODE_TITLES[m][1:]}", ""]
        out += summary_table(data, agg, m) + [""]
        if m == "cluster":
            out += read_confirmation_table(agg, data["meta"].get("brain_serve_defaults"))
    return out[:-1] if out else out


def read_confirmation_table(agg: dict, brain_defaults: dict | None = None) -> list[str]:
    """Linearizable range on brain's cluster with its read lease on and off, each cell labelled with the
    run it comes from (brain serve's default, or the flag that set it), beside etcd 3.6's; a ratio only
    between cells of one run.  [] when the run measured no row of the setting that is not the default.
    A run that did not record brain's defaults ran before they could be set otherwise: lease on."""
    default_on = (brain_defaults or {}).get("read_lease", True)
    out = []
    for clients, rows in LEASE_ROWS.items():
        cells = {}
        for setting, flag in (("on", "--read-lease=true"), ("off", "--read-lease=false")):
            explicit = (agg.get(rows[setting]) or {}).get("brain")
            if explicit is not None:
                cells[setting] = (explicit, flag)
            elif (setting == "on") == default_on and (agg.get(rows["default"]) or {}).get("brain"):
                cells[setting] = (agg[rows["default"]]["brain"], "default")
        if not any(label != "default" for _, label in cells.values()):
            continue
        etcd = (agg.get(rows["default"]) or {}).get("etcd-3.6")
        on, off = cells.get("on", (None, ""))[0], cells.get("off", (None, ""))[0]
        out.append(f"| {clients} | {_lease_cell(cells.get('on'))} | {_lease_cell(cells.get('off'))} "
                   f"| {_lease_cell((etcd, '') if etcd else None)} | {_over(off, on)} | {_over(off, etcd)} "
                   f"| {_over(on, etcd)} |")
    if not out:
        return []
    return ["Read confirmation: linearizable range, one key, on brain's cluster with its read lease on (the leader "
            "answers within its lease) and off (every read confirmed by a barrier record the journal's quorum "
            "acknowledged, as etcd confirms a ReadIndex), beside etcd 3.6's cluster; each brain cell says how "
            "the lease was set (`brain serve`'s default, or the flag):", "",
            "| clients | brain, read lease on | brain, read lease off | etcd-3.6 | brain off / on "
            "| brain off / etcd-3.6 | brain on / etcd-3.6 |", "|---|---|---|---|---|---|---|", *out, ""]


def _lease_cell(cell_label) -> str:
    if cell_label is None or cell_label[0] is None or cell_label[0].get("value") is None:
        return "–"
    c, label = cell_label
    return f"{_fmt(c['value'])}/s, p99 {_fmt(c.get('p99'))} ms" + (f" ({label})" if label else "")


def _over(a: dict | None, b: dict | None) -> str:
    if not a or not b or a.get("value") is None or not b.get("value"):
        return "–"
    return _fmt(a["value"] / b["value"]) if same_run(a, b) else "runs differ"


def markdown(data: dict, plots: list[str]) -> str:
    agg = aggregate(data)
    lines = header(data) + ["", "## Summary (medians)", ""] + summary_tables(data, agg)
    lines += ["", *targets_section(agg, data["meta"].get("settings")), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Workloads", ""] + detail_tables(data, agg)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

COLORS = {"brain": "#d62728", "etcd-3.6": "#1f77b4", "etcd-3.6-fast": "#aec7e8", "etcd-3.7": "#9467bd",
          "etcd-3.7-fast": "#c5b0d5", "etcd-3.4": "#7f7f7f", "kine": "#2ca02c"}


def plots(data: dict, out_dir: Path, base: str) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    agg = aggregate(data)
    servers = _servers_in(data)
    made = []

    put = [w for w in ("put-c1", "put-c64", "put-c256") if w in agg]
    if put:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in servers:
            pts = [(agg[w][s]["value"], agg[w][s]["p99"], w.split("-c")[1]) for w in put
                   if s in agg[w] and agg[w][s]["value"] is not None and agg[w][s]["p99"] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=s, color=COLORS.get(s))
            for x, y, c in pts:
                ax.annotate(f"{c}c", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("throughput, put/s (median)")
        ax.set_ylabel("p99 latency, ms (median)")
        ax.set_yscale("log")
        ax.set_title("put, 256 B values: throughput vs p99 latency at 1/64/256 clients")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        name = f"{base}-put-latency.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        made.append(name)

    suffix = {"plain": "workloads", "mtls": "mtls", "cluster": "cluster", "scale": "scale"}
    for mode, title_ in MODE_TITLES.items():
        ws = [w for w in WORKLOADS if w in agg and mode_of(w) == mode]
        if not ws:
            continue
        cols = 4
        rows = (len(ws) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
        for ax, w in zip(axes.flat, ws):
            names, vals, lo, hi, raw = [], [], [], [], []
            for s in servers:
                c = agg[w].get(s)
                if c is None:
                    continue
                v = c["value"]
                names.append(s)
                raw.append(v)
                vals.append(v or 0)
                vv = [x for x in c["values"] if x is not None] or [v or 0]
                lo.append(max(0, (v or 0) - min(vv)))
                hi.append(max(0, max(vv) - (v or 0)))
            ax.bar(names, vals, color=[COLORS.get(n) for n in names], yerr=[lo, hi], capsize=3)
            for i, (n, v) in enumerate(zip(names, raw)):
                if v is None:
                    what = (UNSUPPORTED if UNSUPPORTED in (agg[w][n].get("extra") or {})
                            else "error" if agg[w][n].get("error") else "–")
                    ax.text(i, 0, what, ha="center", va="bottom", fontsize=8)
                elif v == 0:
                    ax.text(i, 0, "0", ha="center", va="bottom", fontsize=8)
                elif (agg[w][n].get("extra") or {}).get("partial"):
                    ax.text(i, v, "partial", ha="center", va="bottom", fontsize=8)
            meta = WORKLOADS[w]
            ax.set_title(f"{w} ({meta.unit}{'' if meta.higher_better else ', lower better'})", fontsize=9)
            ax.tick_params(axis="x", labelsize=7)
            ax.tick_params(axis="y", labelsize=7)
        for ax in list(axes.flat)[len(ws):]:
            ax.axis("off")
        spread = "rounds; restart rows: over samples" if any(WORKLOADS[w].samples for w in ws) else "rounds"
        fig.suptitle(f"{title_}: median per server (bars: min-max over {spread})")
        fig.tight_layout()
        name = f"{base}-{suffix[mode]}.png"
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        made.append(name)
    return made


# ---------------------------------------------------------------------------
# README block
# ---------------------------------------------------------------------------


def readme_block(data: dict, md_rel: str) -> str:
    agg = aggregate(data)
    m = data["meta"]
    mach = m.get("machine", {})
    tg = targets(agg, m.get("settings"))
    tally = []
    for issue in ISSUES:
        heading = issue.title
        rows = [t for t in tg if t["issue"] == issue.number]
        if not any(t["ran"] for t in rows):
            continue
        passed = sum(1 for t in rows if t["status"] == "pass")
        unknown = sum(1 for t in rows if t["status"] == "n/a")
        missed = [t["target"] for t in rows if t["status"] == "miss"]
        tally.append(f"Targets ({heading}): {passed} of {len(rows)} met, {unknown} n/a"
                     + (f"; missed: {', '.join(missed)}." if missed else "."))
    labels = run_labels(data)
    if labels:
        parts, seen = [], set()
        for x in m["sources"]:
            if x["file"] not in seen:
                seen.add(x["file"])
                load = (f"load average {_load(x.get('load_start'))} at the start, {_load(x.get('load_end'))} at "
                        f"the end" if x.get("load_start") or x.get("load_end") else "load average not recorded")
                parts.append(f"[{labels[x['file']]}] {x['started'][:10]} on {x.get('machine', '?')}, {load}")
        runs = "; ".join(parts)
        intro = (f"Benchmark results merged from several runs ({runs}).  Each cell names its run; a brain/X "
                 f"ratio is given only when both cells come from the same run (\"n/a (runs differ)\" "
                 f"otherwise), and a target resting on cells of different runs is n/a.  Medians of the "
                 f"successful runs out of the row's runs, \"(2/3)\" where fewer succeeded; full report: "
                 f"[{md_rel}]({md_rel}):")
    else:
        load = (f", load average {mach['load_average_start']} at the start and "
                f"{mach.get('load_average_end', '?')} at the end" if mach.get("load_average_start") else "")
        intro = (f"Latest `make bench` ({m.get('started', '?')[:10]} on {mach.get('nproc')} CPUs "
                 f"{mach.get('cpu')}{load}; medians of the successful runs out of the row's runs, \"(2/3)\" "
                 f"where fewer succeeded; full report: [{md_rel}]({md_rel})):")
    noisy = [f"{x['group']} ({_load1(x.get('load_average_start')):.2f})" for x in m.get("group_runs") or []
             if (_load1(x.get("load_average_start")) or 0) > QUIET_LOAD]
    if noisy:
        intro += (f"  **Not quiet**: {', '.join(noisy)} started with a 1-minute load average above {QUIET_LOAD} "
                  f"(other work shared the CPUs).")
    lines = [
        README_BEGIN,
        intro,
        "",
        *summary_tables(data, agg, level="####"),
        "",
        *"\n\n".join(tally).split("\n"),
        README_END,
    ]
    return "\n".join(lines)


def _ranges(workloads: list[str]) -> list[str]:
    """Workload names with a mode's rows folded into one ("mtls-* (9 rows)")."""
    out: list[str] = []
    for mode, prefix in (("mtls", MTLS), ("cluster", CLUSTER), ("scale", SCALE)):
        ws = [w for w in workloads if mode_of(w) == mode]
        if len(ws) > 2:
            out.append(f"{prefix}* ({len(ws)} rows)")
            workloads = [w for w in workloads if w not in ws]
    return [w for w in workloads] + out


def update_readme(readme: Path, block: str) -> None:
    text = readme.read_text() if readme.exists() else ""
    if README_BEGIN in text and README_END in text:
        pre, rest = text.split(README_BEGIN, 1)
        _, post = rest.split(README_END, 1)
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)


def _run_entry(meta: dict, name: str) -> dict:
    """One run as a merged report lists it: its file, start, machine and load averages."""
    mach = meta.get("machine") or {}
    return {"file": name, "started": meta.get("started", "?"),
            "machine": f"{mach.get('nproc')} CPUs {mach.get('cpu')}",
            "load_start": mach.get("load_average_start"), "load_end": mach.get("load_average_end"),
            "brain": (meta.get("servers", {}).get("brain") or {}).get("version") or "brain"}


def merge(base: dict, rerun: dict, rerun_name: str, modes: tuple = ("plain", "mtls", "cluster", "scale"),
          base_name: str = "base.json") -> dict:
    """``base`` with the runs of every (server, workload) ``rerun`` measured replaced by ``rerun``'s.

    Every run record keeps its file in "source" (the base's runs ``base_name``, unless already
    tagged by an earlier merge), and meta["sources"] lists each run's machine and load, so that
    the report compares cells of one run only.  ``modes``: only the rerun's workloads of these
    modes are taken (a cluster run's single-brain baseline rows can be left out of a table whose
    other servers ran elsewhere)."""
    rerun = dict(rerun, runs=[dict(r, source=rerun_name) for r in rerun["runs"] if mode_of(r["workload"]) in modes])
    measured = {r["workload"] for r in rerun["runs"]}
    pairs = {(r["server"], r["workload"]) for r in rerun["runs"]}
    derived = {w for w, meta in WORKLOADS.items() if meta.source in measured}
    kept = [r if r.get("source") else dict(r, source=base_name) for r in base["runs"]
            if (r["server"], r["workload"]) not in pairs]
    runs = kept + list(rerun["runs"])
    meta = json.loads(json.dumps(base["meta"]))
    if not meta.get("sources"):
        meta["sources"] = [_run_entry(base["meta"], base_name)]
        meta["notes"] = [f"{base_name}: {n}" for n in meta.get("notes") or []]
    meta["sources"].append(_run_entry(rerun["meta"], rerun_name))
    for k, v in rerun["meta"].get("settings", {}).items():
        meta.setdefault("settings", {}).setdefault(k, v)
    rounds = meta["settings"].setdefault("rounds_of_merged", {})
    files = meta["settings"].setdefault("file_of_merged", {})
    for w in measured:
        rounds[w] = rerun["meta"].get("settings", {}).get("rounds") or 1
        files[w] = rerun_name
    rm = rerun["meta"]
    # Each group's load at its start and end, from the run that measured it (a re-run's replaces the base's).
    rerun_groups = {x["group"] for x in rm.get("group_runs") or []}
    meta["group_runs"] = [x for x in meta.get("group_runs") or [] if x["group"] not in rerun_groups] + [
        dict(x, file=rerun_name) for x in rm.get("group_runs") or []]
    before = {r["workload"] for r in base["runs"]}
    before |= {w for w, meta in WORKLOADS.items() if meta.source in before}
    entry = _run_entry(rm, rerun_name)
    meta.setdefault("merged", []).append({
        "file": rerun_name, "started": rm.get("started", "?"),
        "workloads": sorted(measured | derived, key=list(WORKLOADS).index),
        "added": sorted((measured | derived) - before, key=list(WORKLOADS).index),
        "servers": sorted({s for s, _ in pairs}, key=lambda s: SERVERS.index(s) if s in SERVERS else 99),
        "brain": entry["brain"], "load": entry["load_end"] or "?", "machine": entry["machine"],
        "order_rule": rm.get("order_rule", ""),
    })
    for key in ("restart_rule", "mtls_rule", "cluster_rule", "failover_rule", "read_lease_rule",
                "brain_serve_defaults"):
        if rm.get(key):
            meta[key] = rm[key]
    if rm.get("clusters"):
        meta.setdefault("clusters", {}).update(rm["clusters"])
    for name, server in (rm.get("servers") or {}).items():
        if server.get("selected") and not (meta.get("servers", {}).get(name) or {}).get("selected"):
            meta.setdefault("servers", {})[name] = server  # a server the base run did not have
    for name, tool in (rm.get("tools") or {}).items():
        meta.setdefault("tools", {}).setdefault(name, tool)
    meta["notes"] = meta.get("notes", []) + [f"{rerun_name}: {n}" for n in rm.get("notes", [])]
    return {"meta": meta, "runs": runs}


def write_all(json_path: Path, md_path: Path, readme: bool = False) -> None:
    data = json.loads(Path(json_path).read_text())
    base = Path(md_path).stem
    made = plots(data, Path(md_path).parent, base)
    Path(md_path).write_text(markdown(data, made))
    if readme:
        from benchmarks.servers import REPO_ROOT

        rel = Path(md_path).resolve().relative_to(REPO_ROOT).as_posix()
        update_readme(REPO_ROOT / "README.md", readme_block(data, rel))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--readme", action="store_true", help="also rewrite the README's bench block")
    ap.add_argument("--merge", type=Path, action="append",
                    help="a re-run whose (server, workload) runs replace the JSON's; repeatable, later ones "
                         "replace earlier ones (needs --out)")
    ap.add_argument("--merge-modes", default="plain,mtls,cluster,scale",
                    help="take only the re-runs' workloads of these modes (plain, mtls, cluster, scale)")
    ap.add_argument("--out", type=Path, help="where the merged JSON goes (its report beside it)")
    a = ap.parse_args(argv)
    src = a.json
    if a.merge:
        if not a.out:
            ap.error("--merge needs --out")
        merged = json.loads(a.json.read_text())
        modes = tuple(x.strip() for x in a.merge_modes.split(","))
        for rerun in a.merge:
            merged = merge(merged, json.loads(rerun.read_text()), rerun.name, modes, base_name=a.json.name)
        a.out.write_text(json.dumps(merged, indent=1) + "\n")
        src = a.out
    md = src.with_suffix(".md")
    write_all(src, md, readme=a.readme)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
