"""grpc.health.v1.Health: brain's answers next to a real etcd's.

The same calls go to etcd 3.6.16 (and Debian's etcd 3.4 where it has the
method) and to `brain serve` on every listener kind of the native front
(http, https with client certificates, unix) and on grpcio: codes, texts
and statuses must be the same.  Then both are stopped with SIGTERM while a
health Watch is open, and what a client sees during the grace period is
compared.  Where brain knowingly differs (brain.api.health says why):

* its open health watchers are told NOT_SERVING as the grace begins, then
  the stream ends with UNAVAILABLE; etcd's hear nothing until etcd closes
  the connection at the end of its grace;
* a Check sent during the grace: UNAVAILABLE from both, but etcd's text is
  the client's own (etcd closed its listener and sent GOAWAY), brain's is
  "brain: server is shutting down" on the native front (its listener stays
  open until the grace ends);
* List: brain answers as etcd 3.6 does; etcd 3.4's grpc-go predates List.
"""

from __future__ import annotations

import queue
import signal
import threading
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.pb.grpc.health.v1 import health_pb2 as h
from brain.api.pb.grpc.health.v1 import health_pb2_grpc
from tests.support.servers import (BrainServer, Endpoint, free_port, grpc_channel, require_brain, require_etcd,
                                   shared_pki, start_etcd)

SERVING, NOT_SERVING = h.HealthCheckResponse.SERVING, h.HealthCheckResponse.NOT_SERVING
SHUTTING_DOWN = "brain: server is shutting down"


def _brain(front: str, **kw) -> BrainServer:
    """brain on http, https (mutual TLS) and unix listeners at once; grpcio
    on http alone."""
    require_brain()
    srv = BrainServer(shards=1, **kw)
    urls = [srv.client_url]
    extra = ["--grpc-front", front]
    if front == "native":
        srv.tls_port = free_port()
        srv.sock = f"{srv.root}/health.sock"
        urls += [f"https://127.0.0.1:{srv.tls_port}", f"unix://{srv.sock}"]
        extra += shared_pki().server_flags()
    srv.extra_args = ["--listen-client-urls", ",".join(urls), *extra, *srv.extra_args]
    try:
        srv.start()
    except BaseException:
        srv.cleanup()
        raise
    return srv


def _endpoints(srv: BrainServer, front: str) -> dict[str, str]:
    eps = {"http": srv.endpoint}
    if front == "native":
        eps["mtls"] = Endpoint(f"127.0.0.1:{srv.tls_port}", shared_pki())
        eps["unix"] = f"unix://{srv.sock}"
    return eps


def _outcome(fn) -> tuple:
    try:
        return ("ok", fn())
    except grpc.RpcError as e:
        return (e.code().name, e.details())


def _first(stream) -> tuple:
    def read():
        try:
            return h.HealthCheckResponse.ServingStatus.Name(next(stream).status)
        finally:
            stream.cancel()

    return _outcome(read)


def _answers(endpoint: str, with_list: bool = True) -> dict:
    """What a health client learns from ``endpoint``."""
    ch = grpc_channel(endpoint)
    try:
        stub = health_pb2_grpc.HealthStub(ch)

        def check(service):
            return h.HealthCheckResponse.ServingStatus.Name(
                stub.Check(h.HealthCheckRequest(service=service), timeout=10).status)

        out = {
            "Check ''": _outcome(lambda: check("")),
            "Check 'unknown'": _outcome(lambda: check("unknown")),
            "Check 'etcdserverpb.KV'": _outcome(lambda: check("etcdserverpb.KV")),
            "Watch '' first": _first(stub.Watch(h.HealthCheckRequest(), timeout=10)),
            "Watch 'unknown' first": _first(stub.Watch(h.HealthCheckRequest(service="unknown"), timeout=10)),
        }
        if with_list:
            out["List"] = _outcome(lambda: {k: h.HealthCheckResponse.ServingStatus.Name(v.status) for k, v in
                                            stub.List(h.HealthListRequest(), timeout=10).statuses.items()})
        return out
    finally:
        ch.close()


@pytest.fixture(scope="module")
def etcd36():
    require_etcd("3.6")
    srv = start_etcd(version="3.6")
    yield srv
    srv.cleanup()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def brain(request):
    srv = _brain(request.param)
    srv.front = request.param
    yield srv
    srv.cleanup()


def test_health_answers_match_etcd_36_on_every_listener(etcd36, brain):
    want = _answers(etcd36.endpoint)
    assert want == {  # what etcd 3.6.16 answers, so that a change of it is seen here
        "Check ''": ("ok", "SERVING"),
        "Check 'unknown'": ("NOT_FOUND", "unknown service"),
        "Check 'etcdserverpb.KV'": ("NOT_FOUND", "unknown service"),
        "Watch '' first": ("ok", "SERVING"),
        "Watch 'unknown' first": ("ok", "SERVICE_UNKNOWN"),
        "List": ("ok", {"": "SERVING"}),
    }
    for kind, endpoint in _endpoints(brain, brain.front).items():
        assert _answers(endpoint) == want, f"brain ({brain.front}, {kind}) differs from etcd 3.6"


