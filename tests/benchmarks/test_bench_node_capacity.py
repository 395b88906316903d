"""brainload node-capacity against real etcd 3.6 servers: the schedule's counts, the keys each kind
writes and where (per-kind endpoints), the events' shared leases, kube-apiserver's compaction, the
update's retry on a failed compare, and a verdict that fails.

The binaries come from benchmarks/build.sh (cached in .cache/bench) or ``$BRAIN_BENCH_BIN``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.probes import count_prefix, kv_channel
from benchmarks.servers import Server, all_flavors
from tests.support import servers as _servers

REPO_ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("etcd-3.6", "brainload")

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def bench_bin() -> Path:
    from benchmarks.servers import bin_dir

    if os.environ.get("BRAIN_BENCH_BIN"):
        return Path(os.environ["BRAIN_BENCH_BIN"])
    if shutil.which("go") is None:
        if all((bin_dir() / b).is_file() for b in NEEDED):
            return bin_dir()
        _servers.unavailable("go is not on PATH and brainload and etcd-3.6 are not built")
    r = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "build.sh"), *NEEDED], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"benchmarks/build.sh failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def etcds(bench_bin, tmp_path, monkeypatch):
    """Two etcd 3.6 servers, A and B."""
    monkeypatch.setenv("BRAIN_BENCH_BIN", str(bench_bin))
    [flavor] = [f for f in all_flavors() if f.name == "etcd-3.6"]
    started = []
    try:
        for name in ("a", "b"):
            srv = Server(flavor, tmp_path / name)
            srv.start()
            started.append(srv)
        yield started
    finally:
        for srv in started:
            srv.remove()


def _brainload(bench_bin: Path, *args, wait: bool = True):
    cmd = [str(bench_bin / "brainload"), "node-capacity", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    return _result(proc)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_every_kind_is_written_on_schedule_where_its_endpoints_say(bench_bin, etcds):
    a, b = etcds
    r = _brainload(bench_bin, "--endpoints", a.endpoint, "--endpoints-events", b.endpoint, "--nodes", 200,
                   "--pods", 20, "--duration", "1.5s", "--compact-interval", "0.5s", "--events-per-lease", 100,
                   "--clients", 32, "--conns", 2)
    # kind k's n-th op at n / rate for every n / rate < 1.5 s: leases 200 per 10 s, creates and updates 50/s,
    # events 100/s
    want = {"lease": 30, "pod_create": 75, "pod_update": 75, "event": 150}
    assert r["scheduled"] == {**want, "total": 330}
    assert r["succeeded"] == want and r["failures"]["total"] == 0 and r["errors"] == 0
    assert r["target_per_s"]["total"] == 220 and r["achieved_per_s"]["total"] >= 0.97 * 220
    assert r["pass"] is True and r["fail_reasons"] == []
    assert set(r["latency_ms_by_kind"]) == set(want) and r["latency_ms"]["p999"] >= r["latency_ms"]["p99"]
    assert r["endpoints_by_kind"] == {"leases": a.endpoint, "pods": a.endpoint, "events": b.endpoint}
    assert 0 < r["client_cpu_share"] <= 1 and r["client_cpu_s"] > 0
    # Every node's Lease and the pods on A, the events (and nothing else) on B.
    assert count_prefix(a.endpoint, b"/registry/leases/kube-node-lease/") == 200
    assert count_prefix(a.endpoint, b"/registry/pods/") == 20 + 75
    assert count_prefix(a.endpoint, b"/registry/events/") == 0
    assert count_prefix(b.endpoint, b"/registry/events/") == 150
    assert count_prefix(b.endpoint, b"/registry/leases/") == count_prefix(b.endpoint, b"/registry/pods/") == 0
    # 150 events, up to 100 per lease: two grants, on B.
    assert r["event_leases_granted"] == 2
    from brain.api.pb.etcdserverpb import rpc_pb2

    ch, kv = kv_channel(b.endpoint)
    try:
        resp = kv.Range(rpc_pb2.RangeRequest(key=b"/registry/events/", range_end=b"/registry/events0"), timeout=10)
    finally:
        ch.close()
    assert len({x.lease for x in resp.kvs}) == 2 and all(x.lease for x in resp.kvs)
    # kube-apiserver's compaction on each server: its state key, and compactions at 0.5 s and 1 s on both.
    c = r["compactions"]
    assert c["errors"] == 0 and c["done"] >= 2, c
    assert count_prefix(a.endpoint, b"compact_rev_key") == count_prefix(b.endpoint, b"compact_rev_key") == 1


def test_an_update_whose_compare_fails_is_made_again_on_what_the_else_returned(bench_bin, etcds):
    a, _ = etcds
    common = ["--endpoints", a.endpoint, "--nodes", 100, "--pods", 10, "--renew-interval", "0.5s",
              "--pod-create-rate", 0, "--event-rate", 0, "--compact-interval", 0, "--clients", 16, "--conns", 2]
    first = _brainload(bench_bin, *common, "--duration", "3s", wait=False)
    time.sleep(1.0)
    # A second writer preloads the same leases and pods meanwhile: what the first saw is stale.
    second = _result(_brainload(bench_bin, *common, "--duration", "0.5s", wait=False))
    r = _result(first)
    assert r["conflicts"]["lease"] > 0 and r["conflicts"]["pod_update"] > 0, r["conflicts"]
    assert r["failures"]["total"] == 0 and r["succeeded"]["lease"] == r["scheduled"]["lease"] == 600
    assert second["failures"]["total"] == 0


def test_a_step_over_the_slo_fails_and_says_why(bench_bin, etcds):
    a, _ = etcds
    r = _brainload(bench_bin, "--endpoints", a.endpoint, "--nodes", 100, "--pods", 10, "--duration", "0.5s",
                   "--compact-interval", 0, "--slo-p99", "1us", "--clients", 16, "--conns", 2)
    assert r["pass"] is False
    assert [x.split(" p99 ")[0] for x in r["fail_reasons"]] == ["event", "lease", "pod_create", "pod_update"]
    assert r["failures"]["total"] == 0
