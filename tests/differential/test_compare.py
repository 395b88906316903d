"""Unit tests of the differential comparer and generator (no servers needed)."""

from __future__ import annotations

from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.pb.mvccpb import kv_pb2

from tests.differential.compare import ErrorResult, first_difference, normalize
from tests.differential.generator import OpGenerator, _walk_ops, prefix_end

R = rpc_pb2.RangeRequest


def _kv(key, version=1, create=2, mod=2, value=b""):
    return kv_pb2.KeyValue(key=key, version=version, create_revision=create,
                           mod_revision=mod, value=value)


def _diff(method, req, a, b):
    return first_difference(normalize(method, req, a), normalize(method, req, b))


def test_header_identity_fields_ignored_revision_not():
    req = R(key=b"a")
    a = rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(cluster_id=1, member_id=2,
                                                            raft_term=3, revision=7))
    b = rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=7))
    assert _diff("Range", req, a, b) is None
    b.header.revision = 8
    assert "header.revision" in _diff("Range", req, a, b)


def test_message_presence_matters():
    req = rpc_pb2.PutRequest(key=b"a", prev_kv=True)
    a = rpc_pb2.PutResponse(header=rpc_pb2.ResponseHeader(revision=2))
    b = rpc_pb2.PutResponse(header=rpc_pb2.ResponseHeader(revision=2), prev_kv=kv_pb2.KeyValue())
    assert "prev_kv" in _diff("Put", req, a, b)


def test_key_order_matters_for_key_sort():
    req = R(key=b"a", range_end=b"z")
    a = rpc_pb2.RangeResponse(kvs=[_kv(b"a"), _kv(b"b")], count=2)
    b = rpc_pb2.RangeResponse(kvs=[_kv(b"b"), _kv(b"a")], count=2)
    assert _diff("Range", req, a, b)


def test_ties_in_non_key_sort_are_order_insensitive():
    req = R(key=b"a", range_end=b"z", sort_order=R.DESCEND, sort_target=R.VERSION)
    a = rpc_pb2.RangeResponse(kvs=[_kv(b"c", 2), _kv(b"a", 1), _kv(b"b", 1)], count=3)
    b = rpc_pb2.RangeResponse(kvs=[_kv(b"c", 2), _kv(b"b", 1), _kv(b"a", 1)], count=3)
    assert _diff("Range", req, a, b) is None
    # but the sort value sequence itself must agree
    c = rpc_pb2.RangeResponse(kvs=[_kv(b"a", 1), _kv(b"c", 2), _kv(b"b", 1)], count=3)
    assert _diff("Range", req, a, c)
    # and non-tied members must agree exactly
    d = rpc_pb2.RangeResponse(kvs=[_kv(b"c", 2, mod=9), _kv(b"a", 1), _kv(b"b", 1)], count=3)
    assert _diff("Range", req, a, d)


def test_truncated_tie_group_compares_sort_values_only():
    req = R(key=b"a", range_end=b"z", sort_order=R.ASCEND, sort_target=R.VERSION, limit=2)
    a = rpc_pb2.RangeResponse(kvs=[_kv(b"x", 1), _kv(b"a", 2)], more=True, count=3)
    b = rpc_pb2.RangeResponse(kvs=[_kv(b"x", 1), _kv(b"b", 2)], more=True, count=3)
    assert _diff("Range", req, a, b) is None
    c = rpc_pb2.RangeResponse(kvs=[_kv(b"x", 1), _kv(b"b", 3)], more=True, count=3)
    assert _diff("Range", req, a, c)


def test_txn_nested_range_normalised_by_branch():
    inner = R(key=b"a", range_end=b"z", sort_target=R.MOD)
    req = rpc_pb2.TxnRequest(failure=[rpc_pb2.RequestOp(request_txn=rpc_pb2.TxnRequest(
        success=[rpc_pb2.RequestOp(request_range=inner)]))])

    def resp(order):
        rr = rpc_pb2.RangeResponse(kvs=[_kv(k, mod=5) for k in order], count=2)
        return rpc_pb2.TxnResponse(succeeded=False, responses=[rpc_pb2.ResponseOp(
            response_txn=rpc_pb2.TxnResponse(succeeded=True, responses=[
                rpc_pb2.ResponseOp(response_range=rr)]))])

    assert _diff("Txn", req, resp([b"a", b"b"]), resp([b"b", b"a"])) is None
    other = resp([b"a", b"b"])
    other.succeeded = True
    assert _diff("Txn", req, resp([b"a", b"b"]), other)


def test_error_vs_response_differs():
    req = R(key=b"a")
    assert _diff("Range", req, ErrorResult("OUT_OF_RANGE", "x"), rpc_pb2.RangeResponse())


def test_errors_compared_by_code_and_text():
    a = ErrorResult("INVALID_ARGUMENT", "etcdserver: key is not provided")
    b = ErrorResult("INVALID_ARGUMENT", "etcdserver: key not provided")
    c = ErrorResult("OUT_OF_RANGE", "etcdserver: key is not provided")
    assert _diff("Put", None, a, a) is None
    assert _diff("Put", None, a, b)
    assert _diff("Put", None, a, c)


def test_prefix_end():
    assert prefix_end(b"a") == b"b"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


def test_generator_is_deterministic():
    g1, g2 = OpGenerator(42), OpGenerator(42)
    for _ in range(500):
        o1, o2 = g1.next_op(), g2.next_op()
        assert o1.method == o2.method
        assert o1.request.SerializeToString(deterministic=True) == \
            o2.request.SerializeToString(deterministic=True)


def test_generator_never_mixes_ignore_flags_with_txn_deletes():
    g = OpGenerator(7)
    seen = 0
    for _ in range(5000):
        op = g.next_op()
        if op.method != "Txn":
            continue
        ops = list(_walk_ops(op.request))
        if any(o.WhichOneof("request") == "request_delete_range" for o in ops):
            seen += 1
            for o in ops:
                if o.WhichOneof("request") == "request_put":
                    assert not o.request_put.ignore_value and not o.request_put.ignore_lease
    assert seen > 50
