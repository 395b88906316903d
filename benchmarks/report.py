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

The steps, a module each: benchmarks/aggregation.py (the cells and ratios),
judging.py (the targets), provenance.py (the header), render.py (the
markdown), plots.py (the PNGs), readme.py (the README's block) and
merging.py (--merge).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import plots
from benchmarks.merging import merge
from benchmarks.readme import readme_block, update_readme
from benchmarks.render import markdown


def write_all(json_path: Path, md_path: Path, readme: bool = False) -> None:
    data = json.loads(Path(json_path).read_text())
    base = Path(md_path).stem
    made = plots.draw(data, Path(md_path).parent, base)
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
