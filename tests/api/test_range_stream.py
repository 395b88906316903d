"""RangeStream's chunk planner and stream, in process (no gRPC).

The differential against etcd 3.7 (tests/differential/test_range_stream_vs_etcd.py)
compares the same behaviour with a real etcd; these pin the rules on their
own: the sizing rule, the size it measures, the order of the request checks,
and the stream's shape, pinning and mid-stream compaction over a real engine.
"""

from __future__ import annotations

import grpc
import pytest

from brain.api import convert, encoded
from brain.api.kv import KVService
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.range_stream import RangeStreamer, check_request, first_limit, measured_size, next_limit
from brain.engine import Engine, EngineConfig
from brain.mvcc import errors
from brain.mvcc.requests import (
    CompactRequest,
    DeleteRangeRequest,
    KeyValue,
    LeaseGrantRequest,
    PutRequest,
    RangeRequest,
)
from tests.support.servers import unavailable


def test_next_limit_doubles_halves_or_keeps():
    target = 1000
    assert next_limit(10, 499, target) == 20
    assert next_limit(10, 500, target) == 10  # exactly half the target is not "below half"
    assert next_limit(10, 2000, target) == 10
    assert next_limit(10, 2001, target) == 5
    assert next_limit(1, 5000, target) == 1  # never 0, which would mean "no limit"
    assert next_limit(3, 5000, target) == 1


def test_first_limit():
    assert first_limit(2**63 - 1) == 10
    assert first_limit(4) == 4
    assert first_limit(-1) == -1  # a negative limit reads the whole range in one chunk


@pytest.mark.parametrize("more,count,value", [(True, 11, b"v" * 300), (False, 0, b""), (True, 200000, b"x")])
def test_measured_size_is_the_range_response_etcd_measures(more, count, value):
    kvs = [KeyValue(b"key/%d" % i, 5 + i, 700 + i, 1 + i, value, 0) for i in range(7)]
    revision = 123456
    built = rpc_pb2.RangeResponse()
    built.header.revision = revision
    convert.fill_kvs(built, kvs)
    built.more = more
    built.count = count
    only_kvs = rpc_pb2.RangeResponse()
    convert.fill_kvs(only_kvs, kvs)
    assert measured_size(only_kvs.ByteSize(), revision, more, count) == built.ByteSize()


@pytest.mark.parametrize("request_, expected", [
    (RangeRequest(b"", sort_order=2), errors.ErrEmptyKey),
    (RangeRequest(b"a", sort_order=7), errors.ErrInvalidSortOption),
    (RangeRequest(b"a", sort_target=9), errors.ErrInvalidSortOption),
    (RangeRequest(b"a", sort_order=2), "RangeStream does not support custom sort orders"),
    (RangeRequest(b"a", sort_order=1, sort_target=3), "RangeStream does not support custom sort orders"),
    (RangeRequest(b"a", sort_order=2, max_mod_revision=3), "RangeStream does not support custom sort orders"),
    (RangeRequest(b"a", min_create_revision=-1), "RangeStream does not support revision filters"),
    (RangeRequest(b"a", max_create_revision=2), "RangeStream does not support revision filters"),
])
def test_request_checks_in_etcds_order(request_, expected):
    with pytest.raises(errors.EtcdError) as got:
        check_request(request_)
    if isinstance(expected, str):
        assert (got.value.code, got.value.message) == ("UNIMPLEMENTED", expected)
    else:
        assert got.value == expected


def test_accepted_orders():
    for r in (RangeRequest(b"a", sort_order=1), RangeRequest(b"a", sort_target=3), RangeRequest(b"a")):
        check_request(r)


class Aborted(Exception):
    pass


class Context:
    """The little of a servicer context the stream uses."""

    def __init__(self) -> None:
        self.status = None

    def is_active(self) -> bool:
        return True

    def abort(self, code, details):
        self.status = (code, details)
        raise Aborted(details)


