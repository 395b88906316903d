"""grpc.health.v1.Health (brain.api.health) on every front and listener
kind, over a real engine: the answers grpc-go's health server gives (what
etcd serves; tests/integration/test_health_vs_etcd.py compares with a real
etcd), NOT_SERVING told to watchers at shutdown while new Checks are
refused, and a cluster replica's leader and journal read through the one
interface the service uses (``Replica.serving_problem``)."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from brain import clock as lease_clock
from brain.api import native_front
from brain.api.health import HealthService
from brain.cluster.replica import Replica
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.pb.grpc.health.v1 import health_pb2 as h
from brain.api.pb.grpc.health.v1 import health_pb2_grpc
from brain.api.server import ApiServer
from brain.config import ServerConfig
from brain.engine import Engine, EngineConfig
from tests.support.servers import unavailable
from tests.support.tls import channel, make_test_pki, transports_from_env

SERVING, NOT_SERVING, SERVICE_UNKNOWN = (h.HealthCheckResponse.SERVING, h.HealthCheckResponse.NOT_SERVING,
                                         h.HealthCheckResponse.SERVICE_UNKNOWN)

FRONTS = [f"native-{t}" for t in transports_from_env()] + ["grpcio"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=FRONTS)
def front(request):
    if request.param.startswith("native") and not native_front.available():
        unavailable(native_front.unavailable_message())
    return request.param


@pytest.fixture
def engine(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    yield eng
    eng.close()


def _config(front: str, pki, sock_dir, **kw) -> ServerConfig:
    kind = "http" if front == "grpcio" else front.removeprefix("native-")
    kw["grpc_front"] = "grpcio" if front == "grpcio" else "native"
    if kind == "mtls":
        kw.update(listen_client_urls=["https://127.0.0.1:0"], cert_file=str(pki.server.cert),
                  key_file=str(pki.server.key), trusted_ca_file=str(pki.ca.cert), client_cert_auth=True)
    elif kind == "unix":
        kw.update(listen_client_urls=[f"unix://{sock_dir}/brain.sock"])
    else:
        kw.update(listen_client_urls=["http://127.0.0.1:0"])
    kw.setdefault("grpc_workers", 8)
    return ServerConfig(data_dir=str(sock_dir / "data"), **kw)


def _channel(api: ApiServer, pki, options=()) -> grpc.Channel:
    ep = api.endpoints[0]
    if ep.startswith("unix://"):
        return channel("unix:" + ep.removeprefix("unix://"), options=options)
    if ep.startswith("https://"):
        return channel(ep.removeprefix("https://"), pki, options=options)
    return channel(ep.removeprefix("http://"), options=options)


@pytest.fixture
def serve(engine, front, pki, tmp_path):
    """serve(cluster=None) -> (ApiServer, health stub); stopped after the test."""
    started = []

    def make(cluster=None, **kw):
        api = ApiServer(engine, _config(front, pki, tmp_path, **kw), replica=cluster)
        api.start()
        ch = _channel(api, pki)
        started.append((api, ch))
        return api, health_pb2_grpc.HealthStub(ch)

    yield make
    for api, ch in started:
        ch.close()
        api.stop(0)


class _Watch:
    """A health Watch stream read on a thread of its own."""

    def __init__(self, stub, service: str = "") -> None:
        self.call = stub.Watch(h.HealthCheckRequest(service=service), timeout=60)
        self.statuses: queue.Queue = queue.Queue()
        self.ended: grpc.RpcError | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for r in self.call:
                self.statuses.put(r.status)
        except grpc.RpcError as e:
            self.ended = e
        finally:
            self.done.set()

    def next(self, timeout: float = 5.0) -> int:
        return self.statuses.get(timeout=timeout)

    def nothing_within(self, seconds: float) -> bool:
        try:
            self.statuses.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


def _code(fn, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, timeout=10)
    return ei.value.code(), ei.value.details()


# -- a single node -----------------------------------------------------------------------


def test_answers_are_grpc_gos(serve):
    _api, health = serve()
    assert health.Check(h.HealthCheckRequest(), timeout=10).status == SERVING
    assert _code(health.Check, h.HealthCheckRequest(service="unknown")) == (grpc.StatusCode.NOT_FOUND,
                                                                            "unknown service")
    assert _code(health.Check, h.HealthCheckRequest(service="etcdserverpb.KV")) == (grpc.StatusCode.NOT_FOUND,
                                                                                    "unknown service")
    listed = health.List(h.HealthListRequest(), timeout=10)
    assert {k: v.status for k, v in listed.statuses.items()} == {"": SERVING}
    everything, unknown = _Watch(health), _Watch(health, "unknown")
    assert (everything.next(), unknown.next()) == (SERVING, SERVICE_UNKNOWN)
    assert everything.nothing_within(0.5) and unknown.nothing_within(0.1), "no change, yet a second message"
    everything.call.cancel()
    unknown.call.cancel()


def test_many_watch_streams_end_when_cancelled(serve, front):
    """On the native front a stream holds no thread: more streams than its
    pool has threads (16) are served; grpcio needs a worker for each."""
    api, health = serve(grpc_workers=32 if front == "grpcio" else 8)
    watches = [_Watch(health) for _ in range(20)]
    assert [w.next() for w in watches] == [SERVING] * 20
    assert health.Check(h.HealthCheckRequest(), timeout=10).status == SERVING  # nothing is starved
    for w in watches:
        w.call.cancel()
    assert all(w.done.wait(5) for w in watches)
    deadline = time.monotonic() + 5
    while api.health._watchers and time.monotonic() < deadline:  # cancellation reaches the service
        time.sleep(0.02)
    assert not api.health._watchers


def _hold_the_grace(api: ApiServer, pki, engine) -> tuple[grpc.Channel, object]:
    """A Snapshot stream whose client reads one message and no more (its
    flow-control window kept at 64 KiB): the server cannot finish it, so
    stop() waits out its grace period."""
    for i in range(12):
        engine.put(_put(b"big/%d" % i, b"x" * (1 << 20)))
    ch = _channel(api, pki, options=[("grpc.http2.bdp_probe", 0)])
    snap = rpc_pb2_grpc.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=60)
    assert next(snap).blob
    return ch, snap


def _put(key: bytes, value: bytes):
    from brain.mvcc.requests import PutRequest

    return PutRequest(key, value)


def test_shutdown_tells_watchers_not_serving_and_refuses_new_checks(serve, engine, pki):
    api, health = serve()
    watch = _Watch(health)
    assert watch.next() == SERVING
    snap_ch, snap = _hold_the_grace(api, pki, engine)
    stopper = threading.Thread(target=api.stop, args=(30.0,), daemon=True)
    stopper.start()
    try:
        assert watch.next() == NOT_SERVING  # told at once, during the grace period
        assert watch.done.wait(5) and watch.ended.code() == grpc.StatusCode.UNAVAILABLE
        code, _ = _code(health.Check, h.HealthCheckRequest())  # new calls are refused, as on etcd
        assert code == grpc.StatusCode.UNAVAILABLE
        assert stopper.is_alive(), "the grace period ended early: the Check above was not made during it"
    finally:
        snap.cancel()
        snap_ch.close()
    stopper.join(30)
    assert not stopper.is_alive()


# -- a cluster replica ------------------------------------------------------------------


class _FakeReplica:
    """A brain.cluster.Replica's connection and election, which its
    serving_problem and has_leader read."""

    def __init__(self) -> None:
        self.conn = SimpleNamespace(is_connected=True)
        self.election = SimpleNamespace(leader_id=0x1234, timeout=2.0, last_answer=lease_clock.now())
        self.cannot_lead = None

    serving_problem = Replica.serving_problem
    has_leader = Replica.has_leader


def test_has_leader_needs_a_recent_answer_from_nats():
    """A replica whose NATS servers stopped answering without closing the
    connection (paused, partitioned) keeps its last view of the leader:
    it has none once that view is older than the election timeout."""
    r = _FakeReplica()
    assert r.has_leader()
    r.election.last_answer = lease_clock.now() - 2.5
    assert not r.has_leader()
    assert r.serving_problem() == "no leader"
    r.election.last_answer = lease_clock.now()
    r.election.leader_id = 0
    assert not r.has_leader()


def test_serving_problem_reads_the_leader_and_the_journal():
    r = _FakeReplica()
    assert r.serving_problem() is None
    r.election.leader_id = 0
    assert r.serving_problem() == "no leader"
    r.conn.is_connected = False
    assert r.serving_problem() == "journal unreachable"
    r.election.leader_id = 7
    assert r.serving_problem() == "journal unreachable"
    r.cannot_lead = "journal record 9 cannot be applied"
    assert r.serving_problem() == "this replica refuses writes until restarted"


def test_a_replica_without_leader_or_journal_is_not_serving(serve):
    replica = _FakeReplica()
    _api, health = serve(cluster=replica)

    def check():
        return health.Check(h.HealthCheckRequest(), timeout=10).status

    watch = _Watch(health)
    assert (check(), watch.next()) == (SERVING, SERVING)
    replica.election.leader_id = 0  # the leader's key expired
    assert check() == NOT_SERVING
    assert watch.next(timeout=5) == NOT_SERVING  # the service polls the replica while someone watches
    assert {k: v.status for k, v in health.List(h.HealthListRequest(), timeout=10).statuses.items()} == {
        "": NOT_SERVING}
    replica.election.leader_id = 0x5678  # a new leader
    assert watch.next(timeout=5) == SERVING and check() == SERVING
    replica.conn.is_connected = False  # NATS gone
    assert watch.next(timeout=5) == NOT_SERVING and check() == NOT_SERVING
    replica.conn.is_connected = True
    assert watch.next(timeout=5) == SERVING
    assert watch.nothing_within(0.5), "a status sent twice"
    watch.call.cancel()


def test_health_service_sends_changes_only():
    """The service alone: one message per change, unknown names left alone
    at shutdown (grpc-go only changes the names it knows), end_streams."""
    state = {"problem": None}
    svc = HealthService(lambda: state["problem"], poll_interval=3600)  # refreshed by hand below
    got, other, ended = [], [], []
    cancel = svc.watch(h.HealthCheckRequest(), got.append, end=lambda: ended.append("all"))
    svc.watch(h.HealthCheckRequest(service="x"), other.append, end=lambda: ended.append("x"))
    svc.refresh()
    state["problem"] = "no leader"
    svc.refresh()
    svc.refresh()
    state["problem"] = None
    svc.refresh()
    assert got == [SERVING, NOT_SERVING, SERVING]
    svc.shutdown()
    state["problem"] = None
    svc.refresh()  # nothing brings a server that is stopping back
    assert got == [SERVING, NOT_SERVING, SERVING, NOT_SERVING] and other == [SERVICE_UNKNOWN]
    cancel()
    svc.end_streams()
    assert ended == ["x"]  # the cancelled watcher is gone
    svc.close()


def test_the_replica_is_polled_only_while_someone_watches():
    calls = []
    svc = HealthService(lambda: calls.append(1), poll_interval=0.01)
    time.sleep(0.1)
    assert calls == [] and svc._monitor is None  # nobody asked
    cancel = svc.watch(h.HealthCheckRequest(), lambda status: None)
    time.sleep(0.2)
    assert len(calls) > 3, "a watcher of '' is not kept informed"
    cancel()
    deadline = time.monotonic() + 5
    while svc._monitor is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert svc._monitor is None, "still polling with nobody watching"
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n
    svc.close()
