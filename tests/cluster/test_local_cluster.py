"""`make cluster` (deploy/local-cluster.sh) as the demo the README promises:
kill -9 the leader and the cluster goes on.

The script runs on ports this test gives it (client ports) and ports it
finds free (PORTS=free for the rest), prints "up" only once every replica
lists every member; the leader is killed with kill -9, a write goes through
another replica, the script reports the death and starts the replica again
(RESTART_DELAY=1), which catches up; SIGTERM stops everything and the
script says it was stopped (not that "a process exited").
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support import binaries
from tests.support.harness import free_port

pytestmark = pytest.mark.timeout(240)

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local-cluster.sh"
ROW = re.compile(r"^  (b\d)  client 127\.0\.0\.1:(\d+)  metrics 127\.0\.0\.1:(\d+)  pid (\d+)$", re.M)


class Script:
    """deploy/local-cluster.sh running, its output in a file."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.out_path = tmp_path / "local-cluster.out"
        self.dir = tmp_path / "cluster"
        full = dict(os.environ, DIR=str(self.dir), PYTHON=sys.executable,
                    NATS_SERVER=binaries.require(binaries.nats_server_binary), **env)
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(["bash", str(SCRIPT)], env=full, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.output(), re.M)
            if m:
                return m
            assert self.proc.poll() is None, f"the script exited {self.proc.returncode}:\n{self.output()}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output()}")

    def close(self) -> None:
        """Stop it as a user would (SIGTERM), then by force; the servers run
        in sessions of their own, so any it left are found by its pid files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for f in self.dir.glob("*.pid"):
            pid = int(f.read_text().strip() or 0)
            if pid and _alive(pid) and str(self.dir) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)


def _stubs(port: int):
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    return ch, rpc_pb2_grpc.KVStub(ch), rpc_pb2_grpc.ClusterStub(ch), rpc_pb2_grpc.MaintenanceStub(ch)


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"no {name} in the metrics"
    return float(m.group(1))


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def test_the_cluster_survives_a_leader_kill_and_the_replica_rejoins(tmp_path):
    client_ports = [free_port() for _ in range(3)]
    script = Script(tmp_path, CLIENT_PORTS=",".join(map(str, client_ports)), PORTS="free", RESTART_DELAY="1")
    try:
        leader = script.wait_for(r"^brain cluster up, leader (b\d):$", 150).group(1)
        found = ROW.findall(script.output())
        rows = {name: (int(port), int(pid)) for name, port, _, pid in found}
        metrics_ports = {name: int(port) for name, _, port, _ in found}
        assert sorted(p for p, _ in rows.values()) == sorted(client_ports), script.output()
        endpoints = {f"127.0.0.1:{p}" for p in client_ports}
        # "up": every replica lists every member, and the one named leads
        for name, (port, pid) in rows.items():
            ch, kv, cluster, maint = _stubs(port)
            with ch:
                members = cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=5).members
                st = maint.Status(rpc_pb2.StatusRequest(), timeout=5)
            assert {u.split("://")[-1] for m in members for u in m.clientURLs} == endpoints, (name, members)
            assert (st.leader == st.header.member_id) == (name == leader), (name, leader)
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
            # PYTHON as given: a venv's python is a symlink that must not be resolved away from the venv
            assert argv[0] == sys.executable and argv[argv.index("--name") + 1] == name, argv

        # a Txn through a follower reaches the leader as its client's bytes
        follower = next(n for n in rows if n != leader)
        ch, kv, _, _ = _stubs(rows[follower][0])
        with ch:
            txn = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(
                request_put=rpc_pb2.PutRequest(key=b"/demo/txn", value=b"t"))])
            assert kv.Txn(txn, timeout=10).succeeded
        assert _metric(metrics_ports[follower], "brain_cluster_forwarded_txn_bytes_total") >= 1

        port, pid = rows[leader]
        os.kill(pid, signal.SIGKILL)
        other = next(p for n, (p, _) in rows.items() if n != leader)
        ch, kv, _, _ = _stubs(other)
        with ch:
            deadline = time.monotonic() + 30
            while True:
                try:
                    put = kv.Put(rpc_pb2.PutRequest(key=b"/demo/after-kill", value=b"v"), timeout=5)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "no write went through the cluster 30 s after the kill"
                    time.sleep(0.2)
        script.wait_for(rf"^\d\d:\d\d:\d\d {leader} \(client 127\.0\.0\.1:{port} .*pid {pid}\) was killed by "
                        r"SIGKILL after \d+s; the others go on serving\.$", 30)
        new_pid = int(script.wait_for(rf"^\d\d:\d\d:\d\d {leader} started again, pid (\d+)$", 30).group(1))
        assert new_pid != pid and _alive(new_pid)

        # the restarted replica rejoins and catches up: it serves the write made while it was down
        ch, kv, _, _ = _stubs(port)
        with ch:
            deadline = time.monotonic() + 60
            while True:
                try:
                    got = kv.Range(rpc_pb2.RangeRequest(key=b"/demo/after-kill"), timeout=5)
                    if got.kvs and got.header.revision >= put.header.revision:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "the restarted replica did not catch up within 60 s"
                time.sleep(0.3)
        assert got.kvs[0].value == b"v" and got.kvs[0].mod_revision == put.header.revision

        pids = [p for n, (_, p) in rows.items() if n != leader] + [new_pid]
        pids += [int(p) for p in re.findall(r"^  n\d  nats .*pid (\d+)$", script.output(), re.M)]
        script.proc.send_signal(signal.SIGTERM)
        assert script.proc.wait(60) == 0, script.output()
        out = script.output()
        assert "SIGTERM: stopping the replicas, then the nats-servers..." in out and "\nstopped." in out, out
        assert "a process exited" not in out and "Killed" not in out, out
        assert not [p for p in pids if _alive(p)], "processes left after the stop"
    finally:
        script.close()


def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        script = Script(tmp_path, CLIENT_PORTS=f"{taken},{free_port()},{free_port()}")
        try:
            assert script.proc.wait(60) == 2
        finally:
            script.close()
    assert f"CLIENT_PORTS: 127.0.0.1:{taken} is taken" in script.output(), script.output()