@pytest.fixture
def engine(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data")))
    yield eng
    eng.close()


def put_many(engine, n: int, value: bytes = b"v", prefix: bytes = b"p/") -> None:
    for i in range(n):
        engine.submit(PutRequest(prefix + b"%05d" % i, value)).result()


def streamer(engine, target: int = 1572864) -> RangeStreamer:
    return RangeStreamer(engine, convert.Header.of(engine), target)


def range_of(prefix=b"p/", **kw) -> rpc_pb2.RangeRequest:
    return rpc_pb2.RangeRequest(key=prefix, range_end=prefix[:-1] + bytes([prefix[-1] + 1]), **kw)


def _message(m) -> rpc_pb2.RangeStreamResponse:
    """A chunk as the client parses it (the stream may yield messages or
    bytes already encoded, brain.api.encoded)."""
    return rpc_pb2.RangeStreamResponse.FromString(m.SerializeToString())


def _messages(gen) -> list[rpc_pb2.RangeStreamResponse]:
    return [_message(m) for m in gen]


def test_chunks_grow_from_ten_and_only_the_last_has_header_more_count(engine):
    put_many(engine, 75)
    msgs = _messages(streamer(engine).stream(range_of(), Context()))
    assert [len(m.range_response.kvs) for m in msgs] == [10, 20, 40, 5]
    for m in msgs[:-1]:
        r = m.range_response
        assert not r.HasField("header") and not r.more and not r.count
    last = msgs[-1].range_response
    assert last.HasField("header") and last.header.revision == engine.committed_rev
    assert (last.more, last.count) == (False, 75)
    keys = [kv.key for m in msgs for kv in m.range_response.kvs]
    assert keys == [b"p/%05d" % i for i in range(75)]


def test_limit_cuts_the_range_and_count_is_the_whole_range(engine):
    put_many(engine, 100)
    msgs = _messages(streamer(engine).stream(range_of(limit=25), Context()))
    assert [len(m.range_response.kvs) for m in msgs] == [10, 15]
    assert (msgs[-1].range_response.more, msgs[-1].range_response.count) == (True, 100)
    whole = _messages(streamer(engine).stream(range_of(limit=-1), Context()))
    assert [len(m.range_response.kvs) for m in whole] == [100]


def test_small_target_halves_chunks_down_to_one(engine):
    put_many(engine, 30, value=b"x" * 1000)
    msgs = _messages(streamer(engine, target=400).stream(range_of(), Context()))
    # 10 kvs of ~1 KiB are above 2x400: 5, 2, 1, then 1 per chunk
    assert [len(m.range_response.kvs) for m in msgs][:5] == [10, 5, 2, 1, 1]
    assert sum(len(m.range_response.kvs) for m in msgs) == 30


def test_count_only_is_one_message(engine):
    put_many(engine, 30)
    msgs = _messages(streamer(engine).stream(range_of(count_only=True, limit=3), Context()))
    assert len(msgs) == 1
    r = msgs[0].range_response
    assert (r.count, len(r.kvs), r.more, r.header.revision) == (30, 0, False, engine.committed_rev)


def test_writes_after_the_first_chunk_do_not_show(engine):
    put_many(engine, 40)
    start_rev = engine.committed_rev
    gen = streamer(engine).stream(range_of(), Context())
    first = _message(next(gen))
    assert len(first.range_response.kvs) == 10
    engine.submit(PutRequest(b"p/00039", b"changed")).result()
    engine.submit(PutRequest(b"p/00020x", b"new")).result()
    rest = _messages(gen)
    kvs = [kv for m in [first, *rest] for kv in m.range_response.kvs]
    assert [kv.key for kv in kvs] == [b"p/%05d" % i for i in range(40)]
    assert kvs[-1].value == b"v"
    assert rest[-1].range_response.header.revision == start_rev


def test_compaction_above_the_pinned_revision_fails_a_later_chunk(engine):
    put_many(engine, 40)
    ctx = Context()
    gen = streamer(engine).stream(range_of(), ctx)
    next(gen)
    engine.submit(PutRequest(b"other", b"x")).result()
    engine.submit(CompactRequest(engine.committed_rev)).result()
    with pytest.raises(Aborted):
        list(gen)
    assert ctx.status == (grpc.StatusCode.OUT_OF_RANGE, errors.ErrCompacted.message)


def test_refusals_come_before_any_message(engine):
    put_many(engine, 3)
    for req, code, text in (
        (range_of(revision=engine.committed_rev + 1), grpc.StatusCode.OUT_OF_RANGE, errors.ErrFutureRev.message),
        (range_of(sort_order=2), grpc.StatusCode.UNIMPLEMENTED, "RangeStream does not support custom sort orders"),
        (rpc_pb2.RangeRequest(), grpc.StatusCode.INVALID_ARGUMENT, errors.ErrEmptyKey.message),
    ):
        ctx = Context()
        gen = streamer(engine).stream(req, ctx)
        with pytest.raises(Aborted):
            next(gen)
        assert ctx.status == (code, text)


# -- unary Range, a Txn's Range and RangeStream answer the same keys alike ----

LEASE = 0x51
R = rpc_pb2.RangeRequest


@pytest.fixture
def leased(engine):
    """p/00000..p/00029, every third put on a lease; then some rewritten
    with the lease the other way round, one deleted and put again on the
    lease: (engine, a revision before the rewrites)."""
    engine.lease_grant(LeaseGrantRequest(3600, LEASE))
    for i in range(30):
        engine.submit(PutRequest(b"p/%05d" % i, b"v%02d" % (30 - i), lease=LEASE if i % 3 == 0 else 0)).result()
    before = engine.committed_rev
    for i in range(0, 30, 4):
        engine.submit(PutRequest(b"p/%05d" % i, b"w%02d" % i, lease=0 if i % 3 == 0 else LEASE)).result()
    engine.submit(DeleteRangeRequest(b"p/00007")).result()
    engine.submit(PutRequest(b"p/00007", b"again", lease=LEASE)).result()
    return engine, before


# RangeStream sorts each chunk on its own and goes on after the chunk's last
# KeyValue, as etcd 3.7 does: a range sorted by another target than the key
# reads as a unary Range does only when it fits in the first chunk (10 keys),
# so those cases read p/00000..p/00009.
TEN = b"p/0000"
AGREEMENT_CASES = {
    "keys_only": {"keys_only": True},
    "keys_only limit": {"keys_only": True, "limit": 7},
    "keys_only limit past a chunk": {"keys_only": True, "limit": 23},
    "keys_only serializable": {"keys_only": True, "serializable": True},
    "keys_only key ascend": {"keys_only": True, "sort_order": R.ASCEND},
    "keys_only sorted by mod": {"keys_only": True, "sort_target": R.MOD, "prefix": TEN},
    "keys_only sorted by create": {"keys_only": True, "sort_target": R.CREATE, "prefix": TEN},
    "keys_only sorted by version": {"keys_only": True, "sort_target": R.VERSION, "prefix": TEN},
    "keys_only sorted by value": {"keys_only": True, "sort_target": R.VALUE, "prefix": TEN},
    "values": {},
    "values limit": {"limit": 11},
    "values sorted by mod": {"sort_target": R.MOD, "prefix": TEN},
}


def _unary(kv: KVService, m) -> rpc_pb2.RangeResponse:
    return rpc_pb2.RangeResponse.FromString(kv.range(m).SerializeToString())


def _in_txn(kv: KVService, m) -> rpc_pb2.RangeResponse:
    txn = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_range=m)])
    return rpc_pb2.TxnResponse.FromString(kv.txn(txn).SerializeToString()).responses[0].response_range


