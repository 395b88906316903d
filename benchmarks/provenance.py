"""Where a benchmark report's figures come from, its header: the machine, the
servers and tools, how often each group ran and the machine's load around it,
the rules of the run, and for a merged report each run it merges and the
cells that run supplies.
"""

from __future__ import annotations

from benchmarks.aggregation import SERVERS
from benchmarks.workloads import CLUSTER, MTLS, SCALE, WORKLOADS, mode_of


def run_labels(data: dict) -> dict[str, str]:
    """A letter per run of a merged report ({file: "A", ...}, base run first); {} for a single run."""
    files = []
    for x in data["meta"].get("sources") or []:
        if x["file"] not in files:
            files.append(x["file"])
    return {f: chr(ord("A") + i) for i, f in enumerate(files)} if len(files) > 1 else {}


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


def recorded_load(x) -> str:
    return x if x else "not recorded"


# A 1-minute load average above this at the start of a group: the machine was not quiet.
QUIET_LOAD = 0.5


def one_minute_load(text) -> float | None:
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

    lines = ["Each group ran per server (a fresh start each time; restart, check-perf and the node-capacity groups "
             "once by design, their rows' samples are starts or one search of steps; scale once unless "
             "--scale-rounds asks for more):"]
    if not spans:
        lines[0] += " " + "; ".join(f"{g} {times(g)}" for g in order) + "."
        start = one_minute_load((m.get("machine") or {}).get("load_average_start"))
        if start is not None and start > QUIET_LOAD:
            lines += ["", f"**Not quiet**: the 1-minute load average was {start:.2f} at the start of the run (above "
                          f"{QUIET_LOAD}); other work shared the CPUs.  This run did not record the load per group."]
        return lines
    noisy = []
    lines += ["", "| group | ran | started | load average at start (1, 5, 15 min) | at end | |",
              "|---|---|---|---|---|---|"]
    for g in order:
        x = spans.get(g, {})
        load = one_minute_load(x.get("load_average_start"))
        flag = ""
        if load is not None and load > QUIET_LOAD:
            flag = "**not quiet**"
            noisy.append(f"{g} ({load:.2f})")
        lines.append(f"| {g} | {times(g)} | {str(x.get('started', '?'))[11:16]} "
                     f"| {recorded_load(x.get('load_average_start'))} | {recorded_load(x.get('load_average_end'))} "
                     f"| {flag} |")
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
                     f"{x.get('machine', '?')} | {recorded_load(x.get('load_start'))} | "
                     f"{recorded_load(x.get('load_end'))} | {cells} |")
    lines += ["", "Every cell names the run it comes from ([A], [B], ...).  A ratio is given only when both of its "
                  "cells come from the same run, and reads \"n/a (runs differ)\" otherwise; a target resting on "
                  "cells of different runs is n/a.  Cells of different runs can still be read as absolute "
                  "figures of their own run."]
    return lines


def _ranges(workloads: list[str]) -> list[str]:
    """Workload names with a mode's rows folded into one ("mtls-* (9 rows)")."""
    out: list[str] = []
    for mode, prefix in (("mtls", MTLS), ("cluster", CLUSTER), ("scale", SCALE)):
        ws = [w for w in workloads if mode_of(w) == mode]
        if len(ws) > 2:
            out.append(f"{prefix}* ({len(ws)} rows)")
            workloads = [w for w in workloads if w not in ws]
    return [w for w in workloads] + out
