"""The native TxnResponse encoder (native/src/txnenc.rs, encoded.txn_response)
against the protobuf runtime: for any result tree the committer can hand
back (Ranges, Puts with and without a previous value, DeleteRanges, nested
Txns, empty ops, zeros, negative and 64-bit values), its bytes are those
of the message brain.api.convert.txn_response builds; an unknown result
is refused as there; and the native front answers Txns with it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.api import convert, encoded
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.mvcc import requests as core
from tests.support.servers import unavailable

if not encoded.available():  # skipped outside CI only: under CI a missing build fails
    unavailable(encoded.fallback_notice(), module=True)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
SMALL = st.sampled_from([0, 1, 127, 128, 2**35, 2**63 - 1, -1])


def _kv():
    return st.builds(core.KeyValue, st.binary(max_size=10), SMALL | INT64, SMALL, SMALL,
                     st.binary(max_size=300), SMALL | INT64)


def _leaf():
    return st.one_of(
        st.builds(core.RangeResult, SMALL | INT64, st.lists(_kv(), max_size=3), st.booleans(), SMALL | INT64),
        st.builds(core.PutResult, SMALL | INT64, st.none() | _kv()),
        st.builds(core.DeleteRangeResult, SMALL | INT64, SMALL | INT64, st.lists(_kv(), max_size=3)),
        st.just(core.EmptyResult()),
    )


def _txn(children):
    return st.builds(core.TxnResult, SMALL | INT64, st.booleans(), st.lists(children, max_size=4))


RESULTS = st.recursive(_leaf(), _txn, max_leaves=12)


def _upb(res: core.TxnResult, cluster_id: int, member_id: int, term: int) -> bytes:
    return convert.txn_response(res, convert.Header(cluster_id, member_id, term)).SerializeToString()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_txn(RESULTS), UINT64, UINT64, UINT64)
def test_any_result_is_the_bytes_protobuf_writes(res, cluster_id, member_id, term):
    got = encoded.txn_response(cluster_id, member_id, term, res)
    assert got.SerializeToString() == _upb(res, cluster_id, member_id, term)


def test_a_lease_renewal_and_its_refusal_as_kube_apiserver_gets_them():
    hdr = convert.Header(0x1234, 0xFEDC_BA98_7654_3210, 5)
    done = core.TxnResult(812, True, [core.PutResult(812)])
    lease = core.KeyValue(b"/registry/leases/kube-node-lease/n1", 10, 700, 9, b"x" * 300, 0)
    refused = core.TxnResult(812, False, [core.RangeResult(812, [lease], False, 1)])
    for res in (done, refused):
        got = convert.txn_response_wire(res, hdr)
        assert isinstance(got, encoded.Encoded)  # the native path, not the message
        assert got.SerializeToString() == convert.txn_response(res, hdr).SerializeToString()
        assert rpc_pb2.TxnResponse.FromString(got.SerializeToString()) == convert.txn_response(res, hdr)


def test_the_nested_shapes_etcd_sends():
    """A nested Txn's header is present and empty, a Put's previous value
    is there even when every field of it is zero, an empty op answers with
    an empty ResponseOp."""
    res = core.TxnResult(9, True, [
        core.EmptyResult(),
        core.PutResult(9, core.KeyValue(b"", 0, 0, 0, b"", 0)),
        core.TxnResult(0, False, [core.DeleteRangeResult(9, 0, [])]),
    ])
    got = rpc_pb2.TxnResponse.FromString(encoded.txn_response(1, 2, 3, res).SerializeToString())
    assert got.responses[0].WhichOneof("response") is None
    assert got.responses[1].response_put.HasField("prev_kv")
    assert got.responses[2].response_txn.HasField("header")
    assert encoded.txn_response(1, 2, 3, res).SerializeToString() == _upb(res, 1, 2, 3)


def test_an_unknown_result_is_refused_as_the_message_builder_refuses_it():
    res = core.TxnResult(1, True, [object()])
    with pytest.raises(TypeError, match="unexpected txn op result"):
        encoded.txn_response(1, 2, 3, res)
    with pytest.raises(TypeError, match="unexpected txn op result"):
        convert.txn_response(res, convert.Header(1, 2, 3))


def test_the_native_front_answers_txns_with_it():
    """A write Txn and a read-only one through brain serve's native front:
    the answers parse and carry what was written."""
    from tests.support.servers import kv_stub, start_brain

    srv = start_brain()
    try:
        with kv_stub(srv.endpoint) as st_:
            key = b"/registry/leases/kube-node-lease/n1"
            put = rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=b"v1"))
            get = rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))
            created = st_.kv.Txn(rpc_pb2.TxnRequest(
                compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, mod_revision=0)],
                success=[put], failure=[get]))
            assert created.succeeded and created.responses[0].response_put.header.revision == created.header.revision
            again = st_.kv.Txn(rpc_pb2.TxnRequest(
                compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, mod_revision=0)],
                success=[put], failure=[get]))
            assert not again.succeeded
            assert [kv.value for kv in again.responses[0].response_range.kvs] == [b"v1"]
            assert again.header.member_id == created.header.member_id != 0
            read = st_.kv.Txn(rpc_pb2.TxnRequest(success=[get]))
            assert read.succeeded and read.responses[0].response_range.count == 1
    finally:
        srv.cleanup()