def test_health_answers_match_etcd_34(brain):
    require_etcd("3.4")
    etcd = start_etcd(version="3.4")
    try:
        want = _answers(etcd.endpoint, with_list=False)
        assert _answers(brain.endpoint, with_list=False) == want
        stub = health_pb2_grpc.HealthStub(grpc_channel(etcd.endpoint))
        assert _outcome(lambda: stub.List(h.HealthListRequest(), timeout=10)) == (
            "UNIMPLEMENTED", "unknown method List for service grpc.health.v1.Health")  # brain answers as 3.6
    finally:
        etcd.cleanup()


def test_an_unknown_health_method_matches_etcd_36(etcd36, brain):
    def nope(endpoint):
        ch = grpc_channel(endpoint)
        try:
            return _outcome(lambda: ch.unary_unary("/grpc.health.v1.Health/Nope")(b"", timeout=10))
        finally:
            ch.close()

    want = nope(etcd36.endpoint)
    assert want == ("UNIMPLEMENTED", "unknown method Nope for service grpc.health.v1.Health")
    if brain.front == "grpcio":  # grpcio's own text for every unknown method, not only these
        assert nope(brain.endpoint) == ("UNIMPLEMENTED", "Method not found!")
    else:
        assert nope(brain.endpoint) == want


# -- shutdown ------------------------------------------------------------------------


class _Watch:
    def __init__(self, endpoint: str) -> None:
        self.ch = grpc_channel(endpoint)
        self.call = health_pb2_grpc.HealthStub(self.ch).Watch(h.HealthCheckRequest(), timeout=60)
        self.got: queue.Queue = queue.Queue()
        self.ended: tuple | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for r in self.call:
                self.got.put(r.status)
            self.ended = ("OK", "")
        except grpc.RpcError as e:
            self.ended = (e.code().name, e.details())
        finally:
            self.done.set()

    def messages(self) -> list[int]:
        out = []
        while not self.got.empty():
            out.append(self.got.get())
        return out


def _check_on_a_new_channel(endpoint: str) -> tuple:
    ch = grpc_channel(endpoint)
    try:
        return _outcome(lambda: health_pb2_grpc.HealthStub(ch).Check(h.HealthCheckRequest(), timeout=3).status)
    finally:
        ch.close()


def _during_grace(srv, watch: _Watch) -> dict:
    """SIGTERM ``srv``, then what a client sees while it is still running."""
    assert watch.got.get(timeout=10) == SERVING
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    seen = {"watch messages": watch.messages(), "watch ended": watch.ended,
            "new Check": _check_on_a_new_channel(srv.endpoint)[0]}
    assert srv.proc.poll() is None, f"{srv.kind} exited within 1 s: its grace period did not hold"
    return seen


def test_shutdown_seen_by_a_health_client_of_etcd_36():
    require_etcd("3.6")
    etcd = start_etcd(version="3.6")
    try:
        # etcd's GracefulStop waits for every open stream, the health Watch too
        watch = _Watch(etcd.endpoint)
        etcd_seen = _during_grace(etcd, watch)
        assert etcd_seen == {"watch messages": [], "watch ended": None, "new Check": "UNAVAILABLE"}
        assert watch.done.wait(20), "etcd never ended the health Watch"
        assert watch.ended[0] == "UNAVAILABLE"
        assert watch.messages() == []  # not even at the end: etcd's status stays SERVING
        watch.ch.close()
    finally:
        etcd.cleanup()


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_shutdown_seen_by_a_health_client_of_brain(front):
    """brain's side of the comparison above; its grace is held by a
    Snapshot stream whose client stops reading (its flow-control window
    kept at 64 KiB: the server cannot hand the 12 MiB over)."""
    srv = _brain(front, extra_args=["--shutdown-grace", "30"])
    try:
        ch = grpc_channel(srv.endpoint, options=[("grpc.max_send_message_length", 8 << 20),
                                                 ("grpc.http2.bdp_probe", 0)])
        kv = rpc_pb2_grpc.KVStub(ch)
        for i in range(12):
            kv.Put(pb.PutRequest(key=b"big/%d" % i, value=b"x" * (1 << 20)), timeout=30)
        snap = rpc_pb2_grpc.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=120)
        assert next(snap).blob
        watch = _Watch(srv.endpoint)
        seen = _during_grace(srv, watch)
        assert seen == {"watch messages": [NOT_SERVING], "watch ended": ("UNAVAILABLE", SHUTTING_DOWN),
                        "new Check": "UNAVAILABLE"}
        started = time.monotonic()
        snap.cancel()  # the last call in flight: the grace ends with it
        assert srv.proc.wait(timeout=20) == 0
        assert time.monotonic() - started < 10, "the grace outlived the last call"
        ch.close()
        watch.ch.close()
    finally:
        srv.cleanup()
