"""brain.api.convert: protobuf requests to core requests and core results to
protobuf responses, byte-exact with etcd where it matters (headers)."""

from __future__ import annotations

import pytest

from brain.api import convert
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.mvccpb import kv_pb2
from brain.mvcc import requests as core

HDR = convert.Header(cluster_id=0xC1, member_id=0xFFFF_FFFF_FFFF_FFF0, term=7)


def kv(key: bytes, rev: int = 5, value: bytes = b"v", lease: int = 0) -> core.KeyValue:
    return core.KeyValue(key, rev - 1, rev, 2, value, lease)


# ---------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------


def test_range_request_every_field():
    m = pb.RangeRequest(
        key=b"a", range_end=b"z", limit=10, revision=42,
        sort_order=pb.RangeRequest.DESCEND, sort_target=pb.RangeRequest.MOD,
        serializable=True, keys_only=True, count_only=True,
        min_mod_revision=1, max_mod_revision=2, min_create_revision=3, max_create_revision=4,
    )
    assert convert.range_request(m) == core.RangeRequest(
        b"a", b"z", 10, 42, core.SORT_DESCEND, core.TARGET_MOD, True, True, True, 1, 2, 3, 4
    )


def test_range_request_defaults():
    assert convert.range_request(pb.RangeRequest()) == core.RangeRequest(b"")


def test_put_and_delete_requests():
    m = pb.PutRequest(key=b"k", value=b"v", lease=9, prev_kv=True, ignore_value=True, ignore_lease=True)
    assert convert.put_request(m) == core.PutRequest(b"k", b"v", 9, True, True, True)
    assert convert.put_request(pb.PutRequest(key=b"k")) == core.PutRequest(b"k")
    d = pb.DeleteRangeRequest(key=b"a", range_end=b"\x00", prev_kv=True)
    assert convert.delete_range_request(d) == core.DeleteRangeRequest(b"a", b"\x00", True)


@pytest.mark.parametrize(
    "field,value",
    [("version", 3), ("create_revision", 4), ("mod_revision", 5), ("value", b"x"), ("lease", 6)],
)
def test_compare_every_union_member(field, value):
    m = pb.Compare(result=pb.Compare.LESS, target=pb.Compare.MOD, key=b"k", range_end=b"l", **{field: value})
    c = convert.compare(m)
    assert c == core.Compare(core.CMP_LESS, core.CMP_MOD, b"k", b"l", field, value)


def test_compare_zero_valued_union_member_is_still_set():
    # proto3 oneof members keep presence even at their default value
    c = convert.compare(pb.Compare(target=pb.Compare.MOD, key=b"k", mod_revision=0))
    assert (c.union, c.operand) == ("mod_revision", 0)
    c = convert.compare(pb.Compare(target=pb.Compare.VALUE, key=b"k", value=b""))
    assert (c.union, c.operand) == ("value", b"")


def test_compare_without_union():
    c = convert.compare(pb.Compare(target=pb.Compare.VERSION, key=b"k"))
    assert c.union is None and c.operand == 0


def _nested_txn_pb() -> pb.TxnRequest:
    inner = pb.TxnRequest(
        compare=[pb.Compare(key=b"i", version=1)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=b"i", value=b"1")), pb.RequestOp()],
        failure=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"i"))],
    )
    return pb.TxnRequest(
        compare=[pb.Compare(result=pb.Compare.GREATER, target=pb.Compare.CREATE, key=b"a", create_revision=2)],
        success=[
            pb.RequestOp(),
            pb.RequestOp(request_range=pb.RangeRequest(key=b"a", limit=1)),
            pb.RequestOp(request_put=pb.PutRequest(key=b"b", value=b"2", prev_kv=True)),
            pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"c", range_end=b"d")),
            pb.RequestOp(request_txn=inner),
        ],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=b"z"))],
    )


def test_txn_request_nested_with_empty_ops():
    t = convert.txn_request(_nested_txn_pb())
    assert t.compare == [core.Compare(core.CMP_GREATER, core.CMP_CREATE, b"a", b"", "create_revision", 2)]
    assert t.success[0] is None
    assert t.success[1] == core.RangeRequest(b"a", limit=1)
    assert t.success[2] == core.PutRequest(b"b", b"2", prev_kv=True)
    assert t.success[3] == core.DeleteRangeRequest(b"c", b"d")
    inner = t.success[4]
    assert isinstance(inner, core.TxnRequest)
    assert inner.compare == [core.Compare(core.CMP_EQUAL, core.CMP_VERSION, b"i", b"", "version", 1)]
    assert inner.success == [core.PutRequest(b"i", b"1"), None]
    assert inner.failure == [core.DeleteRangeRequest(b"i")]
    assert t.failure == [core.RangeRequest(b"z")]


