"""The benchmark harness's parsers and report, on canned tool output (no servers)."""

from __future__ import annotations

import json
import statistics

from benchmarks import aggregation, judging, merging, readme, render, report
from benchmarks.tools import parse_benchmark, parse_check_perf
from benchmarks.workloads import WORKLOADS

BENCHMARK_OUT = """
Summary:
  Total:\t2.0000 secs.
  Slowest:\t0.0774 secs.
  Fastest:\t0.0071 secs.
  Average:\t0.0370 secs.
  Stddev:\t0.0116 secs.
  Requests/sec:\t1500.0000

Response time histogram:
  0.0071 [1]\t|
  0.0774 [32]\t|∎

Latency distribution:
  10% in 0.0228 secs.
  50% in 0.0366 secs.
  90% in 0.0513 secs.
  99% in 0.0681 secs.
  99.9% in 0.0736 secs.

Error distribution:
  [3]\trpc error: code = Unavailable desc = boom
"""


def test_parse_benchmark_summary():
    r = parse_benchmark(BENCHMARK_OUT)
    assert r["ops_per_s"] == 1500.0 and r["ops"] == 3000 and r["seconds"] == 2.0
    assert r["latency_ms"]["p50"] == 36.6 and r["latency_ms"]["p99"] == 68.1
    assert abs(r["latency_ms"]["max"] - 77.4) < 1e-9 and abs(r["latency_ms"]["mean"] - 37.0) < 1e-9
    assert r["errors"] == 3 and "Unavailable" in r["first_error"]


def test_parse_benchmark_all_failed():
    r = parse_benchmark("\nError distribution:\n  [10]\trpc error: code = Unimplemented desc = nope\n")
    assert r["ops"] == 0 and r["errors"] == 10 and "Unimplemented" in r["first_error"]


def test_parse_check_perf():
    ok = parse_check_perf(" 60 / 60 Booo 100.00% 1m0s\nPASS: Throughput is 151 writes/s\n"
                          "PASS: Slowest request took 0.200531s\nPASS: Stddev is 0.010000s\nPASS\n", 0)
    assert ok["pass"] and ok["writes_per_s"] == 151 and ok["slowest_s"] == 0.200531
    bad = parse_check_perf("FAIL: Throughput too low: 4000 writes/s\nSlowest request took too long: 1.500000s\n"
                           "PASS: Stddev is 0.050000s\nFAIL\n", 1)
    assert not bad["pass"] and bad["writes_per_s"] == 4000 and bad["slowest_s"] == 1.5


def _run(server, workload, value, rnd=1, ok=True, **extra):
    w = WORKLOADS[workload]
    result = {w.metric: value, "ops": 100, "latency_ms": {"p50": 1.0, "p99": 2.0}, **extra}
    return {"server": server, "workload": workload, "round": rnd, "ok": ok, "error": None if ok else "boom",
            "result": result if ok else {}, "cpu_s": 0.1, "cpu_us_per_op": 1000.0}


def _data(runs):
    return {"meta": {"started": "2026-01-01T00:00:00", "settings": {"rounds": 3, "name": "full"},
                     "machine": {"nproc": 2, "cpu": "x"}, "servers": {}, "tools": {}}, "runs": runs}


def test_medians_ratios_and_targets():
    runs = [_run("brain", "put-c64", v, i) for i, v in enumerate((300, 100, 200))]
    runs += [_run("etcd-3.6", "put-c64", v, i) for i, v in enumerate((100, 100, 50))]
    runs += [_run("kine", "put-c64", v, i) for i, v in enumerate((10, 10, 10))]
    runs += [_run("brain", "list", None, ok=False), _run("etcd-3.6", "list", 5.0)]
    agg = aggregation.aggregate(_data(runs))
    assert agg["put-c64"]["brain"]["value"] == 200 and agg["put-c64"]["brain"]["n"] == 3
    assert aggregation.ratio(agg, "put-c64", "etcd-3.6") == 2.0
    by_name = {t["target"]: t for t in judging.targets(agg)}
    assert by_name["put-c64: brain/etcd-3.6 throughput"]["status"] == "pass"
    assert by_name["put-c64: brain/kine throughput"]["status"] == "pass"
    assert by_name["list: brain/etcd-3.6 throughput"]["status"] == "miss"  # brain failed
    assert by_name["put-c256: brain/etcd-3.6 throughput"]["status"] == "n/a"
    md = render.markdown(_data(runs), [])
    assert "| put-c64 | ops/s | 3 | 200 (100-300, 3 runs) | 100 (50.0-100, 3 runs) |" in md and "## Targets" in md


