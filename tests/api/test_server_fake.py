"""brain.api.server + brain.api.kv on a real gRPC server with a fake engine:
what leaves the server (codes, exact texts, headers, limits, listeners)."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from concurrent.futures import Future
import time

import grpc
import pytest

from brain.api.kv import KVService, raft_envelope_bytes
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.server import ApiServer, ListenError
from brain.config import ServerConfig
from brain.mvcc import errors
from brain.mvcc import requests as core
from tests.support.tls import channel, make_test_pki, transports_from_env

CLUSTER_ID = 0xABCDEF0123456789
MEMBER_ID = 0xFEDCBA9876543210


from brain.mvcc.auth import AuthState  # noqa: E402


class FakeEngine:
    """A dict store with etcd-shaped results; ``fail`` makes the next calls raise."""

    cluster_id = CLUSTER_ID
    member_id = MEMBER_ID
    term = 5

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rev = 1
        self.data: dict[bytes, core.KeyValue] = {}
        self.calls: list[object] = []
        self.fail: BaseException | None = None
        self.gate: threading.Event | None = None  # blocks put() while set and not yet released
        self.entered = threading.Event()  # a put() reached the engine
        self.submitted: list[object] = []  # requests handed to submit*, i.e. ordered with the writes
        self.closed = False

    def _enter(self, req) -> None:
        self.calls.append(req)
        if self.fail is not None:
            raise errors.raisable(self.fail)

    leader_id = MEMBER_ID
    cluster = None  # a single node: it always has a leader
    has_leader = True
    auth = AuthState()  # auth stays off: the fake serves no Auth calls
    tokens = None

    def range(self, req: core.RangeRequest) -> core.RangeResult:
        self._enter(req)
        with self.lock:
            kvs = [kv for k, kv in sorted(self.data.items()) if k == req.key or (req.range_end and req.key <= k < req.range_end)]
            return core.RangeResult(self.rev, [] if req.count_only else kvs, False, len(kvs))

    def range_columns(self, req: core.RangeRequest) -> core.RangeColumns:
        return core.RangeColumns.of(self.range(req))

    def put(self, req: core.PutRequest) -> core.PutResult:
        self._enter(req)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.rev += 1
            prev = self.data.get(req.key)
            create = prev.create_revision if prev else self.rev
            version = prev.version + 1 if prev else 1
            self.data[req.key] = core.KeyValue(req.key, create, self.rev, version, req.value, req.lease)
            return core.PutResult(self.rev, prev if req.prev_kv else None)

    def delete_range(self, req: core.DeleteRangeRequest) -> core.DeleteRangeResult:
        self._enter(req)
        with self.lock:
            prev = self.data.pop(req.key, None)
            if prev is not None:
                self.rev += 1
            return core.DeleteRangeResult(self.rev, 1 if prev else 0, [prev] if prev and req.prev_kv else [])

    def txn(self, req: core.TxnRequest) -> core.TxnResult:
        self._enter(req)
        ops = []
        for op in req.success:
            if op is None:
                ops.append(core.EmptyResult())
            elif isinstance(op, core.RangeRequest):
                ops.append(self.range(op))
            elif isinstance(op, core.PutRequest):
                ops.append(self.put(op))
            elif isinstance(op, core.TxnRequest):
                ops.append(self.txn(op))
            else:
                raise NotImplementedError(op)
        return core.TxnResult(self.rev, True, ops)

    def compact(self, req: core.CompactRequest) -> core.CompactResult:
        self._enter(req)
        return core.CompactResult(self.rev)

    def submit(self, req) -> Future:
        return self.submit_many([req])[0]

    def submit_many(self, reqs) -> list[Future]:
        """Like the real engine: the writes complete later, on another thread."""
        by_type = {core.PutRequest: self.put, core.DeleteRangeRequest: self.delete_range,
                   core.TxnRequest: self.txn, core.CompactRequest: self.compact}
        futures = [Future() for _ in reqs]
        self.submitted.extend(reqs)

        def apply() -> None:
            for req, fut in zip(reqs, futures):
                try:
                    fut.set_result(by_type[type(req)](req))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

        threading.Thread(target=apply, daemon=True).start()
        return futures

    def submit_batch(self, reqs, callback, *, wires=None) -> None:
        futures = self.submit_many(reqs)

        def deliver() -> None:
            items = []
            for i, f in enumerate(futures):
                exc = f.exception(timeout=30)
                items.append((i, None if exc else f.result(), exc))
            callback(items)

        threading.Thread(target=deliver, daemon=True).start()

    # Linearizable reads wait for this barrier; ``barrier_async`` makes it
    # answer later on another thread, as a clustered replica does.
    barrier_async = False
    barrier_error: BaseException | None = None
    barriers = 0

    def read_barrier(self, callback) -> bool:
        self.barriers += 1
        if not self.barrier_async:
            return True
        threading.Timer(0.05, callback, args=(self.barrier_error,)).start()
        return False

    def wait_linearizable(self) -> None:
        """The engine's blocking form of the barrier (grpcio servicers)."""
        done = threading.Event()
        outcome: list = []
        if self.read_barrier(lambda exc: (outcome.append(exc), done.set())):
            return
        done.wait(10)
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def lease_keepalive_many(self, ids, callback) -> None:
        callback([(i, 0) for i in ids])

    def close(self) -> None:
        self.closed = True


