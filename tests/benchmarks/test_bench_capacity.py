"""The node-capacity groups' search, step figures and report (benchmarks/capacity.py,
benchmarks/capacity_report.py), on canned steps (no servers), and the per-thread CPU reading."""

from __future__ import annotations

import copy
import os
import threading
import time

from benchmarks import aggregation, capacity_report, render
from benchmarks.capacity import Search, step_figures, step_line, summarise
from benchmarks.servers import thread_cpu_seconds
from tests.support.servers import unavailable
from brain.thread_names import name_os_thread


def _search_against(threshold: int, **kw) -> Search:
    """A search run against a server that passes every step of at most ``threshold`` nodes."""
    s = Search(**kw)
    while (n := s.next()) is not None:
        s.add(n, n <= threshold)
    return s


def test_the_ramp_doubles_until_a_failure_then_bisects_to_the_resolution():
    s = _search_against(37_000, start=10_000)
    assert [n for n, _ in s.tried] == [10_000, 20_000, 40_000, 30_000, 35_000, 37_500, 36_200]
    assert s.last_pass == 36_200 and s.first_fail == 37_500
    assert (s.first_fail - s.last_pass) <= 0.05 * s.last_pass
    assert s.stopped.startswith("bisected")


def test_a_first_step_that_fails_ramps_down_then_bisects():
    s = _search_against(3_000, start=10_000)
    ns = [n for n, _ in s.tried]
    assert ns[:3] == [10_000, 5_000, 2_500] and len(ns) == len(set(ns))
    assert all(n % 100 == 0 for n in ns)
    assert s.last_pass == 3_000 and s.first_fail - s.last_pass <= 0.05 * s.last_pass


def test_the_ramp_stops_at_its_ceiling_and_the_search_at_its_step_limit():
    s = _search_against(10**9, start=1_000, max_nodes=5_000)
    assert [n for n, _ in s.tried] == [1_000, 2_000, 4_000, 5_000]
    assert s.first_fail is None and s.stopped.startswith("ceiling")
    s = _search_against(10**9, start=100, max_steps=2, quantum=10)
    assert [n for n, _ in s.tried] == [100, 200] and s.stopped.startswith("step limit")


def test_a_step_that_fails_at_the_smallest_size_ends_the_search_without_a_capacity():
    s = _search_against(0, start=300, quantum=100)
    assert [n for n, _ in s.tried] == [300, 200, 100]
    assert s.last_pass is None and s.stopped.startswith("floor")


def test_a_pass_above_the_first_failure_is_noise_not_capacity():
    s = Search(start=10_000)
    for n, ok in ((10_000, True), (20_000, False), (15_000, True), (30_000, True)):
        s.add(n, ok)
    assert s.first_fail == 20_000 and s.last_pass == 15_000


def _load(ops=1000, p99=(5.0, 7.0, 6.0, 900.0), ok=True, offered=1000.0) -> dict:
    kinds = ("lease", "pod_create", "pod_update", "event")
    return {"ops": ops, "ops_per_s": offered * 0.99, "offered_per_s": offered, "pass": ok,
            "fail_reasons": [] if ok else ["event p99 1200 ms > 1000 ms"],
            "scheduled": {"total": 1000}, "failures": {"total": 0},
            "latency_ms": {"p50": 2.0, "p99": 8.0},
            "latency_ms_by_kind": {k: {"p99": v} for k, v in zip(kinds, p99)},
            "schedule_lag_ms": {"p99": 1.5}, "client_cpu_s": 0.5, "client_cpu_share": 0.25}


def test_step_figures_take_cpu_per_op_at_the_marks_and_the_leaders_committer():
    marks = ({"r0": 1.0, "r1": 2.0, "r2": 1.0}, {"r0": 1.2, "r1": 3.0, "r2": 1.1})
    row = step_figures(_load(), (10.0, 12.5), marks, leader="r0")
    assert row["server_cpu_s"] == 2.5 and row["server_cpu_us_per_op"] == 2500.0
    assert row["committer_cpu_s_by_member"] == {"r0": 0.2, "r1": 1.0, "r2": 0.1}
    assert row["committer_cpu_s"] == 0.2 and row["committer_us_per_op"] == 200.0  # the leader's decides writes
    unknown = step_figures(_load(), (10.0, 12.5), marks)  # no leader named: the busiest
    assert unknown["committer_cpu_s"] == 1.0 and unknown["committer_us_per_op"] == 1000.0
    assert row["worst_kind"] == "event" and row["worst_p99_ms"] == 900.0
    assert row["client_cpu_share"] == 0.25 and row["schedule_lag_p99_ms"] == 1.5
    gone = step_figures(_load(), (10.0, float("nan")), ({}, {}))  # the server died; etcd has no committer
    assert gone["server_cpu_s"] is None and gone["committer_us_per_op"] is None