def test_fewer_runs_than_planned_are_shown_and_met_targets_need_every_run():
    """kine crashed in one of three rounds: its median is of 2 runs, the cell says
    so, and a target resting on it is not called met; restart runs once by design."""
    runs = [_run("brain", "put-c256", v, i) for i, v in enumerate((300, 300, 300))]
    runs += [_run("kine", "put-c256", None, 1, ok=False)]
    runs += [_run("kine", "put-c256", v, i) for i, v in ((2, 20), (3, 20))]
    runs += [_run("brain", "restart", 3.0, ready_after_kill9_s=4.0, rss_after_load_kb=1024),
             _run("etcd-3.6", "restart", 4.0, ready_after_kill9_s=5.0, rss_after_load_kb=2048)]
    data = _data(runs)
    agg = aggregation.aggregate(data)
    assert (agg["put-c256"]["kine"]["n"], agg["put-c256"]["kine"]["planned"]) == (2, 3)
    assert aggregation.ratio(agg, "put-c256", "kine") == 15.0
    t = {x["target"]: x for x in judging.targets(agg)}["put-c256: brain/kine throughput"]
    assert t["status"] == "n/a" and "kine 2/3" in t["note"]
    md = render.markdown(data, [])
    assert "| put-c256 | ops/s | 3 | 300 (300-300, 3 runs) | – | 20.0 (20.0-20.0, 2/3 runs) |" in md
    assert "| rss | MiB (lower is better) | 1 | 1.00 (1 run) | 2.00 (1 run) |" in md


def test_all_runs_failed_is_an_error_cell():
    runs = [_run("brain", "count", 5.0, i) for i in range(3)]
    runs += [_run("kine", "count", None, i, ok=False) for i in range(3)]
    md = render.markdown(_data(runs), [])
    assert "| count | ops/s | 3 | 5.00 (5.00-5.00, 3 runs) | error (0/3) |" in md


def test_merge_replaces_the_rerun_workloads():
    base = _data([_run("brain", "put-c1", 10.0), _run("brain", "restart", 3.0, ready_after_kill9_s=3.0),
                  _run("kine", "restart", 8.0, ready_after_kill9_s=9.0), _run("brain", "count", 5.0)])
    rerun = _data([_run("brain", "restart", 7.0, ready_after_kill9_s=9.0)])
    rerun["meta"].update(started="2026-02-02T00:00:00", order_rule="rotating",
                         settings={"rounds": 3, "name": "full", "restart_tail": 5})
    merged = merging.merge(base, rerun, "rerun.json")
    got = {(r["workload"], r["result"].get("ready_after_s")) for r in merged["runs"]}
    assert ("restart", 7.0) in got and ("restart", 3.0) not in got
    assert ("restart", 8.0) in got  # kine was not re-run: its run stays
    assert {r["workload"] for r in merged["runs"]} == {"put-c1", "restart", "count"}
    assert merged["meta"]["merged"][0]["workloads"] == ["restart", "restart-kill9", "rss"]
    assert merged["meta"]["merged"][0]["servers"] == ["brain"]
    assert merged["meta"]["settings"]["restart_tail"] == 5
    md = render.markdown(merged, [])
    assert "**Re-measured** on 2026-02-02" in md and "rerun.json" in md
    assert "[B] 2026-02-02" in readme.readme_block(merged, "x.md")
    assert {r["source"] for r in merged["runs"]} == {"base.json", "rerun.json"}


def test_server_order_rotates_per_round_and_group():
    from benchmarks.groups import round_order
    from benchmarks.settings import FULL

    flavors = ["a", "b", "c", "d"]
    assert FULL.rounds == 3
    orders = [round_order(flavors, 1, r) for r in (1, 2, 3)]
    assert orders == [["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"]]
    assert round_order(flavors, 2, 1) == ["b", "c", "d", "a"]  # single-round groups do not all start with "a"


