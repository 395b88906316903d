"""The native front (brain.api.native_front) over a real engine, on every listener
kind: writes that arrive together commit together, Watch, LeaseKeepAlive
and Snapshot streams are served without a thread each, rare unary calls run
in the pool, etcd's HTTP endpoints answer on the client port, and bad input
gets grpc-go's texts."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
import time

import grpc
import pytest

from brain.api import native_front
from brain.api.native_sessions import WatchSession
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.server import ApiServer
from brain.config import ServerConfig
from brain.engine import Engine, EngineConfig
from tests.support.servers import unavailable
from tests.support.tls import channel, make_test_pki, transports_from_env


@pytest.fixture(autouse=True)
def _native_front():
    if not native_front.available():  # built by pip install -e .: only a broken install lacks it
        unavailable("brain._transport is not built (pip install -e '.[test]' builds it with cargo)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=transports_from_env())
def api(request, tmp_path, pki):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    kw = {}
    if request.param == "mtls":
        urls = ["https://127.0.0.1:0"]
        kw = dict(cert_file=str(pki.server.cert), key_file=str(pki.server.key), trusted_ca_file=str(pki.ca.cert),
                  client_cert_auth=True)
    elif request.param == "unix":
        urls = [f"unix://{tmp_path}/brain.sock"]
    else:
        urls = ["http://127.0.0.1:0"]
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=urls, grpc_workers=8,
                                      max_request_bytes=4096, **kw))
    srv.start()
    assert srv._front is not None, "every listener kind is served by the native front"
    yield srv
    srv.stop(1.0)
    eng.close()


@pytest.fixture
def channel_(api, pki):
    ep = api.endpoints[0]
    if ep.startswith("unix://"):
        ch = channel("unix:" + ep.removeprefix("unix://"))
    elif ep.startswith("https://"):
        ch = channel(ep.removeprefix("https://"), pki)
    else:
        ch = channel(ep.removeprefix("http://"))
    yield ch
    ch.close()


def test_concurrent_writes_share_batches(api, channel_):
    """Writes that queue while the committer is busy commit as one batch.

    The committer is held (a control function blocks on it) while 300 Puts
    arrive, so the count does not depend on how fast this machine is: every
    Put the front handed over while it was held goes into the next batch."""
    kv = rpc_pb2_grpc.KVStub(channel_)
    holding, release = threading.Event(), threading.Event()

    def hold():
        holding.set()
        release.wait(60)

    holder = threading.Thread(target=api.engine.on_committer, args=(hold,))
    holder.start()
    try:
        assert holding.wait(10), "the committer never ran the holding function"
        before = api.engine.statistics()
        calls = [kv.Put.future(pb.PutRequest(key=b"k%03d" % i, value=b"v")) for i in range(300)]
        deadline = time.monotonic() + 30
        while api.grpc_stats.snapshot()[0].get(("unary", "etcdserverpb.KV", "Put"), 0) < 300:
            assert time.monotonic() < deadline, "the front did not receive the 300 Puts"
            time.sleep(0.01)  # polls the front's counter; the committer is held meanwhile
        assert not any(c.done() for c in calls), "a Put was answered while the committer was held"
    finally:
        release.set()
        holder.join(10)
    revisions = sorted(c.result(timeout=30).header.revision for c in calls)
    assert revisions == list(range(2, 302))
    after = api.engine.statistics()
    assert after.requests - before.requests == 300
    # One batch; two when the front was still handing its last dispatch round
    # to the engine at the moment the committer was released.
    assert after.batches - before.batches <= 2, f"300 queued puts took {after.batches - before.batches} batches"
    r = kv.Range(pb.RangeRequest(key=b"k", range_end=b"l", count_only=True), timeout=10)
    assert r.count == 300


def test_watch_stream(api, channel_):
    kv = rpc_pb2_grpc.KVStub(channel_)
    watch = rpc_pb2_grpc.WatchStub(channel_)
    reqs = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w", prev_kv=True))]
    stream = watch.Watch(iter(reqs), timeout=10)
    created = next(stream)
    assert created.created and created.header.member_id == api.engine.member_id
    kv.Put(pb.PutRequest(key=b"w", value=b"1"), timeout=10)
    kv.Put(pb.PutRequest(key=b"w", value=b"2"), timeout=10)
    got = []
    while len(got) < 2:
        got += [(e.kv.value, e.prev_kv.value) for e in next(stream).events]
    assert got == [(b"1", b""), (b"2", b"1")]
    stream.cancel()
    _, handled, _, _ = _wait_handled(api, ("bidi_stream", "etcdserverpb.Watch", "Watch", "Canceled"))
    assert handled == 1


def _wait_handled(api, key, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        started, handled, received, sent = api.grpc_stats.snapshot()
        if handled.get(key) or time.monotonic() > deadline:
            return started, handled.get(key, 0), received, sent
        time.sleep(0.02)


def test_many_watch_streams_share_one_dispatch_thread(api, channel_):
    kv = rpc_pb2_grpc.KVStub(channel_)
    watch = rpc_pb2_grpc.WatchStub(channel_)
    threads_before = threading.active_count()
    streams = []
    for i in range(50):
        s = watch.Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"fan"))]), timeout=20)
        assert next(s).created
        streams.append(s)
    # no server thread per stream (the client's own threads are few)
    assert threading.active_count() - threads_before < 25
    kv.Put(pb.PutRequest(key=b"fan", value=b"x"), timeout=10)
    for s in streams:
        assert [e.kv.value for e in next(s).events] == [b"x"]
        s.cancel()


def test_lease_keepalive_stream(api, channel_):
    lease = rpc_pb2_grpc.LeaseStub(channel_)
    granted = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10)
    ids = [granted.ID, granted.ID, 424242]
    answers = list(lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=i) for i in ids]), timeout=10))
    # every request answered in order; an unknown lease gets TTL 0; the
    # stream ends (OK) once the client is done sending
    assert [(a.ID, a.TTL) for a in answers] == [(granted.ID, 60), (granted.ID, 60), (424242, 0)]
    assert answers[0].header.cluster_id == api.engine.cluster_id


def test_snapshot_stream(api, channel_):
    kv = rpc_pb2_grpc.KVStub(channel_)
    for i in range(20):
        kv.Put(pb.PutRequest(key=b"s%d" % i, value=b"x" * 1000), timeout=10)
    chunks = list(rpc_pb2_grpc.MaintenanceStub(channel_).Snapshot(pb.SnapshotRequest(), timeout=30))
    assert len(chunks) >= 2 and chunks[-1].remaining_bytes == 0
    assert sum(len(c.blob) for c in chunks[:-1]) > 20_000


def test_rare_unary_calls_run_in_the_pool(api, channel_):
    status = rpc_pb2_grpc.MaintenanceStub(channel_).Status(pb.StatusRequest(), timeout=10)
    assert status.header.member_id == api.engine.member_id
    members = rpc_pb2_grpc.ClusterStub(channel_).MemberList(pb.MemberListRequest(), timeout=10)
    assert members.members[0].clientURLs == api.endpoints
    with pytest.raises(grpc.RpcError) as ei:
        rpc_pb2_grpc.ClusterStub(channel_).MemberAdd(pb.MemberAddRequest(), timeout=10)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_lease_reads(api, channel_):
    lease = rpc_pb2_grpc.LeaseStub(channel_)
    assert lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=12345), timeout=10).TTL == -1
    g = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=30), timeout=10)
    assert [x.ID for x in lease.LeaseLeases(pb.LeaseLeasesRequest(), timeout=10).leases] == [g.ID]


def test_unknown_method_is_unimplemented_with_grpc_go_text(channel_):
    with pytest.raises(grpc.RpcError) as ei:
        channel_.unary_unary("/etcdserverpb.Nope/Call")(b"", timeout=10)
    assert (ei.value.code(), ei.value.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                    "unknown service etcdserverpb.Nope")
    with pytest.raises(grpc.RpcError) as ei:
        channel_.unary_unary("/etcdserverpb.KV/Nope")(b"", timeout=10)
    assert ei.value.details() == "unknown method Nope for service etcdserverpb.KV"


def test_malformed_request_is_internal_with_grpc_go_text(channel_):
    with pytest.raises(grpc.RpcError) as ei:
        channel_.unary_unary("/etcdserverpb.KV/Put")(b"\x0a\xff", timeout=10)
    assert ei.value.code() == grpc.StatusCode.INTERNAL
    assert ei.value.details().startswith("grpc: error unmarshalling request")


def test_oversized_request_gets_grpc_go_text(api, channel_):
    limit = api.config.grpc_max_recv_bytes
    big = pb.PutRequest(key=b"k", value=b"x" * (limit + 10)).SerializeToString()
    with pytest.raises(grpc.RpcError) as ei:
        channel_.unary_unary("/etcdserverpb.KV/Put")(big, timeout=10)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ei.value.details() == f"grpc: received message larger than max ({len(big)} vs. {limit})"
    # and on a stream: the stream ends with the same status
    watch = rpc_pb2_grpc.WatchStub(channel_)
    big_watch = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k" * (limit + 10)))
    with pytest.raises(grpc.RpcError) as ei:
        list(watch.Watch(iter([big_watch]), timeout=10))
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_calls_are_counted_for_metrics(api, channel_):
    kv = rpc_pb2_grpc.KVStub(channel_)
    kv.Put(pb.PutRequest(key=b"a", value=b"1"), timeout=10)
    kv.Range(pb.RangeRequest(key=b"a"), timeout=10)
    with pytest.raises(grpc.RpcError):
        kv.Range(pb.RangeRequest(key=b""), timeout=10)  # etcd: key is not provided
    started, handled, received, sent = api.grpc_stats.snapshot()
    assert started[("unary", "etcdserverpb.KV", "Put")] == 1
    assert handled[("unary", "etcdserverpb.KV", "Put", "OK")] == 1
    assert handled[("unary", "etcdserverpb.KV", "Range", "OK")] == 1
    assert handled[("unary", "etcdserverpb.KV", "Range", "InvalidArgument")] == 1
    assert sent[("unary", "etcdserverpb.KV", "Range")] == 1


# -- etcd's HTTP endpoints on the client port ------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def _http(api, pki, path: str, method: str = "GET"):
    ep = api.endpoints[0]
    if ep.startswith("unix://"):
        conn = _UnixHTTPConnection(ep.removeprefix("unix://"))
    else:
        host, port = ep.split("://")[1].rsplit(":", 1)
        if ep.startswith("https://"):
            ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
            ctx.load_cert_chain(str(pki.client.cert), str(pki.client.key))
            conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
        else:
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(method, path)
    r = conn.getresponse()
    out = (r.status, r.getheader("Content-Type"), r.read())
    conn.close()
    return out


def test_http_endpoints_answer_like_etcd(api, pki, channel_):
    """The client port's HTTP answers (tests/integration/test_http_vs_etcd.py
    compares them with a real etcd's), then gRPC on the same port."""
    status, ctype, body = _http(api, pki, "/health")
    assert (status, json.loads(body)) == (200, {"health": "true", "reason": ""})
    status, ctype, body = _http(api, pki, "/version")
    assert status == 200 and ctype == "application/json"
    assert set(json.loads(body)) == {"etcdserver", "etcdcluster", "storage"}
    status, _, body = _http(api, pki, "/readyz?verbose")
    assert status == 200 and body.endswith(b"ok\n") and b"[+]linearizable_read ok" in body
    status, _, body = _http(api, pki, "/livez")
    assert (status, body) == (200, b"ok\n")
    status, ctype, body = _http(api, pki, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert b"etcd_debugging_mvcc_current_revision" in body and b"brain_transport_connections_open" in body
    assert _http(api, pki, "/nope")[0] == 404
    status, _, body = _http(api, pki, "/health", method="POST")
    assert (status, body) == (405, b"Method Not Allowed\n")
    # gRPC still works on the same port after HTTP/1.1 connections: the
    # first write of a fresh store makes revision 2, and nothing else wrote
    put = rpc_pb2_grpc.KVStub(channel_).Put(pb.PutRequest(key=b"after-http", value=b"1"), timeout=10)
    assert put.header.revision == 2
    assert api.engine.statistics().committed_revision == 2


def test_fan_out_under_concurrent_writes_loses_nothing(api, channel_):
    """Streams scheduled again while the front polls them must be polled
    again (a lost wake-up dropped events here once)."""
    kv = rpc_pb2_grpc.KVStub(channel_)
    watch = rpc_pb2_grpc.WatchStub(channel_)
    streams = []
    for _ in range(20):
        reqs = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"f/", range_end=b"f0", watch_id=w))
                for w in range(1, 6)]
        s = watch.Watch(iter(reqs), timeout=60)
        for _ in range(5):
            assert next(s).created
        streams.append(s)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: kv.Put(pb.PutRequest(key=b"f/%03d" % i, value=b"v"), timeout=30), range(100)))
    for s in streams:
        got: dict = {}
        while sum(len(v) for v in got.values()) < 500:
            r = next(s)
            got.setdefault(r.watch_id, []).extend(e.kv.key for e in r.events)
        assert {w: len(set(keys)) for w, keys in got.items()} == {w: 100 for w in range(1, 6)}
        s.cancel()


def test_a_stream_scheduled_while_it_is_polled_is_polled_again():
    from brain.api.grpc_stats import GrpcStats

    front = native_front.NativeFront(None, [], recv_limit=1, stats=GrpcStats(), pool=None,
                                     keepalive_time_ms=60_000, keepalive_timeout_ms=20_000)
    polls = []

    class RoutedDuringPoll:
        def poll(self, max_bytes=None):
            polls.append(1)
            if len(polls) == 1:
                front.sessions.schedule(7)  # the hub routes more events while the front polls
            return []

    front.sessions.add(WatchSession(front.sessions, 7, native_front.Method("s", "Watch", stream="watch"),
                                    RoutedDuringPoll()))
    front.sessions.schedule(7)
    front.sessions.pump()
    front.sessions.pump()
    front.transport.close()
    assert len(polls) == 2
