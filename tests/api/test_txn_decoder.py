"""The native TxnRequest decoder (native/wire/src/txn.rs, convert.txn_decoder)
against the protobuf runtime: for every message it takes, brain's request
and etcd's classifications equal what convert builds from the parsed
message; anything it does not take (unknown or repeated message fields,
truncation, nesting too deep) it leaves to protobuf, which then decides,
errors included.  And the native front reads Txns through it."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.api import convert
from brain.api.pb.etcdserverpb import rpc_pb2
from google.protobuf.message import DecodeError

decode = convert.txn_decoder(1 << 30)
if decode is None:  # pragma: no cover - the native module is built by pip install
    pytest.fail("the native module (brain._transport) is missing: pip install -e . builds it")

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ENUM = st.integers(min_value=-(2**31), max_value=2**31 - 1)
KEY = st.binary(max_size=12)


def _range():
    return st.builds(rpc_pb2.RangeRequest, key=KEY, range_end=KEY, limit=INT64, revision=INT64,
                     sort_order=st.sampled_from([0, 1, 2, 7]), sort_target=st.sampled_from([0, 1, 2, 3, 4, 9]),
                     serializable=st.booleans(), keys_only=st.booleans(), count_only=st.booleans(),
                     min_mod_revision=INT64, max_mod_revision=INT64, min_create_revision=INT64,
                     max_create_revision=INT64)


def _put():
    return st.builds(rpc_pb2.PutRequest, key=KEY, value=st.binary(max_size=40), lease=INT64,
                     prev_kv=st.booleans(), ignore_value=st.booleans(), ignore_lease=st.booleans())


def _delete():
    return st.builds(rpc_pb2.DeleteRangeRequest, key=KEY, range_end=KEY, prev_kv=st.booleans())


def _compare():
    def make(result, target, key, range_end, union):
        c = rpc_pb2.Compare(result=result, target=target, key=key, range_end=range_end)
        if union is not None:
            setattr(c, union[0], union[1])
        return c

    union = st.one_of(st.none(), st.tuples(st.sampled_from(["version", "create_revision", "mod_revision", "lease"]),
                                           INT64), st.tuples(st.just("value"), st.binary(max_size=8)))
    return st.builds(make, ENUM, ENUM, KEY, KEY, union)


def _op(txns):
    return st.one_of(st.just(rpc_pb2.RequestOp()),
                     _range().map(lambda r: rpc_pb2.RequestOp(request_range=r)),
                     _put().map(lambda p: rpc_pb2.RequestOp(request_put=p)),
                     _delete().map(lambda d: rpc_pb2.RequestOp(request_delete_range=d)),
                     txns.map(lambda t: rpc_pb2.RequestOp(request_txn=t)))


TXNS = st.recursive(
    st.builds(rpc_pb2.TxnRequest, compare=st.lists(_compare(), max_size=3)),
    lambda txns: st.builds(rpc_pb2.TxnRequest, compare=st.lists(_compare(), max_size=3),
                           success=st.lists(_op(txns), max_size=3), failure=st.lists(_op(txns), max_size=3)),
    max_leaves=8)


def _as_protobuf_reads(payload: bytes):
    m = rpc_pb2.TxnRequest.FromString(payload)
    return convert.txn_request(m), convert.txn_is_readonly(m), convert.txn_reads_serializable(m)


def _same(payload: bytes) -> bool:
    """The decoder took ``payload`` (True) or left it to protobuf; what it
    took is read exactly as protobuf and convert read it."""
    got = decode(payload)
    if got is None:
        return False
    want = _as_protobuf_reads(payload)  # protobuf must accept what the decoder took
    assert (got.request, convert.txn_is_readonly(got), convert.txn_reads_serializable(got)) == want
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TXNS)
def test_every_encoded_txn_is_read_as_protobuf_reads_it(m):
    assert _same(m.SerializeToString())


def test_the_kubernetes_guaranteed_update_and_create():
    key = b"/registry/leases/kube-node-lease/node-1"
    update = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, result=rpc_pb2.Compare.EQUAL, mod_revision=41)],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=b"x" * 300))],
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))])
    got = decode(update.SerializeToString())
    assert got is not None and not got.readonly
    [c] = got.request.compare
    assert (c.target, c.union, c.operand, c.key) == (rpc_pb2.Compare.MOD, "mod_revision", 41, key)
    assert _same(update.SerializeToString())
    read = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key,
                                                                                              serializable=True))])
    got = decode(read.SerializeToString())
    assert got.readonly and got.serializable and convert.txn_reads_serializable(got)
    assert decode(b"") is not None and decode(b"").request == convert.txn_request(rpc_pb2.TxnRequest())


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_what_protobuf_reads_otherwise_is_left_to_it():
    put = rpc_pb2.PutRequest(key=b"k", value=b"v").SerializeToString()
    rng = rpc_pb2.RangeRequest(key=b"k").SerializeToString()
    # a RequestOp with two requests: protobuf keeps the last (or merges the same one twice)
    for op in (_field(2, put) + _field(1, rng), _field(2, put) + _field(2, b"\x18\x05")):
        payload = _field(2, op)
        assert decode(payload) is None
        assert rpc_pb2.TxnRequest.FromString(payload).success[0].WhichOneof("request") in ("request_range",
                                                                                          "request_put")
    # an unknown field (kept by protobuf, re-serialized with the message)
    assert decode(rpc_pb2.TxnRequest().SerializeToString() + b"\x48\x01") is None
    # truncated, and a field of the wrong wire type: protobuf's errors are the answer
    whole = _field(2, _field(2, put))
    for cut in range(1, len(whole)):
        if decode(whole[:cut]) is None:
            continue
        _as_protobuf_reads(whole[:cut])
    assert decode(b"\x08\x01") is None  # compare as a varint
    # past the decoder's depth: protobuf's own limit decides
    nested = rpc_pb2.TxnRequest()
    inner = nested
    for _ in range(18):
        inner = inner.success.add().request_txn
    assert decode(nested.SerializeToString()) is None
    assert rpc_pb2.TxnRequest.FromString(nested.SerializeToString()) == nested


def test_the_leader_reads_a_forwarded_txn_natively_or_with_protobuf_and_refuses_the_rest():
    """convert.forwarded_txn_reader: what a follower forwards as its
    client's bytes is read to the same request convert builds; what the
    native decoder leaves (an unknown field) protobuf reads; bytes that are
    no TxnRequest are a ValueError (that write alone fails)."""
    read = convert.forwarded_txn_reader()
    key = b"/registry/leases/kube-node-lease/node-1"
    m = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, result=rpc_pb2.Compare.EQUAL, mod_revision=41)],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=b"x" * 300))],
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))])
    payload = m.SerializeToString()
    assert read(payload) == convert.txn_request(m)
    assert decode(payload + b"\x48\x01") is None  # left to protobuf, which keeps the unknown field
    assert read(payload + b"\x48\x01") == convert.txn_request(m)
    with pytest.raises(ValueError):
        read(b"\x0a\xff")  # a compare longer than the message
    assert decode(payload).payload == payload  # what the front keeps to forward


def test_larger_than_the_surely_fitting_size_is_measured_by_protobuf():
    small = convert.txn_decoder(10)
    m = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"k", value=b"v" * 20))])
    assert small(m.SerializeToString()) is None
    assert convert.txn_decoder(1000)(m.SerializeToString()) is not None


def test_mutated_messages_are_read_as_protobuf_reads_them_or_left_to_it():
    """Random byte changes, cuts and insertions in encoded Txns: the decoder
    never takes a message protobuf refuses or reads differently."""
    rnd = random.Random(24)
    base = [m.SerializeToString() for m in (
        rpc_pb2.TxnRequest(
            compare=[rpc_pb2.Compare(key=b"a", target=rpc_pb2.Compare.VALUE, value=b"v", range_end=b"z")],
            success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"a", value=b"b", lease=-3)),
                     rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=b"a", prev_kv=True))],
            failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"a", limit=5, revision=-1)),
                     rpc_pb2.RequestOp(request_txn=rpc_pb2.TxnRequest(
                         success=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"q"))]))]),
        rpc_pb2.TxnRequest(compare=[rpc_pb2.Compare(key=b"k", mod_revision=2**40)]),
    )]
    taken = refused = 0
    for _ in range(6000):
        b = bytearray(rnd.choice(base))
        for _ in range(rnd.randint(1, 3)):
            what = rnd.random()
            i = rnd.randrange(len(b) + 1)
            if what < 0.5 and i < len(b):
                b[i] = rnd.randrange(256)
            elif what < 0.75:
                b.insert(i, rnd.randrange(256))
            else:
                del b[i:i + rnd.randint(1, 4)]
        payload = bytes(b)
        got = decode(payload)
        if got is None:
            continue
        try:
            want = _as_protobuf_reads(payload)
        except DecodeError:
            refused += 1
            continue
        assert (got.request, got.readonly, got.serializable) == want, payload.hex()
        taken += 1
    assert refused == 0
    assert taken > 200  # the mutations did reach the decoder's paths (367 with this seed)


def test_the_native_front_reads_txns_through_the_decoder(tmp_path, monkeypatch):
    """Txns through the native front: the heartbeat's both branches and a
    read go through the decoder; one larger than --max-request-bytes is
    measured by protobuf and refused with etcd's error."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2_grpc
    from brain.api.server import ApiServer
    from brain.config import ServerConfig
    from brain.engine import Engine, EngineConfig

    taken = []
    make = convert.txn_decoder

    def counting(surely_fits):
        inner = make(surely_fits)

        def decode(payload):
            got = inner(payload)
            taken.append(got is not None)
            return got
        return decode

    monkeypatch.setattr(convert, "txn_decoder", counting)
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    srv = ApiServer(eng, ServerConfig(data_dir=str(tmp_path / "data"), listen_client_urls=["http://127.0.0.1:0"],
                                      max_request_bytes=4096))
    srv.start()
    try:
        assert srv._front is not None
        with grpc.insecure_channel(srv.endpoints[0].removeprefix("http://")) as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            key = b"/registry/leases/kube-node-lease/node-1"

            def renew(seen):
                return kv.Txn(rpc_pb2.TxnRequest(
                    compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, mod_revision=seen)],
                    success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=b"x" * 300))],
                    failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))]), timeout=10)

            first = renew(0)
            assert first.succeeded and first.header.revision == 2
            stale = renew(0)
            assert not stale.succeeded and stale.responses[0].response_range.kvs[0].mod_revision == 2
            assert renew(2).succeeded
            read = kv.Txn(rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(
                request_range=rpc_pb2.RangeRequest(key=key))]), timeout=10)
            assert read.responses[0].response_range.kvs[0].mod_revision == 3 and read.header.revision == 3
            assert taken == [True] * 4
            with pytest.raises(grpc.RpcError) as ei:
                kv.Txn(rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(
                    request_put=rpc_pb2.PutRequest(key=key, value=b"x" * 5000))]), timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert ei.value.details() == "etcdserver: request is too large"
            assert taken[-1] is False
    finally:
        srv.stop(1.0)
        eng.close()