def _step(nodes, ok, cpu=1.0, seconds=70.0):
    load = _load(ok=ok, ops=nodes // 10, offered=nodes / 10 + 200)
    row = step_figures(load, (0.0, cpu), None)
    return dict(row, nodes=nodes, **{"pass": ok}, error=None, load=load, step_seconds=seconds)


def test_the_record_is_the_step_at_capacity_with_every_step_beside_it():
    s = Search(start=10_000)
    steps = [_step(10_000, True, cpu=1.0), _step(20_000, True, cpu=3.0), _step(40_000, False, cpu=9.0)]
    for x in steps:
        s.add(x["nodes"], x["pass"])
    result, cpu, error = summarise(steps, s)
    assert error is None and cpu == 3.0
    assert result["capacity_nodes"] == 20_000 and result["bounded"] and result["first_fail_nodes"] == 40_000
    assert result["ops"] == 2_000 and result["server_cpu_us_per_op"] == 1500.0
    assert result["steps"] is steps and result["steps_seconds"] == 210.0
    assert result["latency_ms"] == {"p50": 2.0, "p99": 8.0}


def test_a_search_without_a_pass_is_an_error_that_says_why():
    s = Search(start=100, quantum=100)
    steps = [dict(_step(100, False), error=None)]
    s.add(100, False)
    result, cpu, error = summarise(steps, s)
    assert result["capacity_nodes"] == 0 and result["ops"] == 0 and cpu is None
    assert "no step passed" in error and "event p99 1200 ms" in error
    assert "FAIL (event p99 1200 ms > 1000 ms)" in step_line(steps[0])


def _record(server, capacity, bounded, workload="node-capacity", source=None, cpu=500.0):
    s = Search(start=capacity // 2 or 100)
    steps = [_step(capacity // 2, True), _step(capacity, True)] + ([_step(capacity * 2, False)] if bounded else [])
    for x in steps:
        s.add(x["nodes"], x["pass"])
    result, _, _ = summarise(steps, s)
    result["server_cpu_us_per_op"] = cpu
    rec = {"server": server, "workload": workload, "round": 1, "ok": True, "error": None, "result": result,
           "cpu_s": 1.0, "cpu_us_per_op": cpu}
    if source:
        rec["source"] = source
    return rec


def _data(runs):
    return {"meta": {"started": "2026-01-01T00:00:00", "settings": {"rounds": 3, "name": "full"},
                     "machine": {"nproc": 2, "cpu": "x"}, "servers": {}, "tools": {},
                     "capacity_rule": "node-capacity: the rule"}, "runs": runs}


def test_the_report_gives_each_capacity_its_costs_ratios_and_every_step():
    runs = [_record("brain", 40_000, True, cpu=400.0), _record("etcd-3.6", 20_000, True, cpu=800.0),
            _record("etcd-3.7", 30_000, False), _record("brain", 6_000, True, workload="cluster-node-capacity"),
            _record("etcd-3.6", 3_000, True, workload="cluster-node-capacity")]
    lines = capacity_report.section(_data(runs))
    text = "\n".join(lines)
    assert lines[0] == "## Node capacity" and "Node-capacity: the rule." in text
    assert "| brain | 40,000 (80,000 failed) |" in text
    assert "| etcd-3.7 | ≥ 30,000 (no step failed) |" in text
    assert "| brain / etcd-3.6 | 2.00 | 1.91 | 0.50 |" in text
    assert "| brain / etcd-3.7 | ≤ 1.33 |" in text  # etcd 3.7 may take more than it was given
    assert "| brain cluster / etcd-3.6 cluster | 2.00 |" in text
    assert "### etcd-3.6 cluster: every step" in text and text.count("| fail: event p99 1200 ms > 1000 ms |") == 4
    # The summary table's cells and ratios say the same.
    agg = aggregation.aggregate(_data(runs))
    assert render.value_cell(agg["node-capacity"]["etcd-3.7"], {}).startswith("≥ 30,000")
    assert render.ratio_cell(aggregation.compare(agg, "node-capacity", "etcd-3.6")) == "2.00"
    assert render.ratio_cell(aggregation.compare(agg, "node-capacity", "etcd-3.7")) == "≤ 1.33"
    md = render.markdown(_data(runs), [])
    assert md.index("## Node capacity") < md.index("## Workloads")


def test_capacities_of_different_runs_or_open_on_both_sides_have_no_ratio():
    runs = [_record("brain", 40_000, True, source="a.json"), _record("etcd-3.6", 20_000, True, source="b.json")]
    assert "| brain / etcd-3.6 | n/a (runs differ) |" in "\n".join(capacity_report.section(_data(runs)))
    runs = [_record("brain", 40_000, False), _record("etcd-3.6", 20_000, False)]
    assert "| brain / etcd-3.6 | n/a (no step failed on either) |" in "\n".join(capacity_report.section(_data(runs)))
    agg = aggregation.aggregate(_data(runs))
    assert render.ratio_cell(aggregation.compare(agg, "node-capacity", "etcd-3.6")) == "n/a (no step failed on either)"


def test_the_plot_has_a_point_per_measured_step(tmp_path):
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        unavailable(f"matplotlib: {e} (the test extra installs it: make deps)")
    runs = [_record("brain", 40_000, True), _record("etcd-3.6", 20_000, True)]
    broken = copy.deepcopy(runs[1])
    broken["result"]["steps"][0]["error"] = "server did not start"
    assert capacity_report.points(broken["result"]) == [(2_200.0, 900.0, True), (4_200.0, 900.0, False)]
    assert len(capacity_report.points(runs[0]["result"])) == 3
    name = capacity_report.plot(_data(runs), tmp_path, "x", plt)
    assert name == "x-node-capacity.png" and (tmp_path / name).stat().st_size > 0
    assert capacity_report.plot(_data([]), tmp_path, "y", plt) is None


def test_thread_cpu_is_read_by_the_threads_os_name():
    read = threading.Event()

    def spin():  # some CPU, then alive (and off the GIL) until it has been read
        name_os_thread("bench-spinner")
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        read.wait(30)

    t = threading.Thread(target=spin)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while (spent := thread_cpu_seconds(os.getpgrp(), "bench-spinner")) in (None, 0.0):
            assert time.monotonic() < deadline, "no CPU of the named thread"
            time.sleep(0.05)
        assert 0 < spent < 5
        assert thread_cpu_seconds(os.getpgrp(), "no-such-thread") is None
    finally:
        read.set()
        t.join()


def test_brain_as_groups_is_set_beside_one_brain_of_the_same_run():
    runs = [_record("brain", 40_000, True, cpu=400.0), _record("brain-groups", 60_000, True, cpu=500.0),
            _record("etcd-3.6", 20_000, True)]
    text = "\n".join(capacity_report.section(_data(runs)))
    assert "| brain-groups | 60,000 (120,000 failed) |" in text
    assert "| brain-groups / brain | 1.50 |" in text and text.index("| brain-groups / brain |") < text.index(
        "| brain / etcd-3.6 |")
    assert "| brain-groups / etcd-3.6 |" not in text
    assert "### brain-groups: every step" in text
    runs[1]["source"] = "other.json"
    assert "| brain-groups / brain | n/a (runs differ) |" in "\n".join(capacity_report.section(_data(runs)))


def test_brain_groups_runs_node_capacity_alone_as_brain_groups_starts_it(tmp_path):
    from benchmarks.capacity import Capacity
    from benchmarks.groups import GROUPS, servers_for
    from benchmarks.servers import BrainGroups, StartOptions, all_flavors
    from benchmarks.settings import SMOKE
    from brain.cli import groups
    from tests.support.tls import make_test_pki

    flavors = all_flavors()
    for group in GROUPS:
        names = [f.name for f in servers_for(group, flavors, [])]
        assert ("brain-groups" in names) == (group == "node-capacity"), group
    g = BrainGroups()
    pki = make_test_pki(tmp_path / "pki")
    cmd = g.command(tmp_path / "data", 1111, 2222, StartOptions(quota_bytes=8 << 30, tls=pki))
    assert cmd[1:4] == ["-m", "brain", "groups"]
    # the layout `brain groups` reads from that command line: leases and events on the second port
    args = groups.build_parser().parse_args(cmd[4:])
    layout = groups.layout_from_args(args)
    assert layout.apiserver_flags() == [
        "--etcd-servers=https://127.0.0.1:1111",
        "--etcd-servers-overrides=coordination.k8s.io/leases#https://127.0.0.1:2222,/events#https://127.0.0.1:2222"]
    for group in layout.groups:
        assert group.flag("quota-backend-bytes") == str(8 << 30) and group.flag("client-cert-auth") == "true"
        assert group.flag("cert-file") == str(pki.server.cert) and group.data_dir.startswith(str(tmp_path / "data"))
    assert g.endpoints_by_kind(1111, 2222) == {"leases": "127.0.0.1:2222", "events": "127.0.0.1:2222",
                                               "pods": "127.0.0.1:1111"}
    assert g.ready_endpoints(1111, 2222) == ["127.0.0.1:1111", "127.0.0.1:2222"]
    # brainload gets each kind's endpoint; the smoke runs one step of it
    cap = Capacity.__new__(Capacity)
    cap.s = SMOKE
    assert cap._args(100, {"leases": "a:1", "pods": "b:2"})[-4:] == ["--endpoints-leases", "a:1", "--endpoints-pods",
                                                                     "b:2"]
    assert cap.search("node-capacity", g).max_steps == 1 and cap.search("node-capacity", flavors[-2]).max_steps == 2