def test_readme_block_is_replaced_in_place(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# x\n\nintro\n")
    data = _data([_run("brain", "put-c1", 10.0), _run("etcd-3.6", "put-c1", 5.0)])
    readme.update_readme(path, readme.readme_block(data, "benchmarks/results/a.md"))
    first = path.read_text()
    assert first.startswith("# x\n\nintro\n") and first.count(readme.README_BEGIN) == 1
    path.write_text(first + "\n## after\n")
    readme.update_readme(path, readme.readme_block(data, "benchmarks/results/b.md"))
    second = path.read_text()
    assert second.count(readme.README_BEGIN) == 1 and "results/b.md" in second and "results/a.md" not in second
    assert second.endswith("## after\n")


def test_write_all_from_json(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_data([_run("brain", "put-c1", 10.0), _run("etcd-3.6", "put-c1", 5.0)])))
    report.write_all(path, tmp_path / "r.md")
    assert "put-c1" in (tmp_path / "r.md").read_text()


# ---------------------------------------------------------------------------
# A merged report compares cells of one run only
# ---------------------------------------------------------------------------


def _meta(started, cpu, load_start=None, load_end=None):
    machine = {"nproc": 2, "cpu": cpu}
    if load_start:
        machine.update(load_average_start=load_start, load_average_end=load_end)
    return {"started": started, "settings": {"rounds": 3, "name": "full"}, "machine": machine,
            "servers": {}, "tools": {}, "order_rule": "rotating"}


def _base_and_rerun():
    """A base run of brain, etcd-3.6 and kine; a re-run of brain and etcd-3.6 on another machine."""
    base = {"meta": _meta("2026-01-01T00:00:00", "AMD EPYC"),
            "runs": [_run(s, "put-c64", v, i) for s, v in (("brain", 100.0), ("etcd-3.6", 90.0), ("kine", 5.0))
                     for i in (1, 2, 3)]}
    rerun = {"meta": _meta("2026-02-02T00:00:00", "Intel Xeon", "0.15, 0.46, 0.98", "3.28, 1.82, 1.42"),
             "runs": [_run(s, "put-c64", v, i) for s, v in (("brain", 80.0), ("etcd-3.6", 40.0)) for i in (1, 2, 3)]}
    return merging.merge(base, rerun, "rerun.json", base_name="base.json")


def test_merged_ratio_is_given_only_for_cells_of_one_run():
    merged = _base_and_rerun()
    agg = aggregation.aggregate(merged)
    assert aggregation.ratio(agg, "put-c64", "etcd-3.6") == 2.0          # both from the re-run
    assert aggregation.ratio(agg, "put-c64", "kine") is None             # brain re-run, kine base: 16 across runs
    assert aggregation.compare(agg, "put-c64", "kine").why == "runs differ"
    md = render.markdown(merged, [])
    assert ("| put-c64 | ops/s | 3 | 80.0 (80.0-80.0, 3 runs) [B] | 40.0 (40.0-40.0, 3 runs) [B] "
            "| 5.00 (5.00-5.00, 3 runs) [A] | 2.00 | n/a (runs differ) |") in md
    # The target would pass (80 / 5 = 16 >= 10) if runs were mixed: it is n/a, and says why.
    t = {x["target"]: x for x in judging.targets(agg)}["put-c64: brain/kine throughput"]
    assert t["status"] == "n/a" and t["value"] is None
    assert "runs differ" in t["note"] and "rerun.json" in t["note"] and "base.json" in t["note"]


def test_merged_header_lists_every_runs_machine_and_load():
    md = render.markdown(_base_and_rerun(), [])
    assert "| A | `base.json` | 2026-01-01 00:00 | 2 CPUs AMD EPYC | not recorded | not recorded |" in md
    assert "| B | `rerun.json` | 2026-02-02 00:00 | 2 CPUs Intel Xeon | 0.15, 0.46, 0.98 | 3.28, 1.82, 1.42 |" in md
    assert "All servers of a row ran in the same run" not in md
    assert "only when both of its cells come from the same run" in md


def test_a_second_merge_keeps_the_sources_of_the_first():
    merged = _base_and_rerun()
    third = {"meta": _meta("2026-03-03T00:00:00", "Intel Xeon", "1.00, 1.00, 1.00", "2.00, 2.00, 2.00"),
             "runs": [_run("kine", "put-c64", 8.0, i) for i in (1, 2, 3)]}
    merged = merging.merge(merged, third, "third.json", base_name="ignored.json")
    assert {r["source"] for r in merged["runs"]} == {"rerun.json", "third.json"}  # kine's base runs replaced
    assert [x["file"] for x in merged["meta"]["sources"]] == ["base.json", "rerun.json", "third.json"]
    assert aggregation.ratio(aggregation.aggregate(merged), "put-c64", "kine") is None


