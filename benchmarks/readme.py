"""The benchmark block of the repository's README: the summary tables and each
issue's tally of targets, between README_BEGIN and README_END, which
``update_readme`` replaces (or appends)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.aggregation import aggregate
from benchmarks.judging import targets
from benchmarks.provenance import QUIET_LOAD, one_minute_load, recorded_load, run_labels
from benchmarks.render import summary_tables
from benchmarks.targets import ISSUES


README_BEGIN = "<!-- bench:begin -->"


README_END = "<!-- bench:end -->"


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
                load = (f"load average {recorded_load(x.get('load_start'))} at the start, "
                        f"{recorded_load(x.get('load_end'))} at the end" if x.get("load_start") or x.get("load_end")
                        else "load average not recorded")
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
    noisy = [f"{x['group']} ({one_minute_load(x.get('load_average_start')):.2f})" for x in m.get("group_runs") or []
             if (one_minute_load(x.get("load_average_start")) or 0) > QUIET_LOAD]
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


def update_readme(readme: Path, block: str) -> None:
    text = readme.read_text() if readme.exists() else ""
    if README_BEGIN in text and README_END in text:
        pre, rest = text.split(README_BEGIN, 1)
        _, post = rest.split(README_END, 1)
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)
