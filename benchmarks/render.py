"""The benchmark report in markdown: the summary tables per mode, the targets,
the node-capacity section (benchmarks/capacity_report.py), the plots' links
and a section per workload; and the progress line of one run.

A cell backed by fewer successful runs than the workload was run for says so
("(2/3)"); a ratio is shown only when both of its cells come from one run
("n/a (runs differ)" otherwise).
"""

from __future__ import annotations

import dataclasses
import re

from benchmarks import capacity_report
from benchmarks.aggregation import (FAST_CONFIG, PEERS, Ratio, aggregate, compare, numeric, planned_runs, same_run,
                                    servers_in)
from benchmarks.formatting import fmt, oneline
from benchmarks.judging import targets
from benchmarks.provenance import header, run_labels
from benchmarks.settings import FULL
from benchmarks.targets import ISSUES
from benchmarks.workloads import LEASE_ROWS, SCALE_MIXES, UNSUPPORTED, WORKLOADS, mode_of


MODE_TITLES = {"plain": "plaintext, one server", "mtls": "mutual TLS, one server",
               "cluster": "clusters: 3 brains on 3 nats-servers (brain) vs 3 etcd 3.6 members (etcd-3.6)",
               "scale": "scale: one Kubernetes-shaped data set per server (brainload scale-load), one server"}


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
        bits.append(f"{fmt(numeric(r.get(w.metric)))} {w.unit}")
    lat = r.get("latency_ms") or {}
    if lat.get("p99") is not None:
        bits.append(f"p50 {fmt(lat.get('p50'))} ms p99 {fmt(lat.get('p99'))} ms")
    if rec.get("cpu_us_per_op") is not None:
        bits.append(f"cpu {fmt(rec['cpu_us_per_op'])} µs/op")
    if r.get("errors"):
        bits.append(f"{r['errors']} errors")
    for k in ("expire_seconds", "on_schedule", "pass", "ready_after_kill9_s", "rss_after_load_kb",
              "keys_loaded", "longest_gap_s", "expired"):
        if k in r:
            bits.append(f"{k} {fmt(r[k]) if not isinstance(r[k], bool) else r[k]}")
    if r.get("kills"):
        bits.append(_kills_line(r))
    if rec.get("partial"):
        bits.append(f"PARTIAL: {rec['partial']}")
    return ", ".join(bits)


def ratio_cell(r: Ratio) -> str:
    if r.value is not None:
        return (f"{r.bound} " if r.bound else "") + f"{r.value:.2f}" + (" (default only)" if r.default_only else "")
    if r.why == "unbounded":
        return "n/a (no step failed on either)"
    return "n/a (runs differ)" if r.why == "runs differ" else "–"


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
    return f"{fmt(min(xs))}-{fmt(max(xs))}, {len(xs)} {noun}s"


def value_cell(c: dict | None, labels: dict[str, str]) -> str:
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
    cell = fmt(c["value"])
    if (c.get("extra") or {}).get("bounded") is False:  # a capacity whose search never saw a step fail
        cell = "≥ " + cell
    short = f"{c['n']}/{c['planned']} runs" if c["n"] < c["planned"] else ""
    if "worst" in c:  # a restart row: its samples are starts
        bits = [_spread(c.get("samples") or [], "sample"), short]
    elif c.get("max") is not None:  # a fault row: its value is the p99 of the samples
        bits = [f"p50 {fmt(c['p50'])}", _spread(c.get("samples") or [], "sample"), short]
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
    servers = [s for s in servers_in(data) if s in ran]
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
        row += [value_cell(agg[w].get(s), labels) for s in servers]
        row += [ratio_cell(compare(agg, w, p)) for p in peers]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def detail_tables(data: dict, agg: dict) -> list[str]:
    servers = servers_in(data)
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
            vals = ", ".join(fmt(v) for v in c["values"] if v is not None)
            row = [s, f"{fmt(c['value'])} ({c['n']}/{c['planned']})", vals or "–", fmt(c["p50"]), fmt(c["p99"]),
                   fmt(c["cpu_us_per_op"]), str(c["op_errors"])]
            for p in PEERS:
                if p in servers:
                    row.append(ratio_cell(compare(agg, w, p)) if s == "brain" else "")
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
                    bits.append(f"{k}: `{oneline(v, 200)}`")
                elif isinstance(v, list):  # a restart's samples, in the order they were taken
                    bits.append(f"{k} {', '.join(fmt(x) for x in v)}")
                elif k.endswith("_kb"):
                    bits.append(f"{k[:-3]} {v / 1024:,.0f} MiB")
                else:
                    bits.append(f"{k} {fmt(v) if not isinstance(v, bool) else ('PASS' if v else 'FAIL')}")
            if ex.get("partial"):
                bits.append(f"partial: {ex['partial']}")
            if len(c.get("sources") or []) == 1 and labels:
                bits.append(f"run {_run_mark(c, labels).strip()} `{c['sources'][0]}`")
            if c.get("error"):
                bits.append(f"{len(c['failures'])} failed run(s), first error: `{oneline(c['error'], 300)}`")
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
                      f"{fmt(k.get('write_pause_s'))} s"
                      + (f" (a new leader after {fmt(k['leader_after_s'])} s)" if k.get("leader_after_s") is not None
                         else "")
                      + (f" (the new stream leader took over at {fmt(k['stream_leader_since_s'])} s; writes resumed "
                         f"{fmt(k['beyond_election_s'])} s after it)" if k.get("stream_leader_since_s") is not None
                         and k.get("beyond_election_s") is not None else "")
                      for k in res["kills"])
    return (f"write pauses after {kills}; {res.get('acked')} writes acknowledged "
            f"({res.get('unknown')} unknown outcomes), {res.get('verified')} read back, {res.get('lost')} lost, "
            f"{(res.get('writer_violations') or 0) + (res.get('verify_violations') or 0)} violations")


def _profile_line(prof: dict) -> str:
    """A read profiled on both sides (benchmarks/profiles.py): the client's CPU by class, the server's by
    function (its own samples, and with what it called)."""
    head = (f"{prof.get('run', 'a second run under the profilers')}: {fmt(prof.get('seconds'))} s, client "
            f"{fmt(prof.get('client_cpu_s'))} s of CPU (the whole process), server {fmt(prof.get('server_cpu_s'))} s")
    if prof.get("error"):
        return f"{head}; the profile failed: `{oneline(prof['error'], 300)}`"
    bits = [head]
    client = prof.get("client") or {}
    if client:
        bits.append(f"the client's {fmt(client.get('cpu_s'))} s sampled: " + ", ".join(
            f"{x['class']} {fmt(x['cpu_s'])} s ({x['share']:.0%})" for x in client.get("classes") or []))
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
        val = t["note"] if t["target"].startswith("etcdctl") else fmt(t["value"])
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
    return f"{fmt(c['value'])}/s, p99 {fmt(c.get('p99'))} ms" + (f" ({label})" if label else "")


def _over(a: dict | None, b: dict | None) -> str:
    if not a or not b or a.get("value") is None or not b.get("value"):
        return "–"
    return fmt(a["value"] / b["value"]) if same_run(a, b) else "runs differ"


def markdown(data: dict, plots: list[str]) -> str:
    agg = aggregate(data)
    lines = header(data) + ["", "## Summary (medians)", ""] + summary_tables(data, agg)
    capacity = capacity_report.section(data)
    if capacity:
        lines += ["", *capacity]
    lines += ["", *targets_section(agg, data["meta"].get("settings")), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Workloads", ""] + detail_tables(data, agg)
    return "\n".join(lines).rstrip() + "\n"