def _tcp_config(**kw) -> ServerConfig:
    return ServerConfig(data_dir="unused", listen_client_urls=["http://127.0.0.1:0"], grpc_workers=8, **kw)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def engine():
    return FakeEngine()


# Every server test runs on the native transport over each listener kind
# (BRAIN_TEST_TRANSPORTS) and on grpcio alone.
FRONTS = [f"native-{t}" for t in transports_from_env()] + ["grpcio"]


@pytest.fixture(params=FRONTS)
def front(request):
    return request.param


def _config(front: str, pki, sock_dir: str, **kw) -> ServerConfig:
    kind = "http" if front == "grpcio" else front.removeprefix("native-")
    kw.setdefault("grpc_front", "grpcio" if front == "grpcio" else "native")
    if kind == "mtls":
        kw.update(listen_client_urls=["https://127.0.0.1:0"], cert_file=str(pki.server.cert),
                  key_file=str(pki.server.key), trusted_ca_file=str(pki.ca.cert), client_cert_auth=True)
    elif kind == "unix":
        kw.update(listen_client_urls=[f"unix://{sock_dir}/brain.sock"])
    else:
        kw.update(listen_client_urls=["http://127.0.0.1:0"])
    return ServerConfig(data_dir="unused", grpc_workers=8, **kw)


def _channel(api: ApiServer, pki, **kw) -> grpc.Channel:
    """A channel to the server's first listener, whatever its kind."""
    ep = api.endpoints[0]
    opts = [("grpc.max_send_message_length", 64 << 20)]
    if ep.startswith("unix://"):
        return channel("unix:" + ep.removeprefix("unix://"), options=opts)
    if ep.startswith("https://"):
        return channel(ep.removeprefix("https://"), pki, options=opts)
    return channel(ep.removeprefix("http://"), options=opts)


@pytest.fixture
def server(engine, front, pki, tmp_path):
    api = ApiServer(engine, _config(front, pki, str(tmp_path), max_request_bytes=4096))
    api.start()
    yield api
    api.stop(0)


def _kv(target: str) -> tuple[grpc.Channel, rpc_pb2_grpc.KVStub]:
    ch = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
    return ch, rpc_pb2_grpc.KVStub(ch)


@pytest.fixture
def kv(server, pki):
    ch = _channel(server, pki)
    yield rpc_pb2_grpc.KVStub(ch)
    ch.close()


def _err(fn, *a) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*a, timeout=10)
    return ei.value


def test_endpoint_reports_the_bound_port(server):
    (ep,) = server.endpoints
    if not ep.startswith("unix://"):
        assert ep.startswith(("http://127.0.0.1:", "https://127.0.0.1:")) and not ep.endswith(":0")