def test_a_single_run_report_has_no_run_marks():
    runs = [_run(s, "put-c64", v, i) for s, v in (("brain", 10.0), ("kine", 1.0)) for i in (1, 2, 3)]
    md = render.markdown(_data(runs), [])
    assert "| put-c64 | ops/s | 3 | 10.0 (10.0-10.0, 3 runs) | 1.00 (1.00-1.00, 3 runs) | 10.00 |" in md and "[A]" not in md


# ---------------------------------------------------------------------------
# Mutual TLS: etcd at its best (the better of its two listener configurations)
# ---------------------------------------------------------------------------


def _mtls_runs(fast: bool):
    runs = [_run("brain", "mtls-put-c64", 7000.0, i) for i in (1, 2, 3)]
    runs += [_run("etcd-3.6", "mtls-put-c64", 3000.0, i) for i in (1, 2, 3)]
    if fast:
        runs += [dict(_run("etcd-3.6-fast", "mtls-put-c64", 6000.0, i), cpu_us_per_op=500.0) for i in (1, 2, 3)]
    return runs


def test_mtls_target_is_judged_against_the_faster_etcd_configuration():
    agg = aggregation.aggregate(_data(_mtls_runs(fast=True)))
    r = aggregation.compare(agg, "mtls-put-c64", "etcd-3.6")
    assert r.peer == "etcd-3.6-fast" and abs(r.value - 7000 / 6000) < 1e-9 and not r.default_only
    by_name = {t["target"]: t for t in judging.targets(agg)}
    assert by_name["mtls-put-c64: brain/etcd-3.6 throughput"]["status"] == "miss"   # 1.17 < 1.5
    cpu = by_name["mtls-put-c64: brain/etcd-3.6 server CPU per op"]
    assert cpu["value"] == 2.0 and cpu["status"] == "miss"  # brain 1000 µs/op against the fast config's 500
    md = render.markdown(_data(_mtls_runs(fast=True)), [])
    assert ("| mtls-put-c64 | ops/s | 3 | 7,000 (7,000-7,000, 3 runs) | 3,000 (3,000-3,000, 3 runs) "
            "| 6,000 (6,000-6,000, 3 runs) | 1.17 |") in md   # both cells shown


def test_mtls_target_without_the_fast_configuration_is_not_called_met():
    agg = aggregation.aggregate(_data(_mtls_runs(fast=False)))
    r = aggregation.compare(agg, "mtls-put-c64", "etcd-3.6")
    assert r.default_only and abs(r.value - 7000 / 3000) < 1e-9
    t = {x["target"]: x for x in judging.targets(agg)}["mtls-put-c64: brain/etcd-3.6 throughput"]
    assert t["status"] == "n/a" and "etcd-3.6-fast" in t["note"]
    assert "2.33 (default only)" in render.markdown(_data(_mtls_runs(fast=False)), [])


def test_plaintext_rows_do_not_use_the_fast_configuration():
    runs = [_run("brain", "put-c64", 100.0), _run("etcd-3.6", "put-c64", 50.0),
            _run("etcd-3.6-fast", "put-c64", 200.0)]
    assert aggregation.ratio(aggregation.aggregate(_data(runs)), "put-c64", "etcd-3.6") == 2.0


# ---------------------------------------------------------------------------
# Restart: samples, their median and worst; the target on the worst
# ---------------------------------------------------------------------------


def _restart(server, sigterm, kill9):
    return _run(server, "restart", statistics.median(sigterm), ready_after_s_samples=sigterm,
                ready_after_kill9_s=statistics.median(kill9), ready_after_kill9_s_samples=kill9,
                cpu_to_ready_s_samples=[1.5] * len(sigterm), rss_after_load_kb=1024)


def _restart_targets(runs):
    tg = {t["target"]: t for t in judging.targets(aggregation.aggregate(_data(runs)))}
    return (tg["restart (SIGTERM) with 1,000,000 keys: brain seconds, worst sample"],
            tg["restart (kill -9) with 1,000,000 keys: brain seconds, worst sample"])


