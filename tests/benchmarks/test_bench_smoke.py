"""``make bench-smoke`` as a test, through the real harness: benchmark
workloads for about a second each, with the restart group's samples (SIGTERM
and kill -9 starts, each with its CPU time).

Under ``make test`` every workload runs on brain and etcd 3.6 and on their
3-replica clusters (load and a leader kill each), and node-capacity on brain
as two groups (`brain groups`, one step); only their binaries are built.  ``BRAIN_BENCH_SMOKE=all`` (``make test-full``) runs every
workload on every configuration (etcd 3.4 and 3.7, kine, and under mutual
TLS etcd 3.6 and 3.7 on the fast gRPC listener too), as ``make bench-smoke``
does; ``BRAIN_BENCH_SMOKE=others`` adds to the make test run the put groups
on every other configuration (their start, TLS and tool paths).

The Go binaries come from ``benchmarks/build.sh`` (cached in .cache/bench;
the first build takes a few minutes, later runs under a second).  Skipped
when Go is missing and nothing is built yet (a failure under $CI instead).
``$BRAIN_BENCH_BIN`` points at prebuilt binaries and skips the build.
nats-server and clustercheck come from tests/cluster/build.sh (the harness
builds them on first use; ``$NATS_SERVER_BIN``/``$CLUSTERCHECK_BIN`` point
at prebuilt ones).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import servers as _servers

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD = REPO_ROOT / "benchmarks" / "build.sh"
BINARIES = ("etcd-3.6", "etcdctl-3.6", "etcd-3.7", "etcdctl-3.7", "benchmark", "kine", "brainload")
SMOKE = os.environ.get("BRAIN_BENCH_SMOKE", "")
ALL = SMOKE == "all"
OTHERS = ALL or SMOKE == "others"
# What the make test run starts: brain's and etcd 3.6's tools (the rest only when asked for).
NEEDED = BINARIES if OTHERS else ("etcd-3.6", "etcdctl-3.6", "benchmark", "brainload")
SERVERS = ("etcd-3.4", "etcd-3.6", "etcd-3.6-fast", "etcd-3.7", "etcd-3.7-fast", "kine", "brain")
FAST = ("etcd-3.6-fast", "etcd-3.7-fast")  # mutual TLS groups only

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def bench_bin() -> Path:
    explicit = os.environ.get("BRAIN_BENCH_BIN")
    if explicit:
        return Path(explicit)
    if not BUILD.is_file():
        _servers.unavailable("benchmarks/build.sh is missing")
    if shutil.which("go") is None:
        from benchmarks.servers import bin_dir

        cached = bin_dir()
        if all((cached / b).is_file() for b in NEEDED):
            return cached
        _servers.unavailable("go is not on PATH and the benchmark binaries are not built")
    r = subprocess.run(["bash", str(BUILD), *([] if OTHERS else NEEDED)], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=1500)
    assert r.returncode == 0, f"benchmarks/build.sh failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


EVERYWHERE = ("etcd-3.6", "brain")  # every workload, and the clusters, in make test too
GROUPS_CONFIG = "brain-groups"  # brain as two groups: node-capacity alone, one step, in make test too
PUT_GROUPS = "put,mtls-put"  # what the other configurations run in make test


def _smoke(bench_bin: Path, out: Path, *args: str) -> dict:
    env = dict(os.environ, BRAIN_BENCH_BIN=str(bench_bin), PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(out), *args],
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"smoke run failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    [json_path] = out.glob("*.json")
    data = json.loads(json_path.read_text())
    assert data["meta"].get("finished"), "the run did not finish"
    return data


def test_smoke_run_covers_every_workload(bench_bin: Path, tmp_path: Path) -> None:
    from benchmarks.cluster_groups import ETCD_TIMEOUTS, brain_serve_defaults, runs_on
    from benchmarks.groups import CAPACITY_SERVERS, SCALE_SERVERS
    from benchmarks.workloads import WORKLOADS, mode_of

    out = tmp_path / "main"
    data = _smoke(bench_bin, out, *([] if ALL else ["--servers", ",".join((*EVERYWHERE, GROUPS_CONFIG))]))
    runs = list(data["runs"])
    meta = data["meta"]
    servers = dict(meta["servers"])
    if OTHERS and not ALL:
        others = [s for s in SERVERS if s not in EVERYWHERE]
        rest = _smoke(bench_bin, tmp_path / "others", "--servers", ",".join(others), "--groups", PUT_GROUPS)
        runs += rest["runs"]
        servers.update(rest["meta"]["servers"])
    smoked = SERVERS if OTHERS else EVERYWHERE
    for name in (*smoked, GROUPS_CONFIG):
        assert servers[name]["available"], f"{name}: {servers[name]['reason']}"

    for name in ("etcd-3.6", "brain"):
        assert meta["clusters"][name]["available"], f"{name} cluster: {meta['clusters'][name]['reason']}"

    every = {w for w, meta in WORKLOADS.items() if w != "check-perf" and not meta.source}
    clustered = {w for w in every if mode_of(w) == "cluster"}
    scaled = {w for w in every if mode_of(w) == "scale"}
    seen: dict[str, dict[str, dict]] = {}
    for run in runs:
        seen.setdefault(run["server"], {})[run["workload"]] = run
    mtls = {w for w in every if mode_of(w) == "mtls"}
    put = {w for w in every if WORKLOADS[w].group in PUT_GROUPS.split(",")}
    for server in smoked:
        # Clusters: brain's against etcd 3.6's only; etcd's fast gRPC configurations: mutual TLS only.
        expected = mtls if server in FAST else every if server in EVERYWHERE else every - clustered
        if server not in SCALE_SERVERS:
            expected -= scaled
        if server not in CAPACITY_SERVERS:
            expected -= {"node-capacity"}
        defaults = brain_serve_defaults()
        expected -= {w for w in clustered if not runs_on(WORKLOADS[w].group, server, defaults)}
        if not ALL and server not in EVERYWHERE:
            expected &= put
        missing = expected - set(seen.get(server, {}))
        assert not missing, f"{server}: no record for {sorted(missing)}"
        if server in FAST:
            assert set(seen[server]) == expected, f"{server} ran outside the mutual TLS groups: {sorted(seen[server])}"
    # KV.RangeStream: etcd 3.6 lacks it (the cell says so and is no failure), etcd 3.7 and brain serve it.
    assert seen["etcd-3.6"]["scale-stream"]["result"].get("unsupported"), seen["etcd-3.6"]["scale-stream"]
    if ALL:
        assert seen["etcd-3.7"]["scale-stream"]["result"]["keys"] > 0, seen["etcd-3.7"]["scale-stream"]
    assert seen["brain"]["scale-stream"]["result"].get("keys", 0) > 0, seen["brain"]["scale-stream"]
    for w in sorted(every):
        run = seen["brain"][w]
        assert run["ok"], f"brain {w}: {run['error']}"
        assert (run["result"].get("ops") or 0) > 0, f"brain {w}: no operations"
        if w != "cluster-failover":  # kills and a verify: no CPU per operation
            assert run["cpu_s"] is not None and run["cpu_s"] >= 0, f"brain {w}: no CPU reading"
    for server, workload in (("etcd-3.6", "cluster-failover"), ("brain", "cluster-failover"),
                             ("brain", "cluster-failover-brain-defaults")):
        run = seen[server][workload]
        res = run["result"]
        assert res["kills"] and res["lost"] == 0, f"{server} {workload}: {res}"
        # Every fault of the smoke's plan ran and has its pause: kill -9 and isolation of the leader;
        # under brain kill -9 of the NATS stream leader and a planned restart of each nats-server.
        faults = {"leader_pauses_s": 1, "isolate_pauses_s": 1}
        if server == "brain" and workload == "cluster-failover":
            faults |= {"nats_pauses_s": 1, "nats_restart_pauses_s": 3}
        else:
            faults |= {"nats_pauses_s": 0, "nats_restart_pauses_s": 0}
        for key, n in faults.items():
            assert len(res[key]) == n, f"{server} {workload} {key}: {res}"
        # Both clusters at etcd's election timing in cluster-failover; brain at its own defaults beside it.
        want = list(ETCD_TIMEOUTS) if workload == "cluster-failover" else []
        assert run["member_args"] == want, f"{server} {workload}: {run['member_args']}"
    for kill in seen["brain"]["cluster-failover"]["result"]["kills"]:
        if kill["fault"] == "nats":  # the new stream leader as every nats-server's monitoring reported it
            assert kill["stream_leader_seen_s"] is not None and kill["stream_leader_polls"] > 0, kill
    lease_groups = ("cluster-read-barrier", "cluster-read-lease", "cluster-failover-brain-defaults")
    assert not any(WORKLOADS[w].group in lease_groups for w in seen["etcd-3.6"] if w in WORKLOADS), \
        "the rows of brain's other read lease and of its own election timeout are brain's alone"
    # Node capacity: the smoke's steps (two on one server, one on a cluster), each on a fresh start, passed,
    # with the server's CPU per op, the load generator's share and the load average; brain's committer
    # thread's CPU too (every replica's in a cluster).
    for server in EVERYWHERE:
        for workload, steps, members in (("node-capacity", 2, 1), ("cluster-node-capacity", 1, 3)):
            res = seen[server][workload]["result"]
            assert [x["nodes"] for x in res["steps"]] == [100, 200][:steps], res
            assert res["capacity_nodes"] == res["steps"][-1]["nodes"] and not res["bounded"], res
            for step in res["steps"]:
                assert step["pass"] and step["error"] is None, step
                assert step["server_cpu_us_per_op"] > 0 and 0 < step["client_cpu_share"] <= 1, step
                assert step["load_average_start"] and step["load"]["compactions"]["done"] >= 1, step
                if members > 1:  # the cluster named its leader, whose committer decides writes
                    assert step["leader"] and step["leader_after"] == step["leader"], step
                if server == "brain":
                    assert step["committer_us_per_op"] > 0, step
                    assert len(step["committer_cpu_s_by_member"]) == members, step
                    assert members == 1 or step["committer_cpu_s"] == step["committer_cpu_s_by_member"][step["leader"]]
                else:
                    assert step["committer_us_per_op"] is None, step
    # brain as two groups, started by `brain groups`: node-capacity alone, its one step passed with the
    # Leases and Events at one group and the pods at the other, each group's committer read on its own (the
    # busiest is the step's), each group compacted by brainload as the apiserver compacts each store.
    assert set(seen[GROUPS_CONFIG]) == {"node-capacity"}, sorted(seen[GROUPS_CONFIG])
    res = seen[GROUPS_CONFIG]["node-capacity"]["result"]
    assert [x["nodes"] for x in res["steps"]] == [100] and res["capacity_nodes"] == 100, res
    [step] = res["steps"]
    assert step["pass"] and step["error"] is None, step
    kinds = step["load"]["endpoints_by_kind"]
    assert kinds["leases"] == kinds["events"] != kinds["pods"], kinds
    by_member = step["committer_cpu_s_by_member"]
    assert set(by_member) == {"default", "leases-events"} and all(v > 0 for v in by_member.values()), step
    assert step["committer_cpu_s"] == max(by_member.values()) and step["committer_us_per_op"] > 0, step
    assert step["server_cpu_us_per_op"] > 0 and step["load"]["compactions"]["done"] >= 2, step
    # Restart: every sample of both kinds was taken, each with the server's CPU time to ready.
    samples = meta["settings"]["restart_samples"]
    for server in ("etcd-3.6", "etcd-3.7", "brain") if ALL else EVERYWHERE:
        res = seen[server]["restart"]["result"]
        for key in ("ready_after_s", "cpu_to_ready_s", "ready_after_kill9_s", "cpu_to_ready_kill9_s"):
            assert len(res[key + "_samples"]) == samples >= 3, f"{server} restart {key}: {res[key + '_samples']}"
        assert res["ready_after_kill9_s_worst"] == max(res["ready_after_kill9_s_samples"])
        # Ready is a linearizable Get of one key, the same for every server; the keys are counted after it.
        assert res["ready_probe"].startswith("a linearizable Get of "), res.get("ready_probe")
        assert res["count_after_restart"] == res["count_after_kill9"] == res["keys_loaded"] > 0, res
    # The references ran too (kine may reject some workloads; etcd must not).
    for server in ("etcd-3.4", "etcd-3.6", "etcd-3.7", *FAST) if OTHERS else ("etcd-3.6",):
        failed = {w: run["error"] for w, run in seen[server].items() if not run["ok"]}
        assert not failed, f"{server} failed: {failed}"

    [md_path] = out.glob("*.md")
    md = md_path.read_text()
    assert "## Targets" in md and "| brain |" in md
    assert "| brain-groups / brain |" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    # put latency, and the workloads of each mode: plaintext, mutual TLS, clusters.
    assert {p.name.split("-smoke-")[-1] for p in out.glob("*.png")} == {
        "put-latency.png", "workloads.png", "mtls.png", "cluster.png", "scale.png", "node-capacity.png"}