def test_put_range_headers_carry_engine_identity(kv):
    r = kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    assert r.header == pb.ResponseHeader(cluster_id=CLUSTER_ID, member_id=MEMBER_ID, revision=2, raft_term=5)
    r = kv.Range(pb.RangeRequest(key=b"k"), timeout=10)
    assert r.header.revision == 2 and r.count == 1
    assert (r.kvs[0].key, r.kvs[0].value, r.kvs[0].version) == (b"k", b"v", 1)


def test_every_kv_rpc_converts_requests(kv, engine):
    kv.Put(pb.PutRequest(key=b"a", value=b"1", prev_kv=True, lease=0), timeout=10)
    r = kv.Put(pb.PutRequest(key=b"a", value=b"2", prev_kv=True), timeout=10)
    assert r.prev_kv.value == b"1"
    r = kv.DeleteRange(pb.DeleteRangeRequest(key=b"a", prev_kv=True), timeout=10)
    assert r.deleted == 1 and r.prev_kvs[0].value == b"2"
    r = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(), pb.RequestOp(request_put=pb.PutRequest(key=b"t"))]), timeout=10)
    assert r.succeeded and r.responses[0].WhichOneof("response") is None
    assert r.responses[1].response_put.header == pb.ResponseHeader(revision=r.header.revision)
    r = kv.Compact(pb.CompactionRequest(revision=3, physical=True), timeout=10)
    assert r.header.member_id == MEMBER_ID
    kinds = [type(c).__name__ for c in engine.calls]
    assert kinds[:4] == ["PutRequest", "PutRequest", "DeleteRangeRequest", "TxnRequest"]
    assert engine.calls[-1] == core.CompactRequest(3, True)


ALL_ETCD_ERRORS = [v for v in vars(errors).values() if isinstance(v, errors.EtcdError)]


@pytest.mark.parametrize("err", ALL_ETCD_ERRORS, ids=lambda e: e.message)
def test_etcd_errors_reach_the_client_exactly(kv, engine, err):
    engine.fail = err
    for call, req in [
        (kv.Range, pb.RangeRequest(key=b"k")),
        (kv.Put, pb.PutRequest(key=b"k")),
        (kv.DeleteRange, pb.DeleteRangeRequest(key=b"k")),
        (kv.Txn, pb.TxnRequest()),
        (kv.Compact, pb.CompactionRequest(revision=1)),
    ]:
        e = _err(call, req)
        assert e.code() == getattr(grpc.StatusCode, err.code)
        assert e.details() == err.message


def test_unexpected_exception_is_unknown_and_server_keeps_serving(kv, engine, caplog):
    engine.fail = ZeroDivisionError("boom")
    e = _err(kv.Put, pb.PutRequest(key=b"k"))
    assert e.code() == grpc.StatusCode.UNKNOWN
    assert "ZeroDivisionError: boom" in e.details()
    assert any("Put failed unexpectedly" in r.getMessage() for r in caplog.records)
    engine.fail = None
    for i in range(20):
        assert kv.Put(pb.PutRequest(key=b"k", value=b"%d" % i), timeout=10).header.revision == i + 2


def test_unknown_status_name_is_unknown(kv, engine):
    engine.fail = errors.EtcdError("NO_SUCH_CODE", "etcdserver: strange")
    e = _err(kv.Range, pb.RangeRequest(key=b"k"))
    assert (e.code(), e.details()) == (grpc.StatusCode.UNKNOWN, "etcdserver: strange")


def _put_of_size(total: int) -> pb.PutRequest:
    """A PutRequest whose envelope-included size is exactly ``total``."""
    for n in range(total, 0, -1):
        req = pb.PutRequest(key=b"k", value=b"x" * n)
        size = req.ByteSize()
        if size + raft_envelope_bytes(size, MEMBER_ID) == total:
            return req
    raise AssertionError(total)


