"""A Python gRPC client exercising every KV RPC of `python -m brain serve`.

Every call goes to brain and to an etcd (kept in lockstep), and the
responses must be byte-identical once the top-level header's
cluster_id, member_id and raft_term are cleared; errors must have the same
code and text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc

from tests.support.servers import grpc_channel
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc

R = pb.RangeRequest


@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    details: str


def _masked(resp) -> bytes:
    m = type(resp)()
    m.CopyFrom(resp)
    if m.HasField("header"):
        m.header.cluster_id = 0
        m.header.member_id = 0
        m.header.raft_term = 0
    return m.SerializeToString()


class Client:
    def __init__(self, brain_endpoint: str, etcd_endpoint: str) -> None:
        opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self._channels = [grpc_channel(brain_endpoint, options=opts), grpc_channel(etcd_endpoint, options=opts)]
        self._stubs = [rpc_pb2_grpc.KVStub(ch) for ch in self._channels]
        self.brain = self._stubs[0]

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    @staticmethod
    def _one(stub, method: str, req):
        try:
            return getattr(stub, method)(req, timeout=20)
        except grpc.RpcError as e:
            return Failure(e.code(), e.details())

    def call(self, method: str, req, *, compare: bool = True):
        got = self._one(self._stubs[0], method, req)
        want = self._one(self._stubs[1], method, req)
        if compare:
            if isinstance(want, Failure) or isinstance(got, Failure):
                assert got == want, f"{method}({req}): brain {got} != etcd {want}"
            else:
                assert _masked(got) == _masked(want), f"{method}({req}):\nbrain {got}\netcd {want}"
        return got

    def ok(self, method: str, req, **kw):
        r = self.call(method, req, **kw)
        assert not isinstance(r, Failure), r
        return r

    def fails(self, method: str, req, code: grpc.StatusCode, details: str, **kw) -> None:
        r = self.call(method, req, **kw)
        assert r == Failure(code, details)

    # shorthands
    def put(self, key: bytes, value: bytes = b"", **kw):
        return self.ok("Put", pb.PutRequest(key=key, value=value, **kw))

    def range(self, key: bytes, range_end: bytes = b"", **kw):
        return self.ok("Range", R(key=key, range_end=range_end, **kw))


@pytest.fixture(scope="module")
def kv(servers):
    c = Client(servers.brain.endpoint, servers.etcd.endpoint)
    yield c
    c.close()


def prefix_end(p: bytes) -> bytes:
    return p[:-1] + bytes([p[-1] + 1])


INVALID = grpc.StatusCode.INVALID_ARGUMENT
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE


def test_put_range_header(kv):
    r = kv.put(b"h/k", b"v")
    h = r.header
    assert h.cluster_id and h.member_id and h.raft_term and h.revision > 1
    got = kv.range(b"h/k")
    assert got.header.revision == h.revision
    (item,) = got.kvs
    assert (item.key, item.value, item.version, item.create_revision, item.mod_revision, item.lease) == (
        b"h/k", b"v", 1, h.revision, h.revision, 0
    )
    assert got.count == 1 and not got.more
    assert kv.range(b"h/missing").count == 0


def test_range_options(kv):
    p = b"ro/"
    for i, k in enumerate([b"d", b"a", b"c", b"b", b"e"]):
        kv.put(p + k, b"%d" % (9 - i))
    kv.put(p + b"c", b"again")  # c: version 2, newest mod_revision
    end = prefix_end(p)
    assert [x.key for x in kv.range(p, end).kvs] == [p + c for c in (b"a", b"b", b"c", b"d", b"e")]
    r = kv.range(p, end, limit=2)
    assert (len(r.kvs), r.more, r.count) == (2, True, 5)
    r = kv.range(p, end, limit=5)
    assert (len(r.kvs), r.more) == (5, False)
    r = kv.range(p, end, count_only=True)
    assert (list(r.kvs), r.count) == ([], 5)
    r = kv.range(p, end, keys_only=True)
    assert all(x.value == b"" and x.version for x in r.kvs)
    for order in (R.NONE, R.ASCEND, R.DESCEND):
        for target in (R.KEY, R.VERSION, R.CREATE, R.MOD, R.VALUE):
            kv.range(p, end, sort_order=order, sort_target=target)
            kv.range(p, end, sort_order=order, sort_target=target, limit=2)
    assert kv.range(p, end, sort_order=R.DESCEND).kvs[0].key == p + b"e"
    assert kv.range(p, end, sort_order=R.DESCEND, sort_target=R.MOD).kvs[0].key == p + b"c"
    assert kv.range(p, end, serializable=True).count == 5
    mods = {x.key: x.mod_revision for x in kv.range(p, end).kvs}
    creates = {x.key: x.create_revision for x in kv.range(p, end).kvs}
    lo = sorted(mods.values())[2]
    assert {x.key for x in kv.range(p, end, min_mod_revision=lo).kvs} == {k for k, m in mods.items() if m >= lo}
    assert {x.key for x in kv.range(p, end, max_mod_revision=lo).kvs} == {k for k, m in mods.items() if m <= lo}
    lo = sorted(creates.values())[1]
    kv.range(p, end, min_create_revision=lo)
    kv.range(p, end, max_create_revision=lo)
    # history: the first value of c, and the whole prefix as it was
    first_c = creates[p + b"c"]
    assert kv.range(p + b"c", revision=first_c).kvs[0].value == b"7"
    assert kv.range(p, end, revision=first_c).count == 3


def test_range_from_key_and_whole_keyspace(kv):
    kv.put(b"zzz/1", b"x")
    r = kv.range(b"zzz/", b"\x00")
    assert [x.key for x in r.kvs] == [b"zzz/1"]
    kv.range(b"\x00", b"\x00", keys_only=True)
    kv.range(b"\x00", b"\x00", count_only=True)


def test_range_errors(kv):
    kv.fails("Range", R(), INVALID, "etcdserver: key is not provided")
    now = kv.range(b"x").header.revision
    kv.fails("Range", R(key=b"x", revision=now + 10), OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")


def test_put_options_and_errors(kv):
    kv.put(b"po/k", b"1")
    r = kv.put(b"po/k", b"2", prev_kv=True)
    assert r.prev_kv.value == b"1" and r.prev_kv.version == 1
    assert not kv.put(b"po/new", b"x", prev_kv=True).HasField("prev_kv")
    r = kv.put(b"po/k", ignore_value=True, prev_kv=True)
    assert r.prev_kv.value == b"2"
    assert kv.range(b"po/k").kvs[0].value == b"2"
    kv.put(b"po/k", b"3", ignore_lease=True)
    kv.fails("Put", pb.PutRequest(key=b""), INVALID, "etcdserver: key is not provided")
    kv.fails("Put", pb.PutRequest(key=b"po/none", ignore_value=True), INVALID, "etcdserver: key not found")
    kv.fails("Put", pb.PutRequest(key=b"po/k", value=b"v", ignore_value=True), INVALID, "etcdserver: value is provided")
    kv.fails("Put", pb.PutRequest(key=b"po/k", lease=5, ignore_lease=True), INVALID, "etcdserver: lease is provided")
    kv.fails("Put", pb.PutRequest(key=b"po/k", lease=12345), grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")


def test_request_size_limits(kv):
    kv.fails("Put", pb.PutRequest(key=b"big", value=b"x" * 1572864), INVALID, "etcdserver: request is too large")
    kv.put(b"big", b"x" * 1572800)
    assert len(kv.range(b"big").kvs[0].value) == 1572800
    # reads are only bounded by gRPC's receive limit (max-request-bytes + 512 KiB)
    assert kv.range(b"k" * 1600000).count == 0
    kv.fails("Range", R(key=b"k" * 2200000), grpc.StatusCode.RESOURCE_EXHAUSTED,
             "grpc: received message larger than max (2200005 vs. 2097152)")


def test_delete_range(kv):
    p = b"dr/"
    for c in b"abcd":
        kv.put(p + bytes([c]), bytes([c]))
    r = kv.ok("DeleteRange", pb.DeleteRangeRequest(key=p + b"a"))
    assert r.deleted == 1 and not r.prev_kvs
    r = kv.ok("DeleteRange", pb.DeleteRangeRequest(key=p + b"a"))
    assert r.deleted == 0
    r = kv.ok("DeleteRange", pb.DeleteRangeRequest(key=p + b"b", range_end=prefix_end(p), prev_kv=True))
    assert r.deleted == 3 and [x.key for x in r.prev_kvs] == [p + b"b", p + b"c", p + b"d"]
    kv.ok("DeleteRange", pb.DeleteRangeRequest(key=b"zzzz", range_end=b"\x00"))
    kv.fails("DeleteRange", pb.DeleteRangeRequest(), INVALID, "etcdserver: key is not provided")


def _op(**kw) -> pb.RequestOp:
    return pb.RequestOp(**kw)


def test_txn_compares(kv):
    kv.put(b"tc/a", b"va")
    m = kv.range(b"tc/a").kvs[0].mod_revision
    C = pb.Compare
    cases = [
        C(key=b"tc/a", target=C.VALUE, result=C.EQUAL, value=b"va"),
        C(key=b"tc/a", target=C.VALUE, result=C.GREATER, value=b"v"),
        C(key=b"tc/a", target=C.VALUE, result=C.LESS, value=b"v"),
        C(key=b"tc/a", target=C.VALUE, result=C.NOT_EQUAL, value=b"va"),
        C(key=b"tc/a", target=C.VERSION, result=C.EQUAL, version=1),
        C(key=b"tc/a", target=C.CREATE, result=C.EQUAL, create_revision=m),
        C(key=b"tc/a", target=C.MOD, result=C.GREATER, mod_revision=m - 1),
        C(key=b"tc/a", target=C.LEASE, result=C.EQUAL, lease=0),
        C(key=b"tc/none", target=C.MOD, result=C.EQUAL, mod_revision=0),
        C(key=b"tc/none", target=C.VALUE, result=C.EQUAL, value=b""),
        C(key=b"tc/", range_end=b"tc0", target=C.VERSION, result=C.GREATER, version=0),
        C(key=b"tc/", range_end=b"tc0", target=C.VERSION, result=C.EQUAL, version=5),
        # a union member that does not match the target
        C(key=b"tc/a", target=C.MOD, result=C.EQUAL, version=m),
    ]
    for c in cases:
        kv.ok("Txn", pb.TxnRequest(compare=[c], success=[_op(request_range=R(key=b"tc/a"))],
                                   failure=[_op(request_range=R(key=b"tc/none"))]))
    assert kv.ok("Txn", pb.TxnRequest(compare=cases[:2])).succeeded
    assert not kv.ok("Txn", pb.TxnRequest(compare=cases[:3])).succeeded


def test_txn_ops_nested_and_headers(kv):
    kv.put(b"tn/a", b"1")
    inner = pb.TxnRequest(
        compare=[pb.Compare(key=b"tn/a", target=pb.Compare.VALUE, value=b"1")],
        success=[_op(request_put=pb.PutRequest(key=b"tn/c", value=b"3")), _op(request_range=R(key=b"tn/a"))],
    )
    r = kv.ok("Txn", pb.TxnRequest(success=[
        _op(request_range=R(key=b"tn/a")),
        _op(request_put=pb.PutRequest(key=b"tn/b", value=b"2", prev_kv=True)),
        _op(request_delete_range=pb.DeleteRangeRequest(key=b"tn/zz", prev_kv=True)),
        _op(request_txn=inner),
    ]))
    assert r.succeeded
    rev = r.header.revision
    ops = r.responses
    assert ops[0].response_range.header == pb.ResponseHeader(revision=rev - 1)
    assert ops[1].response_put.header == pb.ResponseHeader(revision=rev)
    assert ops[2].response_delete_range.header == pb.ResponseHeader(revision=rev)
    nested = ops[3].response_txn
    assert nested.HasField("header") and nested.header == pb.ResponseHeader()
    assert nested.responses[1].response_range.header.revision == rev
    assert kv.range(b"tn/c").kvs[0].mod_revision == rev


def test_txn_failure_branch_and_read_only(kv):
    kv.put(b"tf/a", b"1")
    miss = pb.Compare(key=b"tf/a", target=pb.Compare.VALUE, value=b"2")
    r = kv.ok("Txn", pb.TxnRequest(compare=[miss], success=[_op(request_put=pb.PutRequest(key=b"tf/x"))],
                                   failure=[_op(request_range=R(key=b"tf/a")), _op(request_range=R(key=b"tf/b"))]))
    assert not r.succeeded and len(r.responses) == 2
    before = kv.range(b"tf/a").header.revision
    r = kv.ok("Txn", pb.TxnRequest(success=[_op(request_range=R(key=b"tf/a", count_only=True))]))
    assert r.header.revision == before  # a read-only txn does not advance the revision
    kv.ok("Txn", pb.TxnRequest())


def test_txn_empty_request_op(kv):
    # etcd's checkRequestOp refuses an empty RequestOp (nested ones too)
    empty = pb.TxnRequest(success=[_op(), _op(request_put=pb.PutRequest(key=b"te/k", value=b"v"))])
    kv.fails("Txn", empty, INVALID, "etcdserver: key not found")
    kv.fails("Txn", pb.TxnRequest(failure=[_op(request_txn=pb.TxnRequest(success=[_op()]))]), INVALID,
             "etcdserver: key not found")


def test_txn_errors(kv):
    put = _op(request_put=pb.PutRequest(key=b"tx/dup", value=b"1"))
    kv.fails("Txn", pb.TxnRequest(success=[put, put]), INVALID, "etcdserver: duplicate key given in txn request")
    many = [_op(request_put=pb.PutRequest(key=b"tx/%d" % i)) for i in range(129)]
    kv.fails("Txn", pb.TxnRequest(success=many), INVALID, "etcdserver: too many operations in txn request")
    kv.ok("Txn", pb.TxnRequest(success=many[:128]))
    kv.fails("Txn", pb.TxnRequest(success=[_op(request_put=pb.PutRequest(key=b""))]), INVALID,
             "etcdserver: key is not provided")
    big = _op(request_put=pb.PutRequest(key=b"tx/big", value=b"x" * 1572864))
    kv.fails("Txn", pb.TxnRequest(success=[big]), INVALID, "etcdserver: request is too large")


def test_concurrent_writers_get_distinct_revisions(kv):
    revs: list[int] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(25):
            r = kv.brain.Put(pb.PutRequest(key=b"cw/%d/%d" % (n, i), value=b"v"), timeout=20)
            with lock:
                revs.append(r.header.revision)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(revs) == 200 and len(set(revs)) == 200
    assert max(revs) - min(revs) == 199
    # the etcd side did not see these writes; catch it up so revisions stay in lockstep
    for n in range(8):
        for i in range(25):
            kv._stubs[1].Put(pb.PutRequest(key=b"cw/%d/%d" % (n, i), value=b"v"), timeout=20)
    assert kv.range(b"cw/", b"cw0", count_only=True).count == 200


def test_deadline_and_cancel_do_not_hurt_the_server(kv):
    watch = rpc_pb2_grpc.WatchStub(kv._channels[0])
    create = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"dl/", range_end=b"dl0"))
    # A Watch stream never ends on its own, so its deadline certainly fires.
    stream = watch.Watch(iter([create]), timeout=0.5)
    assert next(stream).created
    with pytest.raises(grpc.RpcError) as ei:
        next(stream)
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # A cancelled stream ends as CANCELLED on the client; the server lets it go.
    stream = watch.Watch(iter([create]), timeout=20)
    assert next(stream).created
    stream.cancel()
    with pytest.raises(grpc.RpcError) as ei:
        next(stream)
    assert ei.value.code() == grpc.StatusCode.CANCELLED
    # Unary calls with a 1 us deadline: grpc may expire them anywhere between
    # the client and the handler, or (often, measured: 2 to 20 of 20) not at
    # all; each must end either answered correctly or as DEADLINE_EXCEEDED.
    for _ in range(20):
        try:
            r = kv.brain.Range(R(key=b"\x00", range_end=b"\x00", count_only=True), timeout=0.000001)
            assert r.header.revision > 0
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server still answers, and the expired and cancelled calls left no trace.
    kv.range(b"x")
    kv.put(b"dl/after", b"v")
    assert kv.range(b"dl/after").kvs[0].value == b"v"


# --- compaction: last --------------------------------------------------------


def test_compact(kv):
    kv.put(b"cp/k", b"old")
    old = kv.range(b"cp/k").kvs[0].mod_revision
    kv.put(b"cp/k", b"new")
    kv.put(b"cp/k", b"newer")
    now = kv.range(b"cp/k").header.revision
    r = kv.ok("Compact", pb.CompactionRequest(revision=old + 1))
    assert r.header.revision == now
    kv.fails("Range", R(key=b"cp/k", revision=old), OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
    assert kv.range(b"cp/k", revision=old + 1).kvs[0].value == b"new"
    kv.fails("Compact", pb.CompactionRequest(revision=old), OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
    kv.fails("Compact", pb.CompactionRequest(revision=now + 1), OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
    kv.ok("Compact", pb.CompactionRequest(revision=now, physical=True))
    assert kv.range(b"cp/k").kvs[0].value == b"newer"
    # a txn whose read hits a compacted revision fails as a whole
    kv.fails("Txn", pb.TxnRequest(success=[_op(request_range=R(key=b"cp/k", revision=old))]), OUT_OF_RANGE,
             "etcdserver: mvcc: required revision has been compacted")
