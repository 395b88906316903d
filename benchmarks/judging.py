"""The targets of benchmarks/targets.py judged on a run's cells: met, missed or
n/a, with a note saying why (the rules: ``targets``' docstring)."""

from __future__ import annotations

from benchmarks.aggregation import FAST_CONFIG, compare, restart_ratio, same_run, short_of_runs, too_few_starts
from benchmarks.formatting import fmt, oneline
from benchmarks.settings import FULL
from benchmarks.targets import ISSUES, TARGETS, Target, met
from benchmarks.workloads import WORKLOADS, mode_of


def _extra(agg, w, s, k):
    return ((agg.get(w, {}).get(s) or {}).get("extra") or {}).get(k)


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
            status, note = "miss", "brain failed: " + oneline(b["error"], 160)
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
    pnote = f"partial load: {oneline(partial, 160)}" if partial else ""

    def judge(spec: Target) -> None:
        w, peer = spec.workload, spec.peer
        name = spec.name.format(workload=w, peer=peer, versus=spec.versus, keys=keys,
                                scale_keys=f"{scale_keys:,} keys")
        if spec.at_keys > scale_keys:
            r = restart_ratio(agg, w, peer) if spec.kind == "restart-ratio" else compare(agg, w, peer, spec.key)
            add(name, None, False, spec.goal, w, f"asked at {spec.at_keys:,} keys (this run: brain/{peer} "
                f"{fmt(r.value)})", peer=peer)
        elif spec.kind == "ratio":
            add_ratio(name, w, peer, spec.goal, spec.key)
        elif spec.kind == "restart":
            c = agg.get(w, {}).get("brain") or {}
            v, n = c.get("worst"), len(c.get("samples") or [])
            note = pnote or (f"worst of {n}, median {fmt(c.get('value'))}" if v is not None else "")
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
                note = (f"brain's worst {fmt(b.get('worst'))} s of {len(b.get('samples') or [])}, {peer}'s median "
                        f"{fmt(p.get('value'))} s of {len(p.get('samples') or [])}")
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
            note = f"{n} fault{'s' if n != 1 else ''}, p50 {fmt(c.get('p50'))}" if v is not None else ""
            same = spec.versus or w  # the row where brain and the peer ran at the same settings
            e = (agg.get(same, {}).get(peer) or {}).get("value") if peer else None
            if spec.versus:
                vb = (agg.get(same, {}).get("brain") or {})
                if vb.get("value") is not None or e is not None:
                    note += (f"; both at etcd's election timeout ({same}): brain {fmt(vb.get('value'))} s, "
                             f"{peer.replace('-', ' ')} {fmt(e)} s")
            elif e is not None:
                note += f"; {peer.replace('-', ' ')}: {fmt(e)} s"
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
