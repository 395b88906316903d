"""What a brain cluster does when its journal's NATS cluster misbehaves, and
what `brain serve --journal-url` refuses.

- NATS loses its quorum: writes fail with etcd's texts (request timed
  out / no leader), serializable reads keep answering from every replica,
  nothing acknowledged is lost, and writes work again once NATS is back;
  the gRPC health service says NOT_SERVING on every replica meanwhile (a
  load balancer sends clients elsewhere), to open Watch streams too, and
  SERVING again afterwards;
- a stream with settings that would drop journal records is refused with a
  message that says which and what to do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.grpc.health.v1 import health_pb2 as health
from brain.api.pb.grpc.health.v1 import health_pb2_grpc
from tests.support import servers
from tests.support.brain_cluster import BrainCluster

ETCD_UNAVAILABLE_TEXTS = (
    "etcdserver: request timed out",
    "etcdserver: request timed out, possibly due to previous leader failure",
    "etcdserver: no leader",
    "etcdserver: leader changed",
)


def _put(endpoint: str, key: bytes, value: bytes, timeout: float = 15.0):
    with servers.kv_stub(endpoint) as st:
        return st.kv.Put(pb.PutRequest(key=key, value=value), timeout=timeout)


def _get(endpoint: str, key: bytes, serializable: bool, timeout: float = 10.0):
    with servers.kv_stub(endpoint) as st:
        return st.kv.Range(pb.RangeRequest(key=key, serializable=serializable), timeout=timeout)


def _health(endpoint: str) -> int:
    with grpc.insecure_channel(endpoint) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health.HealthCheckRequest(), timeout=5).status


def _wait_health(cluster, want: int, within: float) -> float:
    """Seconds until every replica's Check("") answers ``want``."""
    t0 = time.monotonic()
    pending = {m.name: m.endpoint for m in cluster.members}
    while pending:
        for name, endpoint in list(pending.items()):
            if _health(endpoint) == want:
                del pending[name]
        if pending:
            assert time.monotonic() - t0 < within, (
                f"health of {sorted(pending)} not {health.HealthCheckResponse.ServingStatus.Name(want)} "
                f"after {within}s\n{cluster.logs()}")
            time.sleep(0.1)
    return time.monotonic() - t0


class _HealthWatch:
    """A Watch("") stream read on a thread: the statuses it delivered."""

    def __init__(self, endpoint: str) -> None:
        self.statuses: list[int] = []
        self._ch = grpc.insecure_channel(endpoint)
        self._call = health_pb2_grpc.HealthStub(self._ch).Watch(health.HealthCheckRequest(), timeout=300)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for msg in self._call:
                self.statuses.append(msg.status)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._call.cancel()
        self._ch.close()


def test_nats_quorum_loss_fails_writes_keeps_serializable_reads(nats_cluster_factory):
    nats = nats_cluster_factory(3, sync_always=True)
    cluster = BrainCluster(3, nats, lifetime=600.0)
    cluster.start()
    try:
        acked = {}
        for i, m in enumerate(cluster.members * 4):
            key = b"q%d" % i
            acked[key] = _put(m.endpoint, key, b"v").header.revision
        _wait_health(cluster, health.HealthCheckResponse.SERVING, within=10)
        watch = _HealthWatch(cluster.members[0].endpoint)
        # the stream's first status must be read before NATS goes, or it may
        # already say NOT_SERVING on a loaded machine
        deadline = time.monotonic() + 10
        while not watch.statuses and time.monotonic() < deadline:
            time.sleep(0.05)
        down = nats.nodes[:2]
        for n in down:
            nats.kill9(n)
        t0 = time.monotonic()
        # the leader's key goes unrenewed: no replica knows a leader after
        # the election timeout (2 s) and a poll
        took = _wait_health(cluster, health.HealthCheckResponse.NOT_SERVING, within=15)
        print(f"\nevery replica NOT_SERVING {took:.1f}s after NATS lost its quorum")
        for m in cluster.members:
            with pytest.raises(grpc.RpcError) as e:
                _put(m.endpoint, b"during", b"x", timeout=20)
            assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e.value
            if e.value.code() == grpc.StatusCode.UNAVAILABLE:
                assert e.value.details() in ETCD_UNAVAILABLE_TEXTS, e.value.details()
        print(f"\nwrites refused for {time.monotonic() - t0:.1f}s on 3 replicas without a NATS quorum")
        for m in cluster.members:
            r = _get(m.endpoint, b"q3", serializable=True)
            assert r.kvs and r.kvs[0].mod_revision == acked[b"q3"]
            with pytest.raises(grpc.RpcError):
                _get(m.endpoint, b"q3", serializable=False, timeout=10)
        for n in down:
            nats.restart(n)
        deadline = time.monotonic() + 60
        while True:
            try:
                res = _put(cluster.members[0].endpoint, b"after", b"y", timeout=10)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "writes did not come back after NATS did\n" + cluster.logs()
                time.sleep(0.5)
        print(f"writes back {time.monotonic() - t0:.1f}s after the quorum loss began")
        _wait_health(cluster, health.HealthCheckResponse.SERVING, within=30)
        deadline = time.monotonic() + 5
        while watch.statuses[-1:] != [health.HealthCheckResponse.SERVING] and time.monotonic() < deadline:
            time.sleep(0.1)
        watch.close()
        # SERVING, NOT_SERVING (perhaps more than once), SERVING again
        statuses = [k for i, k in enumerate(watch.statuses) if i == 0 or k != watch.statuses[i - 1]]
        assert statuses[0] == health.HealthCheckResponse.SERVING, watch.statuses
        assert health.HealthCheckResponse.NOT_SERVING in statuses[1:], watch.statuses
        assert statuses[-1] == health.HealthCheckResponse.SERVING, watch.statuses
        for m in cluster.members:
            try:
                for key, rev in acked.items():
                    r = _get(m.endpoint, key, serializable=False, timeout=15)
                    assert r.kvs and r.kvs[0].mod_revision == rev, (m.name, key)
                assert _get(m.endpoint, b"after", serializable=False).kvs[0].mod_revision == res.header.revision
            except grpc.RpcError as e:
                pytest.fail(f"linearizable read on {m.name} after NATS came back: {e.details()}\n{cluster.logs()}")
    finally:
        cluster.cleanup()


def test_a_stream_that_would_drop_records_is_refused(nats_cluster_factory, tmp_path):
    nats = nats_cluster_factory(1)
    name = "refused"
    resp = nats.js_request(f"$JS.API.STREAM.CREATE.{name}_journal", {
        "name": f"{name}_journal", "subjects": [f"{name}.journal"], "storage": "file", "num_replicas": 1,
        "max_age": 3600 * 10**9, "retention": "limits", "discard": "old"})
    assert "error" not in resp, resp
    port = servers.free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "brain", "serve", "--data-dir", str(tmp_path / "d"),
         "--listen-client-urls", f"http://127.0.0.1:{port}", "--journal-url", f"{nats.urls[0]}/{name}"],
        cwd=str(servers.REPO_ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "refused_journal exists with settings a brain journal cannot use" in proc.stderr
    assert "max_age is 3600s" in proc.stderr and "choose another cluster name" in proc.stderr
    # and nothing was written to the stream
    info = nats.stream_info(f"{name}_journal")
    assert info["state"]["messages"] == 0, json.dumps(info["state"])