def test_restart_row_gives_median_and_worst_and_the_target_takes_the_worst():
    runs = [_restart("brain", [6.0, 6.5, 7.0], [7.2, 25.6, 7.0]),
            _restart("etcd-3.6", [5.0, 5.5, 6.0], [6.4, 6.5, 6.6])]
    agg = aggregation.aggregate(_data(runs))
    cell = agg["restart-kill9"]["brain"]
    assert cell["value"] == 7.2 and cell["worst"] == 25.6 and cell["samples"] == [7.2, 25.6, 7.0]
    sigterm, kill9 = _restart_targets(runs)
    assert sigterm["status"] == "pass" and sigterm["value"] == 7.0
    assert kill9["status"] == "miss" and kill9["value"] == 25.6   # the median (7.2) would have passed
    md = render.markdown(_data(runs), [])
    assert ("| restart-kill9 | s (lower is better) | 1 | 7.20 (7.00-25.6, 3 samples) "
            "| 6.50 (6.40-6.60, 3 samples) |") in md
    assert "cpu_to_ready_s_samples 1.50, 1.50, 1.50" in md


def test_restart_target_on_fewer_samples_is_not_called_met():
    # A run from before samples were taken: one start, under the goal, is not enough ...
    sigterm, kill9 = _restart_targets([_run("brain", "restart", 3.0, ready_after_kill9_s=4.0)])
    assert sigterm["status"] == kill9["status"] == "n/a" and "1 sample, 3 needed" in kill9["note"]
    # ... but one start over the goal is a miss.
    _, kill9 = _restart_targets([_run("brain", "restart", 3.0, ready_after_kill9_s=12.0)])
    assert kill9["status"] == "miss"
    md = render.markdown(_data([_run("brain", "restart", 3.0, ready_after_kill9_s=4.0)]), [])
    assert "| restart | s (lower is better) | 1 | 3.00 (1 sample) |" in md


def test_summarise_restart_keeps_every_sample_and_its_cpu_time():
    from benchmarks.groups import summarise_restart

    out: dict = {}
    sigterm = [{"ready_after_s": t, "cpu_to_ready_s": c, "stop_seconds": 1.0} for t, c in ((6.0, 4.0), (9.0, 4.5),
                                                                                            (7.0, 4.2))]
    kill9 = [{"ready_after_kill9_s": t, "cpu_to_ready_kill9_s": 5.0, "tail_writes": w, "journal_tail_bytes": j,
              "checkpoints_during_tail": 0} for t, w, j in ((7.0, 500, 10), (8.0, 499, 12), (30.0, 500, 11))]
    summarise_restart(out, sigterm, kill9)
    assert out["ready_after_s_samples"] == [6.0, 9.0, 7.0] and out["ready_after_s"] == 7.0
    assert out["ready_after_s_worst"] == 9.0 and out["cpu_to_ready_s_samples"] == [4.0, 4.5, 4.2]
    assert out["ready_after_kill9_s"] == 8.0 and out["ready_after_kill9_s_worst"] == 30.0
    assert out["cpu_to_ready_kill9_s_samples"] == [5.0, 5.0, 5.0]
    assert out["tail_writes"] == 499 and out["journal_tail_bytes"] == 10 and out["checkpoints_during_tail"] == 0


def _scale_data(runs, scale_keys):
    data = _data(runs)
    data["meta"]["settings"]["scale_keys"] = scale_keys
    return data


def _unsupported(server, workload):
    return {"server": server, "workload": workload, "round": 1, "ok": True, "error": None, "cpu_s": None,
            "cpu_us_per_op": None, "result": {"unsupported": True, "detail": "code = Unimplemented desc = nope"}}


def test_an_unsupported_rpc_is_its_own_cell_and_no_ratio():
    runs = [_unsupported("brain", "scale-stream"), _unsupported("etcd-3.6", "scale-stream"),
            _run("etcd-3.7", "scale-stream", 90_000.0)]
    data = _scale_data(runs, 1_000_000)
    agg = aggregation.aggregate(data)
    assert agg["scale-stream"]["brain"]["value"] is None and aggregation.ratio(agg, "scale-stream", "etcd-3.7") is None
    md = render.markdown(data, [])
    assert "| scale-stream | keys/s | 1 | unsupported | unsupported | 90,000 (1 run) | – | – |" in md
    [t] = [t for t in judging.targets(agg) if t["target"].startswith("scale-stream")]
    assert t["status"] == "n/a" and t["issue"] == "17"