def test_request_too_large_boundary(kv, engine):
    ok = _put_of_size(4096)
    assert kv.Put(ok, timeout=10).header.revision == 2
    big = pb.PutRequest(key=b"k", value=ok.value + b"x")
    e = _err(kv.Put, big)
    assert (e.code(), e.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
    e = _err(kv.DeleteRange, pb.DeleteRangeRequest(key=b"k" * 4096))
    assert e.details() == "etcdserver: request is too large"
    e = _err(kv.Txn, pb.TxnRequest(success=[pb.RequestOp(request_put=big)]))
    assert e.details() == "etcdserver: request is too large"
    # the too-large requests never reached the engine
    assert len(engine.calls) == 1


def test_reads_are_not_size_checked_below_the_grpc_limit(kv):
    # etcd checks the size of what it proposes through raft only
    key = b"k" * 8000  # > max-request-bytes (4096), < the gRPC limit (4096 + 512 KiB)
    assert kv.Range(pb.RangeRequest(key=key), timeout=10).count == 0
    r = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=key))]), timeout=10)
    assert r.succeeded


def test_grpc_receive_limit_is_max_request_bytes_plus_512k(kv):
    limit = 4096 + 512 * 1024
    req = pb.RangeRequest(key=b"k" * (limit + 1))
    e = _err(kv.Range, req)
    # grpc-go's wording, as etcd clients see it
    assert (e.code(), e.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"grpc: received message larger than max ({req.ByteSize()} vs. {limit})",
    )
    # far beyond the limit grpc-core refuses the message itself
    e = _err(kv.Range, pb.RangeRequest(key=b"k" * (5 * limit)))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # just under the limit is received (and answered) normally
    key = b"k" * (limit - 10)
    assert kv.Range(pb.RangeRequest(key=key), timeout=10).count == 0


def test_undecodable_request_is_internal(server, pki):
    ch = _channel(server, pki)
    with ch:
        raw = ch.unary_unary("/etcdserverpb.KV/Put")
        with pytest.raises(grpc.RpcError) as ei:
            raw(b"\xff\xff", timeout=10)
    assert ei.value.code() == grpc.StatusCode.INTERNAL
    assert ei.value.details().startswith("grpc: error unmarshalling request: ")


def test_envelope_matches_etcd_measurement():
    # etcd 3.4.23 with member id ...390d accepted a PutRequest of 1572847 bytes
    # and refused 1572848 under --max-request-bytes 1572864 (envelope 17 bytes)
    assert raft_envelope_bytes(1572847, 0xBDAE2D0ABB21390D) == 17
    # a small member id gives a shorter request id varint
    assert raft_envelope_bytes(100, 0x1) == 1 + 1 + 3 + 1 + 7


def test_unix_socket_listener(engine):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "brain.sock")
        # a stale socket file from an earlier run is replaced
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()
        api = ApiServer(engine, ServerConfig(data_dir="unused", listen_client_urls=[f"unix://{path}"]))
        api.start()
        try:
            assert api.endpoints == [f"unix://{path}"]
            ch, stub = _kv(f"unix:{path}")
            with ch:
                assert stub.Put(pb.PutRequest(key=b"u", value=b"1"), timeout=10).header.revision == 2
                assert stub.Range(pb.RangeRequest(key=b"u"), timeout=10).kvs[0].value == b"1"
        finally:
            api.stop(0)
        assert not os.path.exists(path)


def test_tcp_and_unix_listeners_together(engine):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        api = ApiServer(engine, ServerConfig(data_dir="unused", listen_client_urls=["http://127.0.0.1:0", f"unix://{path}"]))
        api.start()
        try:
            ch1, s1 = _kv(api.endpoints[0].removeprefix("http://"))
            ch2, s2 = _kv(f"unix:{path}")
            with ch1, ch2:
                s1.Put(pb.PutRequest(key=b"x", value=b"tcp"), timeout=10)
                assert s2.Range(pb.RangeRequest(key=b"x"), timeout=10).kvs[0].value == b"tcp"
        finally:
            api.stop(0)


def test_port_in_use_fails_like_etcd(engine):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        api = ApiServer(engine, ServerConfig(data_dir="unused", listen_client_urls=[f"http://127.0.0.1:{port}"]))
        with pytest.raises(ListenError) as ei:
            api.start()
        assert str(ei.value) == f"listen tcp 127.0.0.1:{port}: bind: address already in use"


