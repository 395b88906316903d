"""The batching front (brain.api.front) over a real engine: writes that
arrive together commit together, streams reach grpcio through the fallback,
rare unary calls run in the pool, and bad input gets grpc-go's texts."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from brain.api import front as native_front
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.server import ApiServer
from brain.config import ServerConfig
from brain.engine import Engine, EngineConfig
from tests.support.servers import unavailable



@pytest.fixture(autouse=True)
def _native_front():
    if not native_front.available():  # a dependency of brain: only a broken install lacks it
        unavailable("pygrpc-native is not installed (pip install -e '.[test]')")


@pytest.fixture
def api(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=["http://127.0.0.1:0"],
                                      grpc_workers=8, max_request_bytes=4096))
    srv.start()
    assert srv._fronts, "the http listener should be served by the front"
    yield srv
    srv.stop(1.0)
    eng.close()


@pytest.fixture
def channel(api):
    ch = grpc.insecure_channel(api.endpoints[0].removeprefix("http://"))
    yield ch
    ch.close()


def test_concurrent_writes_share_batches(api, channel):
    """Writes that queue while the committer is busy commit as one batch.

    The committer is held (a control function blocks on it) while 300 Puts
    arrive, so the count does not depend on how fast this machine is: every
    Put the front handed over while it was held goes into the next batch."""
    kv = rpc_pb2_grpc.KVStub(channel)
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


def test_streams_go_through_the_fallback(api, channel):
    kv = rpc_pb2_grpc.KVStub(channel)
    watch = rpc_pb2_grpc.WatchStub(channel)
    lease = rpc_pb2_grpc.LeaseStub(channel)
    requests = iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w"))])
    stream = watch.Watch(requests, timeout=10)
    created = next(stream)
    assert created.created
    kv.Put(pb.PutRequest(key=b"w", value=b"1"), timeout=10)
    ev = next(stream)
    assert [e.kv.value for e in ev.events] == [b"1"]
    stream.cancel()

    granted = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10)
    ka = lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=granted.ID)]), timeout=10)
    assert next(ka).TTL == 60
    ka.cancel()


def test_rare_unary_calls_run_in_the_pool(api, channel):
    status = rpc_pb2_grpc.MaintenanceStub(channel).Status(pb.StatusRequest(), timeout=10)
    assert status.header.member_id == api.engine.member_id
    members = rpc_pb2_grpc.ClusterStub(channel).MemberList(pb.MemberListRequest(), timeout=10)
    assert len(members.members) == 1
    # an etcd error raised inside a pooled call keeps its code and text
    with pytest.raises(grpc.RpcError) as ei:
        rpc_pb2_grpc.ClusterStub(channel).MemberAdd(pb.MemberAddRequest(), timeout=10)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_lease_ttl_of_unknown_lease(api, channel):
    r = rpc_pb2_grpc.LeaseStub(channel).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=12345), timeout=10)
    assert r.TTL == -1


def test_unknown_method_is_unimplemented(channel):
    call = channel.unary_unary("/etcdserverpb.Auth/AuthStatus")
    with pytest.raises(grpc.RpcError) as ei:
        call(b"", timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_malformed_request_is_internal_with_grpc_go_text(channel):
    call = channel.unary_unary("/etcdserverpb.KV/Put")
    with pytest.raises(grpc.RpcError) as ei:
        call(b"\x0a\xff", timeout=10)  # key field with a truncated length
    assert ei.value.code() == grpc.StatusCode.INTERNAL
    assert ei.value.details().startswith("grpc: error unmarshalling request")


def test_oversized_request_gets_grpc_go_text(api, channel):
    limit = api.config.grpc_max_recv_bytes
    call = channel.unary_unary("/etcdserverpb.KV/Put")
    big = pb.PutRequest(key=b"k", value=b"x" * (limit + 10)).SerializeToString()
    with pytest.raises(grpc.RpcError) as ei:
        call(big, timeout=10)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ei.value.details() == f"grpc: received message larger than max ({len(big)} vs. {limit})"


def test_calls_are_counted_for_metrics(api, channel):
    kv = rpc_pb2_grpc.KVStub(channel)
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


def test_stop_removes_the_fallback_socket(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=["http://127.0.0.1:0"]))
    srv.start()
    fallback_dir = srv._fallback_dir
    assert fallback_dir and os.path.isdir(fallback_dir)
    srv.stop(0)
    eng.close()
    assert not os.path.exists(fallback_dir)


def test_grpcio_front_has_no_fallback(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=["http://127.0.0.1:0"],
                                      grpc_front="grpcio"))
    srv.start()
    try:
        assert not srv._fronts and srv._fallback_dir is None
    finally:
        srv.stop(0)
        eng.close()