def _scale_restart_target(runs, scale_keys, which="scale-restart-kill9"):
    for r in runs:
        r["workload"] = "scale-restart"
    tg = judging.targets(aggregation.aggregate(_scale_data(runs, scale_keys)), {"scale_keys": scale_keys})
    return next(t for t in tg if t["target"].startswith(which + " "))


def test_a_target_asked_at_ten_million_keys_is_not_judged_on_a_smaller_run():
    runs = [_restart("brain", [6.0] * 3, [7.0] * 3), _restart("etcd-3.6", [9.0] * 3, [9.0] * 3)]
    small = _scale_restart_target(runs, 1_000_000)
    assert small["status"] == "n/a" and small["value"] is None
    assert "asked at 10,000,000 keys" in small["note"] and "0.778" in small["note"]
    big = _scale_restart_target(runs, 10_000_000)
    assert big["status"] == "pass" and abs(big["value"] - 7.0 / 9.0) < 1e-9


def test_scale_restart_takes_brains_worst_start_against_etcds_median():
    """One slow start of brain's counts against it; one slow start of etcd's does not help it."""
    runs = [_restart("brain", [50.0, 52.0, 60.0], [50.0, 51.0, 52.0]),
            _restart("etcd-3.6", [55.0, 58.0, 90.0], [40.0, 72.0, 73.0])]
    sigterm = _scale_restart_target(runs, 10_000_000, "scale-restart")
    assert sigterm["status"] == "miss" and abs(sigterm["value"] - 60.0 / 58.0) < 1e-9  # worst/worst: 0.67
    assert "brain's worst 60.0 s of 3, etcd-3.6's median 58.0 s of 3" in sigterm["note"]
    kill9 = _scale_restart_target(runs, 10_000_000)
    assert kill9["status"] == "pass" and abs(kill9["value"] - 52.0 / 72.0) < 1e-9


def test_every_restart_target_needs_three_starts_of_each_server_it_names():
    # brain's worst over etcd's median would miss, but etcd's median of one start may move either way.
    runs = [_restart("brain", [60.0] * 3, [60.0] * 3), _restart("etcd-3.6", [50.0], [50.0])]
    t = _scale_restart_target(runs, 10_000_000)
    assert t["status"] == "n/a" and "etcd-3.6 1 sample, 3 needed" in t["note"]
    runs = [_restart("brain", [40.0], [40.0]), _restart("etcd-3.6", [50.0] * 3, [50.0] * 3)]
    t = _scale_restart_target(runs, 10_000_000)
    assert t["status"] == "n/a" and "brain 1 sample, 3 needed" in t["note"]


def _failover(server, rnd, **pauses):
    kills = [{"fault": f, "member": "m", "t_unix": 0.0, "leader_after_s": None, "write_pause_s": x}
             for f, xs in pauses.items() for x in xs]
    lists = {f"{f}_pauses_s": xs for f, xs in pauses.items()}
    return {"server": server, "workload": "cluster-failover", "round": rnd, "ok": True, "error": None,
            "result": {"kills": kills, "lost": 0, "ops": len(kills), **lists}, "cpu_s": None}


def test_fault_rows_give_p99_p50_max_and_samples_beside_etcd():
    runs = [_failover("brain", 1, isolate=[0.5], nats_restart=[0.2, 0.3], nats_excess=[0.05, 0.25]),
            _failover("brain", 2, isolate=[0.9], nats_restart=[0.1, 0.2]),
            _failover("brain", 3, isolate=[0.7], nats_restart=[0.4, 0.6])]
    runs += [_failover("etcd-3.6", i, isolate=[x]) for i, x in enumerate((1.2, 1.4, 1.3), 1)]
    agg = aggregation.aggregate(_data(runs))
    iso = agg["cluster-pause-isolate"]
    assert iso["brain"]["value"] == 0.9 and iso["brain"]["p50"] == 0.7 and iso["brain"]["max"] == 0.9
    assert iso["etcd-3.6"]["samples"] == [1.2, 1.4, 1.3]
    assert agg["cluster-pause-nats-roll"]["etcd-3.6"]["value"] is None  # no such fault on etcd: no figure
    assert agg["cluster-pause-nats-excess"]["brain"]["value"] == 0.25
    [t] = [t for t in judging.targets(agg) if "beyond NATS's own election" in t["target"]]
    assert t["issue"] == "18" and t["status"] == "pass"
    md = render.markdown(_data(runs), [])
    assert ("| cluster-pause-isolate | s (p99 of isolations) (lower is better) | 3 | 0.900 (p50 0.700, "
            "0.500-0.900, 3 samples) | 1.40 (p50 1.30, 1.20-1.40, 3 samples) |") in md
    # p50 by nearest rank too: the 3rd of 6 (0.1 0.2 0.2 0.3 0.4 0.6), not the mean of the middle two
    assert agg["cluster-pause-nats-roll"]["brain"]["p50"] == 0.2
    assert "| cluster-pause-nats-roll | s (p99 of restarts) (lower is better) | 3 | 0.600 (p50 0.200, 0.100-0.600, " \
           "6 samples) | – |" in md


