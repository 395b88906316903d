"""Maintenance with etcdctl against `python -m brain serve`: endpoint status /
hashkv / health, member list, alarms and the NOSPACE cycle, defrag, snapshot
save -> `brain snapshot restore` -> serve, metrics and /health over HTTP.

Where etcd's output is fixed text it is compared with a real etcd's (ids
masked) when one is installed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from brain.etcd_version import ETCD_VERSION
from tests.integration.conftest import require_etcdctl, run_etcdctl
from tests.support.servers import REPO_ROOT, BrainServer, free_port, http_get, shard_args, shard_boundaries

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(180)]

NOSPACE_ERR = "Error: etcdserver: mvcc: database space exceeded"


@pytest.fixture(autouse=True)
def _etcdctl():
    require_etcdctl()


def ok(endpoint: str, *args: str, stdin: str | None = None) -> str:
    r = run_etcdctl(endpoint, *args, stdin=stdin)
    assert r.rc == 0, f"etcdctl {' '.join(args)}: {r.err}"
    return r.out


def brain_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brain", *args], capture_output=True, text=True,
                          cwd=str(REPO_ROOT), timeout=60)


def revision(endpoint: str) -> int:
    return json.loads(ok(endpoint, "get", "nothing-here", "-w", "json"))["header"]["revision"]


def history(endpoint: str, rev: int) -> list:
    """Every key at `rev` with its revisions and value, as etcdctl shows them."""
    out = json.loads(ok(endpoint, "get", "", "--prefix", f"--rev={rev}", "-w", "json"))
    return [(kv["key"], kv.get("value"), kv["create_revision"], kv["mod_revision"], kv["version"],
             kv.get("lease", 0)) for kv in out.get("kvs", [])]


def write_some(endpoint: str) -> None:
    for i in range(30):
        ok(endpoint, "put", f"/registry/pods/ns/p{i % 7}", f"v{i}")
        ok(endpoint, "put", f"/registry/configmaps/c{i % 5}", f"c{i}")
    ok(endpoint, "del", "/registry/pods/ns/p3")
    ok(endpoint, "txn", stdin="\nput /registry/leases/l1 a\nput /registry/events/e1 b\n\n\n")
    ok(endpoint, "del", "/registry/configmaps/", "--prefix")
    ok(endpoint, "put", "/registry/configmaps/c1", "back")


@pytest.fixture
def brain4(brain_factory):
    return brain_factory(shards=4)


def test_endpoint_status_reports_a_37_leader(brain4):
    ep = brain4.endpoint
    ok(ep, "put", "k", "v")
    (st,) = json.loads(ok(ep, "endpoint", "status", "-w", "json"))
    s = st["Status"]
    assert s["version"] == ETCD_VERSION and s["version"].startswith("3.7.")
    assert s["leader"] == s["header"]["member_id"]
    assert s["raftIndex"] == s["raftAppliedIndex"] == s["header"]["revision"] == 2
    assert s["dbSize"] >= s["dbSizeInUse"] > 0
    table = ok(ep, "endpoint", "status")
    assert f", {s['leader']:x}, {ETCD_VERSION}, " in table


def test_member_list(brain_factory):
    srv = brain_factory(extra_args=["--name", "brain-one"])
    (m,) = json.loads(ok(srv.endpoint, "member", "list", "-w", "json"))["members"]
    (st,) = json.loads(ok(srv.endpoint, "endpoint", "status", "-w", "json"))
    assert m["ID"] == st["Status"]["leader"] and m["name"] == "brain-one"
    assert m["clientURLs"] == [srv.client_url] and "peerURLs" not in m
    assert ok(srv.endpoint, "member", "list") == f"{m['ID']:x}, started, brain-one, , {srv.client_url}, false\n"
    r = run_etcdctl(srv.endpoint, "member", "add", "other", "--peer-urls=http://127.0.0.1:1")
    assert r.rc == 1 and r.err.endswith("brain: membership changes are not supported (single member)")


def test_hashkv_equal_for_equal_data_and_stable_across_restart(brain_factory):
    a = brain_factory(shards=1)
    b = brain_factory(shards=4)
    for srv in (a, b):
        write_some(srv.endpoint)
    (ha,) = json.loads(ok(a.endpoint, "endpoint", "hashkv", "-w", "json"))
    (hb,) = json.loads(ok(b.endpoint, "endpoint", "hashkv", "-w", "json"))
    assert ha["HashKV"]["hash"] == hb["HashKV"]["hash"] != 0
    assert ha["HashKV"]["compact_revision"] == -1
    rev = revision(a.endpoint)
    ok(a.endpoint, "compact", str(rev - 10))
    ok(b.endpoint, "compact", str(rev - 10), "--physical")
    before = ok(a.endpoint, "endpoint", "hashkv", f"--rev={rev - 3}")
    assert before.split(", ")[1] == ok(b.endpoint, "endpoint", "hashkv", f"--rev={rev - 3}").split(", ")[1]
    a.restart()
    assert ok(a.endpoint, "endpoint", "hashkv", f"--rev={rev - 3}") == before
    r = run_etcdctl(a.endpoint, "endpoint", "hashkv", f"--rev={rev - 20}")
    assert r.rc == 1 and "required revision has been compacted" in r.err


def test_defrag_and_health(brain4):
    ok(brain4.endpoint, "put", "k", "v")
    assert ok(brain4.endpoint, "defrag") == f"Finished defragmenting etcd member[{brain4.endpoint}]\n"
    r = run_etcdctl(brain4.endpoint, "endpoint", "health")
    assert r.rc == 0 and "is healthy" in r.out + r.err


def _fill_until_nospace(endpoint: str, limit: int = 2000) -> int:
    for i in range(limit):
        r = run_etcdctl(endpoint, "put", f"fill/{i:05d}", "x" * 1000)
        if r.rc:
            assert r.err == NOSPACE_ERR, r.err
            return i
    raise AssertionError("quota never hit")


def _masked(text: str) -> str:
    return re.sub(r"memberID:\d+", "memberID:<M>", text)


def test_nospace_alarm_cycle(brain_factory, etcd_factory):
    srv = brain_factory(shards=1, extra_args=["--quota-backend-bytes", "120000"])
    ep = srv.endpoint
    assert ok(ep, "alarm", "list") == ""
    assert _fill_until_nospace(ep) > 10
    (st,) = json.loads(ok(ep, "endpoint", "status", "-w", "json"))
    me = st["Status"]["leader"]
    assert ok(ep, "alarm", "list") == f"memberID:{me} alarm:NOSPACE \n"
    assert st["Status"]["errors"] == [f"memberID:{me} alarm:NOSPACE "]
    r = run_etcdctl(ep, "put", "tiny", "1")
    assert (r.rc, r.err) == (1, NOSPACE_ERR)
    # reads, deletes and compaction still work; freeing space is not enough
    assert ok(ep, "get", "fill/00000", "--print-value-only") == "x" * 1000 + "\n"
    ok(ep, "del", "fill/", "--prefix")
    ok(ep, "compact", str(revision(ep)), "--physical")
    ok(ep, "defrag")
    assert run_etcdctl(ep, "put", "tiny", "1").err == NOSPACE_ERR
    # the alarm survives a restart until disarmed
    srv.restart()
    assert ok(ep, "alarm", "list") == f"memberID:{me} alarm:NOSPACE \n"
    assert ok(ep, "alarm", "disarm") == f"memberID:{me} alarm:NOSPACE \n"
    assert ok(ep, "alarm", "list") == ""
    assert ok(ep, "put", "tiny", "1") == "OK\n"

    # the same cycle's texts from etcd
    etcd = etcd_factory(extra_args=["--quota-backend-bytes", "120000"])
    eep = etcd.endpoint
    _fill_until_nospace(eep)
    assert _masked(ok(eep, "alarm", "list")) == "memberID:<M> alarm:NOSPACE \n"
    assert run_etcdctl(eep, "put", "tiny", "1").err == NOSPACE_ERR
    ok(eep, "del", "fill/", "--prefix")
    ok(eep, "compact", str(revision(eep)), "--physical")
    ok(eep, "defrag")
    assert run_etcdctl(eep, "put", "tiny", "1").err == NOSPACE_ERR
    assert _masked(ok(eep, "alarm", "disarm")) == "memberID:<M> alarm:NOSPACE \n"
    assert ok(eep, "put", "tiny", "1") == "OK\n"


@pytest.mark.parametrize("restore_shards", [None, 1])
def test_snapshot_save_restore_serve(brain4, tmp_path, restore_shards):
    src = brain4.endpoint
    write_some(src)
    leases = run_etcdctl(src, "lease", "grant", "600").rc == 0  # (the Lease service may be absent)
    compact_at = revision(src) - 15
    ok(src, "compact", str(compact_at))
    ok(src, "put", "after-compaction", "1")
    path = tmp_path / "brain.snap"
    out = ok(src, "snapshot", "save", str(path))
    assert out == f"Snapshot saved at {path}\n"
    assert path.stat().st_size % 512 == 32

    rev = revision(src)
    st = brain_cli("snapshot", "status", str(path), "-w", "json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["revision"] == rev and status["compactRevision"] == compact_at and status["format"] == "etcd"
    assert status["totalKey"] == len(history(src, rev)) and status["leases"] == int(leases)
    # etcd's own tool reads brain's snapshot and agrees on its hash, revision and size
    theirs = json.loads(ok(src, "snapshot", "status", str(path), "-w", "json"))
    assert (theirs["hash"], theirs["revision"], theirs["totalSize"]) == (
        status["hash"], rev, path.stat().st_size - 32)
    hkv = ok(src, "endpoint", "hashkv", f"--rev={rev}").split(", ")[1].strip()
    table = brain_cli("snapshot", "status", str(path), "-w", "table")
    assert f"{status['hash']:x}" in table.stdout and "TOTAL KEYS" in table.stdout

    shards = 4 if restore_shards is None else restore_shards
    dst = BrainServer(shards=shards, extra_args=shard_args(shards) if restore_shards is None else [])
    try:
        args = ["snapshot", "restore", str(path), "--data-dir", str(dst.data_dir), "--name", "restored"]
        if restore_shards is not None:
            args += ["--shards", str(restore_shards)]
        else:  # an etcd-format snapshot carries no layout: name the server's
            args += ["--shards", "4", "--shard-boundaries", ",".join(shard_boundaries(4))]
        r = brain_cli(*args)
        assert r.returncode == 0, r.stderr
        assert f"revision {rev}" in r.stdout
        again = brain_cli(*args)
        assert again.returncode == 1 and "exists" in again.stderr and "--replace" in again.stderr
        dst.start()
        ep = dst.endpoint
        assert revision(ep) == rev
        for at in range(compact_at, rev + 1):
            assert history(ep, at) == history(src, at), at
        r = run_etcdctl(ep, "get", "x", f"--rev={compact_at - 1}")
        assert "required revision has been compacted" in r.err
        assert ok(ep, "endpoint", "hashkv", f"--rev={rev}").split(", ")[1].strip() == hkv
        if leases:
            assert json.loads(ok(ep, "lease", "list", "-w", "json")).get("leases")
        (a,) = json.loads(ok(src, "endpoint", "status", "-w", "json"))
        (b,) = json.loads(ok(ep, "endpoint", "status", "-w", "json"))
        assert a["Status"]["leader"] != b["Status"]["leader"]  # a new member identity
        assert a["Status"]["header"]["cluster_id"] != b["Status"]["header"]["cluster_id"]
        assert json.loads(ok(ep, "put", "new", "1", "-w", "json"))["header"]["revision"] == rev + 1
    finally:
        dst.cleanup()


def test_snapshot_restore_refuses_a_damaged_file(tmp_path, brain4):
    ok(brain4.endpoint, "put", "k", "v")
    path = tmp_path / "s.snap"
    ok(brain4.endpoint, "snapshot", "save", str(path))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    r = brain_cli("snapshot", "restore", str(path), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr
    assert not (tmp_path / "d").exists()
    r = brain_cli("snapshot", "status", str(path))
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr


def test_metrics_and_health_over_http(brain_factory):
    port = free_port()
    srv = brain_factory(shards=4, extra_args=["--listen-metrics-urls", f"http://127.0.0.1:{port}"])
    for i in range(12):
        ok(srv.endpoint, "put", f"m{i}", "v")
    ok(srv.endpoint, "del", "m0")
    status, text = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))

    def v(name, **labels):
        return next(val for lab, val in samples[name] if all(lab.get(k) == x for k, x in labels.items()))

    assert v("etcd_debugging_mvcc_keys_total") == 11
    assert v("etcd_disk_wal_fsync_duration_seconds_count") >= 13
    assert v("etcd_mvcc_db_total_size_in_bytes") > 0
    assert v("etcd_server_is_leader") == 1
    assert v("grpc_server_handled_total", grpc_method="Put", grpc_code="OK") == 12
    status, body = http_get(f"http://127.0.0.1:{port}/health")
    assert (status, json.loads(body)) == (200, {"health": "true", "reason": ""})
