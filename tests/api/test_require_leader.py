"""etcd's require-leader (brain.api.require_leader) on both transports.

The arithmetic and the metadata rule are tested alone; then a real engine
behind an ApiServer whose leader comes and goes by a switch
(``engine.has_leader``, from the cluster hooks brain.cluster.Replica gives its engine): calls with
``hasleader: true`` are refused without a leader with etcd's code and text,
open ones are ended after three checks without one, and calls without the
metadata never notice.  The cluster test (tests/cluster/test_require_leader.py)
does the same with a real lost leader, beside etcd."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from brain.api import native_front
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.require_leader import LeaderMonitor, NoLeaderCount, requires_leader
from brain.api.server import ApiServer
from brain.config import ServerConfig
from brain.engine import ClusterHooks, Engine, EngineConfig
from tests.support.servers import unavailable

HASLEADER = (("hasleader", "true"),)
CHECK_INTERVAL = 0.2  # the engine's "election timeout": the monitor checks this often


def test_metadata_rule_is_etcds():
    assert requires_leader([("hasleader", "true")])
    assert requires_leader([("x", "1"), ("hasleader", "true"), ("hasleader", "false")])
    assert not requires_leader([("hasleader", "false"), ("hasleader", "true")])  # the first value counts
    assert not requires_leader([("hasleader", "True")])
    assert not requires_leader([])
    assert not requires_leader(None)


def test_count_ends_streams_after_three_checks_without_a_leader():
    c = NoLeaderCount()
    assert [c.check(h) for h in (False, False, True, False, False)] == [False] * 5  # a leader restarts it
    assert c.check(False)  # the third in a row
    assert c.check(False)  # and every one after, while it lasts
    assert not c.check(True)


def test_monitor_cancels_every_registered_stream_once():
    leader = [True]
    monitor = LeaderMonitor(lambda: leader[0])
    ended = []
    monitor.watch(lambda: ended.append("a"))
    forget_b = monitor.watch(lambda: ended.append("b"))
    forget_b()  # ended on its own: not cancelled later
    assert monitor.check_now() == 0
    leader[0] = False
    assert [monitor.check_now() for _ in range(3)] == [0, 0, 1]
    assert ended == ["a"] and monitor.cancelled == 1
    assert monitor.check_now() == 0  # nothing left to end
    monitor.watch(lambda: ended.append("c"))  # opened while the leader was lost (a race with the refusal)
    assert monitor.check_now() == 1 and ended == ["a", "c"]


def test_a_failing_cancel_does_not_spare_the_others():
    monitor = LeaderMonitor(lambda: False, checks=1)
    ended = []

    def broken():
        raise RuntimeError("boom")

    monitor.watch(broken)
    monitor.watch(lambda: ended.append(1))
    assert monitor.check_now() == 2 and ended == [1]


# -- a real engine and server -------------------------------------------------


class LeaderSwitch:
    def __init__(self) -> None:
        self.present = True

    def __call__(self) -> bool:
        return self.present


class Switched:
    """A single-node engine whose leader comes and goes as ``switch`` says:
    what a replica's cluster hooks (brain.engine.ClusterHooks) tell its
    engine, checked every CHECK_INTERVAL."""

    def __init__(self, engine: Engine, switch: LeaderSwitch) -> None:
        self._engine = engine
        self._switch = switch
        self.cluster = ClusterHooks(forwarder=lambda: None, leader_hint=lambda: 0, has_leader=switch,
                                    election_timeout=CHECK_INTERVAL, role_changed=lambda: None)

    @property
    def has_leader(self) -> bool:
        return self._switch()

    @property
    def election_timeout(self) -> float:
        return CHECK_INTERVAL

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture(params=["native", "grpcio"])
def served(request, tmp_path):
    if request.param == "native" and not native_front.available():
        unavailable("brain._transport is not built")
    engine = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    switch = LeaderSwitch()
    eng = Switched(engine, switch)
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=["http://127.0.0.1:0"],
                                      grpc_workers=8, grpc_front=request.param))
    srv.start()
    ch = grpc.insecure_channel(srv.endpoints[0].removeprefix("http://"))
    yield srv, switch, ch
    ch.close()
    srv.stop(1.0)
    engine.close()


def _watch(ch, metadata=()):
    """A Watch stream on key "w": its responses, read on a thread, into a list."""
    requests = _Requests()
    call = rpc_pb2_grpc.WatchStub(ch).Watch(requests, metadata=metadata)
    requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w")))
    got, done = [], threading.Event()

    def read():
        try:
            for r in call:
                got.append(r)
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.01)
    assert got and got[0].created, "the watch was created"
    return call, requests, got, done


class _Requests:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._items: list = []
        self._closed = False

    def put(self, item) -> None:
        with self._cv:
            self._items.append(item)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def __iter__(self):
        return self

    def __next__(self):
        with self._cv:
            while not self._items and not self._closed:
                self._cv.wait()
            if self._items:
                return self._items.pop(0)
            raise StopIteration


def _code(call_or_err) -> tuple:
    return call_or_err.code(), call_or_err.details()


def test_unary_calls_need_a_leader_only_with_the_metadata(served):
    _, switch, ch = served
    kv = rpc_pb2_grpc.KVStub(ch)
    kv.Put(pb.PutRequest(key=b"a", value=b"1"), metadata=HASLEADER, timeout=10)
    switch.present = False
    for call in (lambda: kv.Put(pb.PutRequest(key=b"a", value=b"2"), metadata=HASLEADER, timeout=10),
                 lambda: kv.Range(pb.RangeRequest(key=b"a", serializable=True), metadata=HASLEADER, timeout=10),
                 lambda: rpc_pb2_grpc.MaintenanceStub(ch).Status(pb.StatusRequest(), metadata=HASLEADER,
                                                                timeout=10)):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert _code(e.value) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
    # without the metadata nothing changes (a "false" value is no request either)
    kv.Put(pb.PutRequest(key=b"a", value=b"3"), timeout=10)
    kv.Put(pb.PutRequest(key=b"a", value=b"4"), metadata=(("hasleader", "false"),), timeout=10)
    assert kv.Range(pb.RangeRequest(key=b"a"), timeout=10).kvs[0].value == b"4"


def test_a_malformed_request_gets_the_parse_error_first(served):
    _, switch, ch = served
    switch.present = False
    put = ch.unary_unary("/etcdserverpb.KV/Put")
    with pytest.raises(grpc.RpcError) as e:
        put(b"\x0a\xff", metadata=HASLEADER, timeout=10)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert e.value.details().startswith("grpc: error unmarshalling request")


def test_a_stream_is_refused_at_once_without_a_leader(served):
    _, switch, ch = served
    switch.present = False
    call = rpc_pb2_grpc.WatchStub(ch).Watch(iter([]), metadata=HASLEADER, timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert _code(e.value) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")


def test_open_streams_end_after_three_checks_without_a_leader(served):
    srv, switch, ch = served
    required, req_in, _, required_done = _watch(ch, HASLEADER)
    plain, plain_in, plain_got, plain_done = _watch(ch)
    keepalive_in = _Requests()
    lease = rpc_pb2_grpc.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10)
    keepalive = rpc_pb2_grpc.LeaseStub(ch).LeaseKeepAlive(keepalive_in, metadata=HASLEADER)
    keepalive_in.put(pb.LeaseKeepAliveRequest(ID=lease.ID))
    assert next(keepalive).TTL == 60
    time.sleep(3 * CHECK_INTERVAL)  # a leader throughout: nothing ends
    assert not required_done.is_set()
    assert srv.transport_stats()["require_leader_streams"] == 2  # the plain watch is not counted
    switch.present = False
    lost = time.monotonic()
    assert required_done.wait(20)
    delay = time.monotonic() - lost
    assert _code(required) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
    assert 2 * CHECK_INTERVAL <= delay <= 20, delay  # three checks, the first within one interval
    if srv.front_kind == "grpcio":
        keepalive_in.put(pb.LeaseKeepAliveRequest(ID=lease.ID))  # grpcio's servicer waits on the client
    with pytest.raises(grpc.RpcError) as e:
        while True:
            next(keepalive)
    assert _code(e.value) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
    assert srv.leader_monitor.cancelled == 2
    st = srv.transport_stats()
    assert (st["require_leader_streams"], st["require_leader_ended"]) == (0, 2)
    body = srv.http_endpoints().answer("GET", "/metrics").body
    assert b"\nbrain_require_leader_streams 0.0\n" in body and b"\nbrain_require_leader_streams_ended_total 2.0\n" in body
    # the watch without the metadata is still open and still hears events
    switch.present = True
    rpc_pb2_grpc.KVStub(ch).Put(pb.PutRequest(key=b"w", value=b"x"), timeout=10)
    deadline = time.monotonic() + 20
    while not any(r.events for r in plain_got) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not plain_done.is_set() and any(r.events for r in plain_got)
    for q in (req_in, plain_in, keepalive_in):
        q.close()
    plain.cancel()
