"""A benchmark JSON with a re-run's records merged in: the (server, workload)
pairs the re-run measured come from it, and every record keeps the file it
came from ("source"), so the report compares cells of one run only."""

from __future__ import annotations

import json

from benchmarks.aggregation import SERVERS
from benchmarks.workloads import WORKLOADS, mode_of


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