def test_txn_request_empty():
    assert convert.txn_request(pb.TxnRequest()) == core.TxnRequest([], [], [])


def test_compaction_request():
    assert convert.compaction_request(pb.CompactionRequest(revision=9, physical=True)) == core.CompactRequest(9, True)


def test_txn_is_readonly_like_etcd():
    rng = pb.RequestOp(request_range=pb.RangeRequest(key=b"a"))
    put = pb.RequestOp(request_put=pb.PutRequest(key=b"a"))
    assert convert.txn_is_readonly(pb.TxnRequest())
    assert convert.txn_is_readonly(pb.TxnRequest(success=[rng], failure=[rng]))
    assert not convert.txn_is_readonly(pb.TxnRequest(success=[rng], failure=[put]))
    assert not convert.txn_is_readonly(pb.TxnRequest(success=[pb.RequestOp()]))
    nested_ro = pb.RequestOp(request_txn=pb.TxnRequest(success=[rng]))
    assert not convert.txn_is_readonly(pb.TxnRequest(success=[nested_ro]))


# ---------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------


def _top_header(rev: int) -> pb.ResponseHeader:
    return pb.ResponseHeader(cluster_id=0xC1, member_id=0xFFFF_FFFF_FFFF_FFF0, revision=rev, raft_term=7)


def test_range_response_full():
    res = core.RangeResult(revision=9, kvs=[kv(b"a", lease=3), kv(b"b", value=b"")], more=True, count=5)
    r = pb.RangeResponse.FromString(convert.range_columns_response(core.RangeColumns.of(res), HDR).SerializeToString())
    assert r == pb.RangeResponse(
        header=_top_header(9),
        kvs=[
            kv_pb2.KeyValue(key=b"a", create_revision=4, mod_revision=5, version=2, value=b"v", lease=3),
            kv_pb2.KeyValue(key=b"b", create_revision=4, mod_revision=5, version=2),
        ],
        more=True,
        count=5,
    )


def test_range_response_count_only_and_empty():
    r = convert.range_columns_response(core.RangeColumns(3, [], [], [], [], None, [], False, 7), HDR)
    assert pb.RangeResponse.FromString(r.SerializeToString()) == pb.RangeResponse(header=_top_header(3), count=7)
    r = convert.range_columns_response(core.RangeColumns(3, [], [], [], [], None, [], False, 0), HDR)
    assert r.SerializeToString() == pb.RangeResponse(header=_top_header(3)).SerializeToString()


@pytest.mark.parametrize("keys_only", [False, True])
def test_columns_encode_like_key_values(keys_only):
    """A page from columns is the bytes fill_kvs makes of the same
    KeyValues (keys_only: the values empty, leases kept)."""
    kvs = [kv(b"k%d" % i, value=b"v" * (i % 3), lease=i % 2 * (1 << 40)) for i in range(20)]
    cols = core.RangeColumns.of(core.RangeResult(7, kvs, False, 20))
    if keys_only:
        cols.values = None
        for one in kvs:
            one.value = b""
    built = pb.RangeResponse()
    convert.fill_columns(built, cols)
    expected = pb.RangeResponse()
    convert.fill_kvs(expected, kvs)
    assert built.SerializeToString() == expected.SerializeToString()


def test_put_response_with_and_without_prev_kv():
    r = convert.put_response(core.PutResult(revision=4), HDR)
    assert r == pb.PutResponse(header=_top_header(4))
    assert not r.HasField("prev_kv")
    r = convert.put_response(core.PutResult(revision=4, prev_kv=kv(b"k")), HDR)
    assert r.prev_kv == kv_pb2.KeyValue(key=b"k", create_revision=4, mod_revision=5, version=2, value=b"v")


def test_delete_range_response():
    r = convert.delete_range_response(core.DeleteRangeResult(revision=6, deleted=2, prev_kvs=[kv(b"a"), kv(b"b")]), HDR)
    assert r.header == _top_header(6)
    assert r.deleted == 2
    assert [k.key for k in r.prev_kvs] == [b"a", b"b"]
    r = convert.delete_range_response(core.DeleteRangeResult(revision=6, deleted=0), HDR)
    assert r == pb.DeleteRangeResponse(header=_top_header(6))


