"""The benchmark report's PNG plots (matplotlib, when it is installed): put's
throughput against its p99 latency, the node-capacity plot
(benchmarks/capacity_report.py) and one grid of bars per mode."""

from __future__ import annotations

from pathlib import Path

from benchmarks import capacity_report
from benchmarks.aggregation import aggregate, servers_in
from benchmarks.render import MODE_TITLES
from benchmarks.workloads import UNSUPPORTED, WORKLOADS, mode_of


COLORS = {"brain": "#d62728", "etcd-3.6": "#1f77b4", "etcd-3.6-fast": "#aec7e8", "etcd-3.7": "#9467bd",
          "etcd-3.7-fast": "#c5b0d5", "etcd-3.4": "#7f7f7f", "kine": "#2ca02c"}


def draw(data: dict, out_dir: Path, base: str) -> list[str]:
    """The plots of ``data`` written into ``out_dir`` as <base>-*.png; their file names ([] without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    agg = aggregate(data)
    servers = servers_in(data)
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

    name = capacity_report.plot(data, out_dir, base, plt)
    if name:
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
