"""The node-capacity groups in the report (benchmarks/capacity.py makes their records): a table of every
server's capacity with what it cost at that load, brain's ratios to etcd from the same run, every step of
every search, and a plot of p99 against the offered load.

A record is one server's search: ``capacity_nodes`` (the largest N that passed below the smallest that
failed), the figures of the step at capacity, and ``steps``, each with its own figures.  A search that
never failed says "at least"; one whose smallest step failed has no capacity.
"""

from __future__ import annotations

from pathlib import Path

WORKLOADS = ("node-capacity", "cluster-node-capacity")
SERVER_ORDER = ("brain", "brain-groups", "etcd-3.6", "etcd-3.7")
PEERS = ("etcd-3.6", "etcd-3.7")
# brain as two groups (benchmarks/servers.py BrainGroups) is compared with one brain of the same run.
GROUPS = "brain-groups"
SLO_MS = 1000.0
COLORS = {"brain": "#d62728", "brain-groups": "#ff7f0e", "etcd-3.6": "#1f77b4", "etcd-3.7": "#9467bd"}


def _num(x) -> str:
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def label(workload: str, server: str) -> str:
    """How the report names one search: the server, and "cluster" for the cluster group's."""
    return f"{server} cluster" if workload.startswith("cluster-") else server


def records(data: dict) -> list[tuple[str, str, dict]]:
    """(workload, server, record) of every search, the last record of each pair, in the table's order."""
    last: dict[tuple[str, str], dict] = {}
    for r in data.get("runs", []):
        if r["workload"] in WORKLOADS:
            last[(r["workload"], r["server"])] = r
    rank = {s: i for i, s in enumerate(SERVER_ORDER)}
    keys = sorted(last, key=lambda k: (WORKLOADS.index(k[0]), rank.get(k[1], len(rank)), k[1]))
    return [(w, s, last[(w, s)]) for w, s in keys]


def capacity_cell(res: dict) -> str:
    """The capacity as the table gives it: "at least" for a search that never failed, the first failure
    beside it otherwise."""
    cap = res.get("capacity_nodes") or 0
    if not cap:
        ff = res.get("first_fail_nodes")
        return "none" + (f" ({ff:,} failed)" if ff else "")
    if not res.get("bounded"):
        return f"≥ {cap:,} (no step failed)"
    return f"{cap:,} ({res['first_fail_nodes']:,} failed)"


def _ratio(b: dict, p: dict, key: str) -> str:
    """brain's figure (or brain-groups') over the peer's (or one brain's), from one run only; a capacity whose
    search never failed a step is a lower bound, so its ratio is one too ("≥", "≤")."""
    if (b.get("source") or "") != (p.get("source") or ""):
        return "n/a (runs differ)"
    rb, rp = b.get("result") or {}, p.get("result") or {}
    x, y = rb.get(key), rp.get(key)
    if not x or not y or not rb.get("capacity_nodes"):
        return "–"
    bound = ""
    if key == "capacity_nodes":
        if not rb.get("bounded") and not rp.get("bounded"):
            return "n/a (no step failed on either)"
        bound = "≥ " if not rb.get("bounded") else "≤ " if not rp.get("bounded") else ""
    return f"{bound}{x / y:.2f}"


