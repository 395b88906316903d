"""The benchmark harness's parsers and report, on canned tool output (no servers)."""

from __future__ import annotations

import json

from benchmarks import report
from benchmarks.run import parse_benchmark, parse_check_perf

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
    w = report.WORKLOADS[workload]
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
    agg = report.aggregate(_data(runs))
    assert agg["put-c64"]["brain"]["value"] == 200 and agg["put-c64"]["brain"]["n"] == 3
    assert report.ratio(agg, "put-c64", "etcd-3.6") == 2.0
    by_name = {t["target"]: t for t in report.targets(agg)}
    assert by_name["put-c64: brain/etcd-3.6 throughput"]["status"] == "pass"
    assert by_name["put-c64: brain/kine throughput"]["status"] == "pass"
    assert by_name["list: brain/etcd-3.6 throughput"]["status"] == "miss"  # brain failed
    assert by_name["put-c256: brain/etcd-3.6 throughput"]["status"] == "n/a"
    md = report.markdown(_data(runs), [])
    assert "| put-c64 | ops/s | 3 | 200 |" in md and "## Targets" in md


def test_fewer_runs_than_planned_are_shown_and_met_targets_need_every_run():
    """kine crashed in one of three rounds: its median is of 2 runs, the cell says
    so, and a target resting on it is not called met; restart runs once by design."""
    runs = [_run("brain", "put-c256", v, i) for i, v in enumerate((300, 300, 300))]
    runs += [_run("kine", "put-c256", None, 1, ok=False)]
    runs += [_run("kine", "put-c256", v, i) for i, v in ((2, 20), (3, 20))]
    runs += [_run("brain", "restart", 3.0, ready_after_kill9_s=4.0, rss_after_load_kb=1024),
             _run("etcd-3.6", "restart", 4.0, ready_after_kill9_s=5.0, rss_after_load_kb=2048)]
    data = _data(runs)
    agg = report.aggregate(data)
    assert (agg["put-c256"]["kine"]["n"], agg["put-c256"]["kine"]["planned"]) == (2, 3)
    assert report.ratio(agg, "put-c256", "kine") == 15.0
    t = {x["target"]: x for x in report.targets(agg)}["put-c256: brain/kine throughput"]
    assert t["status"] == "n/a" and "kine 2/3" in t["note"]
    md = report.markdown(data, [])
    assert "| put-c256 | ops/s | 3 | 300 | – | 20.0 (2/3) |" in md
    assert "| restart | s (lower is better) | 1 | 3.00 | 4.00 | – | 0.75 |" in md
    assert "| restart-kill9 | s (lower is better) | 1 | 4.00 | 5.00 |" in md
    assert "| rss | MiB (lower is better) | 1 | 1.00 | 2.00 |" in md
    restart = {x["target"]: x for x in report.targets(agg)}["restart (kill -9) with 1,000,000 keys: brain seconds"]
    assert restart["status"] == "pass"  # one run planned, one run made


def test_all_runs_failed_is_an_error_cell():
    runs = [_run("brain", "count", 5.0, i) for i in range(3)]
    runs += [_run("kine", "count", None, i, ok=False) for i in range(3)]
    md = report.markdown(_data(runs), [])
    assert "| count | ops/s | 3 | 5.00 | error (0/3) |" in md


def test_merge_replaces_the_rerun_workloads():
    base = _data([_run("brain", "put-c1", 10.0), _run("brain", "restart", 3.0, ready_after_kill9_s=3.0),
                  _run("kine", "restart", 8.0, ready_after_kill9_s=9.0), _run("brain", "count", 5.0)])
    rerun = _data([_run("brain", "restart", 7.0, ready_after_kill9_s=9.0)])
    rerun["meta"].update(started="2026-02-02T00:00:00", order_rule="rotating",
                         settings={"rounds": 3, "name": "full", "restart_tail": 5})
    merged = report.merge(base, rerun, "rerun.json")
    got = {(r["workload"], r["result"].get("ready_after_s")) for r in merged["runs"]}
    assert ("restart", 7.0) in got and ("restart", 3.0) not in got
    assert ("restart", 8.0) in got  # kine was not re-run: its run stays
    assert {r["workload"] for r in merged["runs"]} == {"put-c1", "restart", "count"}
    assert merged["meta"]["merged"][0]["workloads"] == ["restart", "restart-kill9", "rss"]
    assert merged["meta"]["merged"][0]["servers"] == ["brain"]
    assert merged["meta"]["settings"]["restart_tail"] == 5
    md = report.markdown(merged, [])
    assert "**Re-measured** on 2026-02-02" in md and "rerun.json" in md
    assert "re-measured 2026-02-02" in report.readme_block(merged, "x.md")


def test_server_order_rotates_per_round_and_group():
    from benchmarks.run import FULL, Bench

    bench = Bench.__new__(Bench)
    bench.flavors = ["a", "b", "c", "d"]
    assert FULL.rounds == 3
    orders = [bench.round_order(1, r) for r in (1, 2, 3)]
    assert orders == [["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"]]
    assert bench.round_order(2, 1) == ["b", "c", "d", "a"]  # single-round groups do not all start with "a"


def test_readme_block_is_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nintro\n")
    data = _data([_run("brain", "put-c1", 10.0), _run("etcd-3.6", "put-c1", 5.0)])
    report.update_readme(readme, report.readme_block(data, "benchmarks/results/a.md"))
    first = readme.read_text()
    assert first.startswith("# x\n\nintro\n") and first.count(report.README_BEGIN) == 1
    readme.write_text(first + "\n## after\n")
    report.update_readme(readme, report.readme_block(data, "benchmarks/results/b.md"))
    second = readme.read_text()
    assert second.count(report.README_BEGIN) == 1 and "results/b.md" in second and "results/a.md" not in second
    assert second.endswith("## after\n")


def test_write_all_from_json(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_data([_run("brain", "put-c1", 10.0), _run("etcd-3.6", "put-c1", 5.0)])))
    report.write_all(path, tmp_path / "r.md")
    assert "put-c1" in (tmp_path / "r.md").read_text()
