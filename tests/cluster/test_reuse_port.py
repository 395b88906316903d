"""Replicas of one cluster on one machine can share a client port
(etcd's --socket-reuse-port): the kernel spreads connections over them, so
reads and watches use every replica's core while clients keep one address."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from tests.support import servers


def test_two_replicas_share_one_port(nats1, tmp_path):
    port = servers.free_port()
    procs, logs = [], []
    try:
        for i in range(2):
            logs.append(log := open(tmp_path / f"b{i}.log", "wb"))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "brain", "serve", "--name", f"b{i}", "--data-dir", str(tmp_path / f"d{i}"),
                 "--listen-client-urls", f"http://127.0.0.1:{port}", "--socket-reuse-port",
                 "--journal-url", f"{nats1.urls[0]}/reuse"],
                cwd=str(servers.REPO_ROOT), stdout=log, stderr=subprocess.STDOUT))
        members: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while len(members) < 2 and time.monotonic() < deadline:
            for _ in range(20):
                try:
                    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                        st = rpc_pb2_grpc.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=2)
                except grpc.RpcError:
                    time.sleep(0.2)
                    continue
                if st.leader:
                    members[st.header.member_id] = members.get(st.header.member_id, 0) + 1
        assert len(members) == 2, (members, [(tmp_path / f"b{i}.log").read_text()[-2000:] for i in range(2)])
        # one address, two replicas: a write through either is read through either
        revs = []
        for i in range(20):
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                kv = rpc_pb2_grpc.KVStub(ch)
                revs.append(kv.Put(pb.PutRequest(key=b"k%d" % i, value=b"v"), timeout=10).header.revision)
                assert kv.Range(pb.RangeRequest(key=b"k%d" % i), timeout=10).kvs[0].mod_revision == revs[-1]
        assert revs == sorted(revs) and len(set(revs)) == 20
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()


def test_without_the_flag_a_taken_port_is_refused(tmp_path):
    with servers.BrainServer() as first:
        port = first.port
        out = subprocess.run([sys.executable, "-m", "brain", "serve", "--data-dir", str(tmp_path / "d"),
                              "--listen-client-urls", f"http://127.0.0.1:{port}"],
                             cwd=str(servers.REPO_ROOT), capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "address already in use" in out.stderr, out.stderr