def test_compaction_response():
    assert convert.compaction_response(core.CompactResult(revision=11), HDR) == pb.CompactionResponse(
        header=_top_header(11)
    )


def test_top_level_header_carries_large_ids():
    hdr = convert.Header(cluster_id=2**64 - 1, member_id=2**63, term=2**40)
    r = pb.PutResponse.FromString(convert.put_response(core.PutResult(revision=1), hdr).SerializeToString())
    assert (r.header.cluster_id, r.header.member_id, r.header.raft_term) == (2**64 - 1, 2**63, 2**40)


def _nested_txn_result() -> core.TxnResult:
    inner = core.TxnResult(
        revision=8, succeeded=False,
        responses=[core.DeleteRangeResult(revision=8, deleted=1), core.EmptyResult()],
    )
    return core.TxnResult(
        revision=8,
        succeeded=True,
        responses=[
            core.EmptyResult(),
            core.RangeResult(revision=7, kvs=[kv(b"a")], more=False, count=1),
            core.PutResult(revision=8, prev_kv=kv(b"b")),
            core.DeleteRangeResult(revision=8, deleted=0),
            inner,
        ],
    )


def test_txn_response_nested_headers_exactly_as_etcd():
    r = convert.txn_response(_nested_txn_result(), HDR)
    assert r.header == _top_header(8)
    assert r.succeeded is True
    ops = r.responses
    assert [op.WhichOneof("response") for op in ops] == [
        None, "response_range", "response_put", "response_delete_range", "response_txn",
    ]
    # an empty RequestOp answers with an empty ResponseOp
    assert ops[0].SerializeToString() == b""
    # nested Range/Put/DeleteRange: header with only the revision
    assert ops[1].response_range.header == pb.ResponseHeader(revision=7)
    assert ops[1].response_range.count == 1
    assert ops[2].response_put.header == pb.ResponseHeader(revision=8)
    assert ops[2].response_put.prev_kv.key == b"b"
    assert ops[3].response_delete_range.header == pb.ResponseHeader(revision=8)
    assert ops[3].response_delete_range.SerializeToString() == b"\n\x02\x18\x08"
    # nested Txn: header present but empty (etcd allocates it, never fills it)
    nested = ops[4].response_txn
    assert nested.HasField("header") and nested.header == pb.ResponseHeader()
    assert nested.succeeded is False
    assert nested.responses[0].response_delete_range.deleted == 1
    assert nested.responses[1].WhichOneof("response") is None


def test_txn_response_bytes_match_etcd_capture():
    """Bytes captured from etcd 3.4.23 for Txn{success: [Txn{success: [Put c, Range a]}]}
    after `put a 1` (rev 2), `put b 2` (rev 3); the Txn wrote at rev 4."""
    inner = core.TxnResult(
        revision=4, succeeded=True,
        responses=[
            core.PutResult(revision=4),
            core.RangeResult(revision=4, kvs=[core.KeyValue(b"a", 2, 2, 1, b"1", 0)], more=False, count=1),
        ],
    )
    r = convert.txn_response(core.TxnResult(revision=4, succeeded=True, responses=[inner]), HDR)
    assert r.responses[0].SerializeToString() == (
        b'"$\n\x00\x10\x01\x1a\x06\x12\x04\n\x02\x18\x04\x1a\x16\n\x14\n\x02\x18\x04'
        b"\x12\x0c\n\x01a\x10\x02\x18\x02 \x01*\x011 \x01"
    )


def test_txn_response_failure_branch_with_no_ops():
    r = convert.txn_response(core.TxnResult(revision=3, succeeded=False, responses=[]), HDR)
    assert r == pb.TxnResponse(header=_top_header(3))


def test_txn_response_rejects_unknown_result():
    with pytest.raises(TypeError):
        convert.txn_response(core.TxnResult(revision=1, succeeded=True, responses=[object()]), HDR)


def test_round_trip_through_the_wire():
    req = pb.TxnRequest.FromString(_nested_txn_pb().SerializeToString())
    t = convert.txn_request(req)
    assert t == convert.txn_request(_nested_txn_pb())
    resp = convert.txn_response(_nested_txn_result(), HDR)
    again = pb.TxnResponse.FromString(resp.SerializeToString())
    assert again == resp
    assert again.responses[4].response_txn.HasField("header")