def test_read_confirmation_table_sets_lease_off_beside_lease_on_and_etcd():
    runs = [_run("brain", "cluster-range-l-c64", 4000.0), _run("brain", "cluster-range-l-barrier-c64", 1000.0),
            _run("etcd-3.6", "cluster-range-l-c64", 5000.0)]
    data = _data(runs)
    data["meta"]["brain_serve_defaults"] = {"read_lease": True, "election_timeout_ms": 500,
                                            "heartbeat_interval_ms": 100}
    md = render.markdown(data, [])
    assert ("| 64 | 4,000/s, p99 2.00 ms (default) | 1,000/s, p99 2.00 ms (--read-lease=false) | 5,000/s, p99 "
            "2.00 ms | 0.250 | 0.200 | 0.800 |") in md
    assert "(brain at `brain serve`'s default: read lease on)" in md  # the default rows say which it was
    assert render.read_confirmation_table(aggregation.aggregate(_data(runs[:1]))) == []


def test_with_the_lease_off_by_default_the_lease_on_rows_are_the_labelled_second_ones():
    runs = [_run("brain", "cluster-range-l-c64", 1000.0), _run("brain", "cluster-range-l-lease-c64", 4000.0),
            _run("etcd-3.6", "cluster-range-l-c64", 5000.0)]
    data = _data(runs)
    data["meta"]["brain_serve_defaults"] = {"read_lease": False, "election_timeout_ms": 500,
                                            "heartbeat_interval_ms": 100}
    md = render.markdown(data, [])
    assert ("| 64 | 4,000/s, p99 2.00 ms (--read-lease=true) | 1,000/s, p99 2.00 ms (default) | 5,000/s, p99 "
            "2.00 ms | 0.250 | 0.200 | 0.800 |") in md
    assert "(brain at `brain serve`'s default: read lease off)" in md


def test_cluster_groups_follow_brains_defaults_and_skip_the_one_that_repeats_them():
    from benchmarks.cluster_groups import CLUSTER_GROUPS, ETCD_TIMEOUTS, redundant
    from benchmarks.groups import servers_for

    class C:
        def __init__(self, name):
            self.name = name
    clusters = [C("etcd-3.6"), C("brain")]
    lease_on = {"read_lease": True, "election_timeout_ms": 500, "heartbeat_interval_ms": 100}
    lease_off = dict(lease_on, read_lease=False)

    def names(group, defaults):
        return [c.name for c in servers_for(group, [], clusters, defaults)]
    assert names("cluster-load", lease_on) == ["etcd-3.6", "brain"]
    assert names("cluster-read-barrier", lease_on) == ["brain"] and names("cluster-read-lease", lease_on) == []
    assert names("cluster-read-barrier", lease_off) == [] and names("cluster-read-lease", lease_off) == ["brain"]
    assert "cluster-load measured its rows" in redundant("cluster-read-lease", lease_on)
    # Failover: both clusters at etcd's election timing; brain's defaults as a group of brain's own.
    assert CLUSTER_GROUPS["cluster-failover"].member_args("brain") == ETCD_TIMEOUTS
    assert CLUSTER_GROUPS["cluster-failover"].member_args("etcd-3.6") == ETCD_TIMEOUTS
    assert ETCD_TIMEOUTS == ("--election-timeout", "1000", "--heartbeat-interval", "100")
    assert names("cluster-failover-brain-defaults", lease_on) == ["brain"]
    assert CLUSTER_GROUPS["cluster-failover-brain-defaults"].member_args("brain") == ()
    assert names("cluster-failover-brain-defaults", dict(lease_on, election_timeout_ms=1000)) == []