def test_second_server_on_same_port_is_refused(engine, front, pki, tmp_path):
    # a TCP port question: the unix listener kind is checked on http
    first = ApiServer(engine, _config("native-http" if front == "native-unix" else front, pki, str(tmp_path)))
    first.start()
    try:
        port = int(first.endpoints[0].rsplit(":", 1)[1])
        other = ApiServer(engine, ServerConfig(data_dir="unused", listen_client_urls=[f"http://127.0.0.1:{port}"]))
        with pytest.raises(ListenError, match="address already in use"):
            other.start()
    finally:
        first.stop(0)


def test_stop_drains_in_flight_calls_and_refuses_new_ones(engine, front, pki, tmp_path):
    api = ApiServer(engine, _config(front, pki, str(tmp_path)))
    api.start()
    ch = _channel(api, pki)
    stub = rpc_pb2_grpc.KVStub(ch)
    engine.gate = threading.Event()
    result: dict = {}

    def slow_put():
        try:
            result["resp"] = stub.Put(pb.PutRequest(key=b"slow", value=b"1"), timeout=10)
        except grpc.RpcError as e:  # pragma: no cover - reported by the assert below
            result["err"] = e

    t = threading.Thread(target=slow_put)
    t.start()
    assert engine.entered.wait(5), "the Put never reached the engine"
    stopper = threading.Thread(target=api.stop, args=(5.0,))
    stopper.start()
    # New calls are refused once stop() has begun, while the old one drains.
    deadline = time.monotonic() + 5
    while True:
        try:
            stub.Range(pb.RangeRequest(key=b"slow"), timeout=2)
        except grpc.RpcError:
            break
        assert time.monotonic() < deadline, "new calls were still served 5 s after stop() was called"
    assert t.is_alive() and not result, "the in-flight Put ended before the engine released it"
    engine.gate.set()
    t.join(10)
    stopper.join(10)
    ch.close()
    assert "err" not in result, result.get("err")
    assert result["resp"].header.revision == 2


def test_a_txn_holding_a_nested_txn_is_ordered_with_the_writes(kv, engine):
    """etcd's rule: only a Txn of Ranges is a read (served locally); any
    other, one whose nested Txn holds only Ranges included, is proposed
    like a write.  Answered from local state instead, it skipped the read
    barrier: a stale read on a replica."""
    kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    engine.barrier_async = True  # a replica
    rng = pb.RequestOp(request_range=pb.RangeRequest(key=b"k"))
    nested = pb.TxnRequest(success=[pb.RequestOp(request_txn=pb.TxnRequest(success=[rng]))])
    before = len(engine.submitted)
    r = kv.Txn(nested, timeout=10)
    assert r.responses[0].response_txn.responses[0].response_range.kvs[0].value == b"v"
    assert [type(req) for req in engine.submitted[before:]] == [core.TxnRequest]


def test_kv_service_can_be_used_without_a_server(engine):
    class Ctx:
        def abort(self, code, details):
            raise RuntimeError((code, details))

    svc = KVService(engine, max_request_bytes=100)
    (put,) = [rpc.call for rpc in svc.rpc_table().rpcs if rpc.name == "Put"]
    r = put(pb.PutRequest(key=b"k", value=b"v"), Ctx())
    assert r.header.revision == 2
    with pytest.raises(RuntimeError) as ei:
        put(pb.PutRequest(key=b"k", value=b"v" * 200), Ctx())
    assert ei.value.args[0] == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")


def test_linearizable_reads_wait_for_the_read_barrier(kv, engine):
    kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    engine.barrier_async = True  # a replica: the barrier passes after a round trip
    before = engine.barriers
    r = kv.Range(pb.RangeRequest(key=b"k"), timeout=10)
    assert r.kvs[0].value == b"v"
    txn = pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=b"k"))])
    assert kv.Txn(txn, timeout=10).responses[0].response_range.kvs[0].value == b"v"
    # serializable reads never wait
    kv.Range(pb.RangeRequest(key=b"k", serializable=True), timeout=10)
    ser = pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=b"k", serializable=True))])
    kv.Txn(ser, timeout=10)
    assert engine.barriers - before == 2
    engine.barrier_error = errors.ErrTimeout
    e = _err(kv.Range, pb.RangeRequest(key=b"k"))
    assert (e.code().name, e.details()) == (errors.ErrTimeout.code, errors.ErrTimeout.message)