def _streamed(kv: KVService, m) -> rpc_pb2.RangeResponse:
    """The stream's messages merged, as clientv3 merges them."""
    out = rpc_pb2.RangeResponse()
    for msg in _messages(kv.range_streamer.stream(m, Context())):
        out.MergeFrom(msg.range_response)
    return out


def _fields(r: rpc_pb2.RangeResponse) -> tuple:
    """Every KeyValue's bytes, count, more and the header's revision."""
    return [kv.SerializeToString() for kv in r.kvs], r.count, r.more, r.header.revision


@pytest.mark.parametrize("encoder", ["native", "protobuf"])
@pytest.mark.parametrize("at", ["now", "before the rewrites"])
@pytest.mark.parametrize("case", list(AGREEMENT_CASES))
def test_unary_range_txn_range_and_range_stream_agree_field_for_field(leased, monkeypatch, encoder, at, case):
    """The same keys, leased and not, read by unary Range, a Range inside a
    Txn and RangeStream: the same KeyValues, byte for byte (each field: key,
    create and mod revision, version, value, lease), count, more and header
    revision, with the native KeyValue encoder and with protobuf.  A
    keys_only range not sorted by value carries no lease anywhere (etcd 3.7
    serves it from its key index); sorted by value, it does."""
    engine, before = leased
    if encoder == "native" and not encoded.available():
        unavailable("brain._transport (the native KeyValue encoder) is not built")
    if encoder == "protobuf":
        monkeypatch.setattr(encoded, "available", lambda: False)
    kw = dict(AGREEMENT_CASES[case])
    if at != "now":
        kw["revision"] = before
    m = range_of(kw.pop("prefix", b"p/"), **kw)
    kv = KVService(engine)
    unary, in_txn, streamed = _unary(kv, m), _in_txn(kv, m), _streamed(kv, m)
    assert _fields(unary) == _fields(streamed), "unary Range vs RangeStream"
    assert _fields(unary)[:3] == _fields(in_txn)[:3], "unary Range vs Txn"
    leases = {kv.key: kv.lease for kv in unary.kvs}
    assert unary.kvs and all(kv.value == b"" for kv in unary.kvs) == bool(kw.get("keys_only"))
    if kw.get("keys_only") and kw.get("sort_target") != R.VALUE:
        assert set(leases.values()) == {0}, leases
    else:
        assert LEASE in leases.values() and 0 in leases.values(), leases