def test_brains_leader_kill_is_judged_at_its_default_timeout_beside_both_at_etcds():
    runs = [_failover("brain", 1, leader=[1.1, 1.2, 1.15]), _failover("etcd-3.6", 1, leader=[1.3, 1.5, 1.4])]
    runs += [dict(_failover("brain", 1, leader=[0.5, 0.7, 0.6]), workload="cluster-failover-brain-defaults")]
    data = _data(runs)
    data["meta"]["settings"]["rounds"] = 1
    agg = aggregation.aggregate(data)
    assert agg["cluster-pause-leader-brain-defaults"]["brain"]["value"] == 0.7
    t = next(t for t in judging.targets(agg) if t["issue"] == "18" and "brain's leader" in t["target"])
    assert t["status"] == "pass" and t["value"] == 0.7
    assert "both at etcd's election timeout (cluster-pause-leader): brain 1.20 s, etcd 3.6 1.50 s" in t["note"]
    assert aggregation.ratio(agg, "cluster-pause-leader", "etcd-3.6") == 1.2 / 1.5  # the servers at equal settings


# ---------------------------------------------------------------------------
# The header: how often each group ran, and the machine's load at each group's start
# ---------------------------------------------------------------------------


def test_header_says_per_group_how_often_it_ran_and_warns_of_a_group_started_on_a_busy_machine():
    runs = [_run(s, "put-c64", 100.0, i) for s in ("brain", "etcd-3.6") for i in (1, 2, 3)]
    runs += [_failover(s, 1, leader=[0.5]) for s in ("brain", "etcd-3.6")]
    data = _data(runs)  # settings say 3 rounds; the cluster group ran once
    data["meta"]["group_runs"] = [
        {"group": "put", "rounds": 3, "started": "2026-01-01T00:00:00", "load_average_start": "0.15, 0.20, 0.30",
         "load_average_end": "1.10, 0.50, 0.40"},
        {"group": "cluster-failover", "rounds": 3, "started": "2026-01-01T00:05:00",
         "load_average_start": "1.97, 1.20, 0.90", "load_average_end": "2.50, 1.50, 1.00"}]
    md = render.markdown(data, [])
    assert "time(s)" not in md
    assert "| put | 3 times | 00:00 | 0.15, 0.20, 0.30 | 1.10, 0.50, 0.40 |  |" in md
    assert "| cluster-failover | once | 00:05 | 1.97, 1.20, 0.90 | 2.50, 1.50, 1.00 | **not quiet** |" in md
    assert "**Not quiet**: 1 of 2 groups started with a 1-minute load average above 0.5: cluster-failover (1.97)" in md
    assert "**Not quiet**: cluster-failover (1.97) started" in readme.readme_block(data, "x.md")


def test_a_group_its_servers_ran_a_different_number_of_times_says_so_per_server():
    runs = [_run("brain", "list", 2.0, i) for i in (1, 2, 3)] + [_run("kine", "list", 0.1, 1)]
    md = render.markdown(_data(runs), [])
    assert "list brain 3, kine 1" in md


def test_a_run_without_per_group_loads_is_judged_by_its_start():
    data = _data([_run("brain", "put-c64", 100.0)])
    data["meta"]["machine"]["load_average_start"] = "1.44, 1.00, 0.80"
    md = render.markdown(data, [])
    assert "**Not quiet**: the 1-minute load average was 1.44 at the start of the run" in md
    data["meta"]["machine"]["load_average_start"] = "0.20, 1.00, 0.80"
    assert "Not quiet" not in render.markdown(data, [])


def test_scale_group_runs_the_rounds_asked_for_and_the_other_once_groups_once():
    """--scale-rounds repeats the scale group (its restart rows pool every round's starts);
    restart and node capacity stay at one run whatever the rounds."""
    from benchmarks.workloads import group_rounds
    assert group_rounds("scale", 3) == 1
    assert group_rounds("scale", 3, scale_rounds=3) == 3
    assert group_rounds("restart", 3, scale_rounds=3) == 1
    assert group_rounds("put", 3, scale_rounds=1) == 3
    settings = {"rounds": 3, "scale_rounds": 3}
    assert aggregation.planned_runs("scale-load", settings) == 3
    assert aggregation.planned_runs("scale-restart", settings) == 3
    assert aggregation.planned_runs("scale-load", {"rounds": 3}) == 1
    assert aggregation.planned_runs("restart", settings) == 1