def section(data: dict) -> list[str]:
    """The report's node-capacity section, [] when the run has no node-capacity record."""
    recs = records(data)
    if not recs:
        return []
    rule = (data.get("meta") or {}).get("capacity_rule")
    lines = ["## Node capacity", ""]
    if rule:
        lines += [rule[0].upper() + rule[1:] + ".", ""]
    lines += ["| server | capacity, nodes | ops/s at capacity (offered) | p99 ms at capacity (worst kind) "
              "| server CPU µs/op | brain committer µs/op | client CPU share | steps (s) | search ended |",
              "|---|---|---|---|---|---|---|---|---|"]
    for w, s, r in recs:
        res = r.get("result") or {}
        if not res.get("capacity_nodes"):
            cells = ["–"] * 5
        else:
            worst = f"{_num(res.get('worst_p99_ms'))} ({res.get('worst_kind')})"
            share = res.get("client_cpu_share")
            cells = [f"{_num(res.get('ops_per_s'))} ({_num(res.get('offered_per_s'))})",
                     f"{_num((res.get('latency_ms') or {}).get('p99'))}; {worst}",
                     _num(res.get("server_cpu_us_per_op")), _num(res.get("committer_us_per_op")),
                     "–" if share is None else f"{share:.0%}"]
        steps = res.get("steps") or []
        lines.append(f"| {label(w, s)} | {capacity_cell(res)} | " + " | ".join(cells)
                     + f" | {len(steps)} ({_num(res.get('steps_seconds'))}) | {res.get('stopped') or '–'} |")
    ratios = []
    for w in WORKLOADS:
        mine = {s: r for ww, s, r in recs if ww == w}
        if "brain" not in mine:
            continue
        for peer in (GROUPS, *PEERS):
            if peer in mine:
                b, p = (mine[GROUPS], mine["brain"]) if peer == GROUPS else (mine["brain"], mine[peer])
                name = f"{GROUPS} / brain" if peer == GROUPS else f"{label(w, 'brain')} / {label(w, peer)}"
                ratios.append(f"| {name} | {_ratio(b, p, 'capacity_nodes')} "
                              f"| {_ratio(b, p, 'ops_per_s')} | {_ratio(b, p, 'server_cpu_us_per_op')} |")
    if ratios:
        lines += ["", "brain's figures over etcd's, and brain as two groups over one brain (cells of one run "
                  "only; CPU per op: lower is better):", "",
                  "| ratio | capacity | ops/s at capacity | server CPU µs/op at capacity |", "|---|---|---|---|",
                  *ratios]
    for w, s, r in recs:
        res = r.get("result") or {}
        steps = res.get("steps") or []
        lines += ["", f"### {label(w, s)}: every step", "",
                  "| step | nodes | offered ops/s | achieved ops/s | p99 ms | worst kind p99 ms | failed ops "
                  "| schedule lag p99 ms | server CPU µs/op | committer µs/op | client CPU share "
                  "| load average at start | step s | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, x in enumerate(steps, 1):
            share = x.get("client_cpu_share")
            if x.get("error"):
                verdict = "error: " + " ".join(str(x["error"]).split())[:200].replace("|", "/")
            else:
                verdict = "pass" if x.get("pass") else "fail: " + "; ".join(x.get("fail_reasons") or [])
            lines.append(
                f"| {i} | {x['nodes']:,} | {_num(x.get('offered_per_s'))} | {_num(x.get('achieved_per_s'))} "
                f"| {_num(x.get('p99_ms'))} | {_num(x.get('worst_p99_ms'))} ({x.get('worst_kind') or '–'}) "
                f"| {x.get('failures') if x.get('failures') is not None else '–'} "
                f"| {_num(x.get('schedule_lag_p99_ms'))} | {_num(x.get('server_cpu_us_per_op'))} "
                f"| {_num(x.get('committer_us_per_op'))} | {'–' if share is None else f'{share:.0%}'} "
                f"| {x.get('load_average_start') or '–'} | {_num(x.get('step_seconds'))} | {verdict} |")
        if not r.get("ok") and r.get("error"):
            lines += ["", f"{label(w, s)}: {' '.join(str(r['error']).split())[:300]}"]
    return lines


def points(res: dict) -> list[tuple[float, float, bool]]:
    """(offered ops/s, worst kind's p99 ms, passed) of every step that measured, by offered load."""
    out = [(x["offered_per_s"], x["worst_p99_ms"], bool(x.get("pass"))) for x in res.get("steps") or []
           if not x.get("error") and x.get("offered_per_s") and x.get("worst_p99_ms") is not None]
    return sorted(out)


def plot(data: dict, out_dir: Path, base: str, plt) -> str | None:
    """p99 (of the slowest kind, what the SLO judges) against the offered load, one line per search
    (a cluster's dashed, with squares), filled where the step passed; the SLO's 1 s across.  The file
    name, or None without a search."""
    recs = [(w, s, r) for w, s, r in records(data) if points(r.get("result") or {})]
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = []
    for w, s, r in recs:
        pts = points(r.get("result") or {})
        xs += [p[0] for p in pts]
        style = "--" if w.startswith("cluster-") else "-"
        color = COLORS.get(s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=label(w, s))
        marker = "s" if w.startswith("cluster-") else "o"
        for x, y, ok in pts:
            ax.plot([x], [y], marker, color=color, markerfacecolor=color if ok else "white")
    ax.axhline(SLO_MS, color="black", linewidth=0.8, linestyle=":")
    ax.annotate("SLO: p99 1 s", (min(xs), SLO_MS), textcoords="offset points", xytext=(2, 3), fontsize=8)
    if max(xs) / max(min(xs), 1e-9) > 20:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load, ops/s (N/10 Lease updates and the pod and event writes)")
    ax.set_ylabel("p99 of the slowest kind, ms")
    ax.set_title("node capacity: p99 against offered load per step (hollow: the step failed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = f"{base}-node-capacity.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
