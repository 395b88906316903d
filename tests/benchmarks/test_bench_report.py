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
    runs += [_run("kine", "put-c64", 10), _run("brain", "list", None, ok=False)]
    runs += [_run("etcd-3.6", "list", 5.0)]
    agg = report.aggregate(_data(runs))
    assert agg["put-c64"]["brain"]["value"] == 200 and agg["put-c64"]["brain"]["n"] == 3
    assert report.ratio(agg, "put-c64", "etcd-3.6") == 2.0
    by_name = {t["target"]: t for t in report.targets(agg)}
    assert by_name["put-c64: brain/etcd-3.6 throughput"]["status"] == "pass"
    assert by_name["put-c64: brain/kine throughput"]["status"] == "pass"
    assert by_name["list: brain/etcd-3.6 throughput"]["status"] == "miss"  # brain failed
    assert by_name["put-c256: brain/etcd-3.6 throughput"]["status"] == "n/a"
    md = report.markdown(_data(runs), [])
    assert "| put-c64 | ops/s | 200 |" in md and "## Targets" in md


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
