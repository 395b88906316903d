"""KV.RangeStream against etcd 3.7.3, on both of brain's transports.

One etcd 3.7 and two brains (the native front and grpcio) are loaded with
the same writes in the same order, so revisions agree; every case sends the
same RangeStream to all three and compares, per message, which fields of
the RangeResponse are on the wire (earlier chunks: kvs only), the kvs
byte for byte, the header's revision, ``more`` and ``count``, or the final
status (code and text).  cluster_id, member_id and raft_term differ between
servers: only the header's revision is compared.  The numbers in the
section comments are those of the case checklist the implementation was
planned with (etcd 3.7.3's behaviour, read in its v3_server.go and
v3rpc/key.go).
"""

from __future__ import annotations

import random
import re
import subprocess

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.pb.mvccpb import kv_pb2
from tests.support.etcd_tools import etcd_tool, require_oracle, start_oracle
from tests.support.servers import grpc_channel, http_get, require_brain, start_brain

RANGE_STREAM = "/etcdserverpb.KV/RangeStream"
LEASE_ID = 7_000_001
SMALL_TARGET = 4096
# Keys of 4 KiB for the pinning cases: more than the transports buffer, so
# the servers are still streaming when the test writes.
PIN_KEYS = 3000  # --max-request-bytes of the second set of servers


def _end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _put(key: bytes, value: bytes, lease: int = 0) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease))


class Servers:
    """etcd and the brains, written to in lockstep."""

    def __init__(self, servers) -> None:
        self.servers = servers
        self.stubs = [s.stubs() for s in servers]
        # The streams' own channels keep HTTP/2's initial 64 KiB window (no
        # BDP probing), so a client that stops reading soon stops the server.
        self.channels = [grpc_channel(s.endpoint, options=[("grpc.http2.bdp_probe", 0),
                                                           ("grpc.max_receive_message_length", 64 << 20)])
                         for s in servers]
        self.raw = [ch.unary_stream(RANGE_STREAM, request_serializer=rpc_pb2.RangeRequest.SerializeToString,
                                    response_deserializer=None) for ch in self.channels]

    def each(self, fn):
        return [fn(st) for st in self.stubs]

    def put_many(self, items, lease: int = 0, per_txn: int = 100) -> None:
        for i in range(0, len(items), per_txn):
            txn = rpc_pb2.TxnRequest(success=[_put(k, v, lease) for k, v in items[i:i + per_txn]])
            self.each(lambda st: st.kv.Txn(txn))

    def revision(self) -> int:
        revs = self.each(lambda st: st.kv.Range(rpc_pb2.RangeRequest(key=b"\x00", limit=1)).header.revision)
        assert len(set(revs)) == 1, revs
        return revs[0]

    def close(self) -> None:
        for st in self.stubs:
            st.close()
        for ch in self.channels:
            ch.close()
        for s in self.servers:
            s.cleanup()


def _start(extra_args=()) -> Servers:
    require_oracle("3.7")
    require_brain()
    started = []
    try:
        started.append(start_oracle("3.7", extra_args=list(extra_args)))
        for front in ("native", "grpcio"):
            started.append(start_brain(1, extra_args=["--grpc-front", front, *extra_args]))
    except BaseException:
        for s in started:
            s.cleanup()
        raise
    return Servers(started)


def describe(messages: list[bytes]) -> list[tuple]:
    """Each message as what the comparison sees: the RangeResponse fields
    on the wire, the kvs' bytes, the header's revision, more and count."""
    out = []
    for raw in messages:
        m = rpc_pb2.RangeStreamResponse.FromString(raw)
        r = m.range_response
        fields = tuple(sorted(f.name for f, _ in r.ListFields()))
        out.append((fields, [kv.SerializeToString() for kv in r.kvs],
                    r.header.revision if r.HasField("header") else None, r.more, r.count))
    return out


def outcome(raw_call, request: rpc_pb2.RangeRequest, timeout: float = 60) -> tuple:
    """(messages described, final status) of one RangeStream."""
    got = []
    try:
        for msg in raw_call(request, timeout=timeout):
            got.append(msg)
    except grpc.RpcError as e:
        return describe(got), (e.code(), e.details())
    return describe(got), (grpc.StatusCode.OK, "")


def compare(servers: Servers, request: rpc_pb2.RangeRequest) -> list[tuple]:
    """The outcome of ``request`` on every server; all must equal etcd's."""
    results = [outcome(call, request) for call in servers.raw]
    etcd = results[0]
    for name, res in zip(("brain native", "brain grpcio"), results[1:]):
        assert res == etcd, f"{name} differs from etcd 3.7 for {request}"
    return etcd


def chunk_sizes(described) -> list[int]:
    return [len(kvs) for _, kvs, _, _, _ in described]


@pytest.fixture(scope="module")
def servers():
    s = _start()
    try:
        s.put_many([(b"single", b"one")])
        for n in (1, 9, 10, 11, 20, 21):
            s.put_many([(b"n%d/%03d" % (n, i), b"v%d" % i) for i in range(n)])
        s.put_many([(b"small/%05d" % i, b"s") for i in range(5000)])
        s.put_many([(b"kib/%05d" % i, bytes([65 + i % 26]) * 1024) for i in range(3000)])
        s.each(lambda st: st.lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=3600, ID=LEASE_ID)))
        s.put_many([(b"lease/%02d" % i, b"leased%d" % i) for i in range(12)], lease=LEASE_ID)
        s.put_many([(b"big/%d" % i, b"B" * (1 << 20)) for i in range(10)], per_txn=1)
        # sort targets: one put per revision in a shuffled order, some
        # keys rewritten, so mod and create revisions are distinct per key
        order = list(range(100))
        random.Random(5).shuffle(order)
        for i in order:
            s.put_many([(b"sort/%03d" % i, b"%03d" % (99 - i))])
        for i in order[:30]:
            s.put_many([(b"sort/%03d" % i, b"r%03d" % i)])
        for i in (4, 1, 7, 2, 0, 5):
            for _ in range(i % 3 + 1):
                s.put_many([(b"sortsmall/%d" % i, b"%d" % (9 - i))])
        yield s
    finally:
        s.close()


def _req(prefix: bytes, **kw) -> rpc_pb2.RangeRequest:
    return rpc_pb2.RangeRequest(key=prefix, range_end=_end(prefix), **kw)


# -- shapes and sizes (1-10) ----------------------------------------------------

def test_empty_range_is_one_header_message(servers):
    got = compare(servers, _req(b"nothing/"))
    assert [d[0] for d in got[0]] == [("header",)]


def test_single_key_existing_and_missing(servers):
    assert chunk_sizes(compare(servers, rpc_pb2.RangeRequest(key=b"single"))[0]) == [1]
    assert chunk_sizes(compare(servers, rpc_pb2.RangeRequest(key=b"missing"))[0]) == [0]


@pytest.mark.parametrize("n", [1, 9, 10, 11, 20, 21])
def test_chunks_around_the_first_chunk_and_its_doubling(servers, n):
    got, status = compare(servers, _req(b"n%d/" % n))
    assert status[0] == grpc.StatusCode.OK and sum(chunk_sizes(got)) == n
    for fields, _, _, _, _ in got[:-1]:
        assert fields == ("kvs",)


@pytest.mark.parametrize("prefix", [b"small/", b"kib/", b"big/"])
def test_chunk_sizes_of_large_ranges(servers, prefix):
    got, status = compare(servers, _req(prefix))
    assert status[0] == grpc.StatusCode.OK
    # big/: 10 values of 1 MiB fit the first chunk: one 10 MiB message
    assert len(got) == 1 if prefix == b"big/" else len(got) > 5


@pytest.mark.parametrize("key,end", [(b"small/04990", b"\x00"), (b"\x00", b"\x00")])
def test_from_key_and_every_key(servers, key, end):
    compare(servers, rpc_pb2.RangeRequest(key=key, range_end=end))


@pytest.mark.parametrize("prefix", [b"n1/", b"n11/", b"small/", b"lease/"])
def test_keys_only(servers, prefix):
    got, _ = compare(servers, _req(prefix, keys_only=True))
    assert sum(chunk_sizes(got)) == got[-1][4]


def test_keys_only_sorted_by_value_keeps_leases(servers):
    compare(servers, _req(b"lease/", keys_only=True, sort_target=rpc_pb2.RangeRequest.VALUE))


def test_leases_on_full_chunks(servers):
    compare(servers, _req(b"lease/"))


# -- keys_only on unary Range, in Txns and on RangeStream: leased and unleased keys --
#
# etcd 3.7 answers a keys_only range not sorted by value from its key index
# (FastKeysOnly): no key carries its lease, in a unary Range, in a Txn and in
# every chunk of a stream alike; sorted by value, the leases are there.
# (etcd 3.6 returns them every time: ETCD_BEHAVIOUR.md, "keys_only".)

def _unary(response) -> tuple:
    """What the comparison sees of a RangeResponse: every KeyValue's bytes,
    more, count and the header's revision."""
    return ([kv.SerializeToString() for kv in response.kvs], response.more, response.count,
            response.header.revision)


def compare_unary(servers: Servers, request: rpc_pb2.RangeRequest) -> tuple:
    """``request`` as a unary Range and inside a read-only Txn, on every
    server; all must equal etcd's.  Returns etcd's Range."""
    txn = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_range=request)])
    ranges = servers.each(lambda st: _unary(st.kv.Range(request)))
    in_txns = servers.each(lambda st: _unary(st.kv.Txn(txn).responses[0].response_range))
    for name, got, in_txn in zip(("brain native", "brain grpcio"), ranges[1:], in_txns[1:]):
        assert got == ranges[0], f"{name}: unary Range differs from etcd 3.7 for {request}"
        assert in_txn == in_txns[0], f"{name}: a Txn's Range differs from etcd 3.7 for {request}"
    return ranges[0]


def _leases(kvs_bytes) -> set[int]:
    return {kv_pb2.KeyValue.FromString(b).lease for b in kvs_bytes}


# keys from "kib/02995" to "lease/05": five unleased keys, then five leased
MIXED = {"key": b"kib/02995", "range_end": b"lease/05"}


@pytest.mark.parametrize("request_", [
    _req(b"lease/", keys_only=True),
    rpc_pb2.RangeRequest(keys_only=True, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, limit=7, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, serializable=True, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, count_only=True, **MIXED),
    rpc_pb2.RangeRequest(key=b"lease/03", keys_only=True),
    rpc_pb2.RangeRequest(key=b"single", keys_only=True),
    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.MOD, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.CREATE,
                         sort_order=rpc_pb2.RangeRequest.DESCEND, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, sort_order=rpc_pb2.RangeRequest.DESCEND, limit=3, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.VERSION,
                         sort_order=rpc_pb2.RangeRequest.ASCEND, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, min_mod_revision=2, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.VALUE, **MIXED),
    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.VALUE,
                         sort_order=rpc_pb2.RangeRequest.DESCEND, limit=4, **MIXED),
    rpc_pb2.RangeRequest(**MIXED),
], ids=lambda r: str(r).replace("\n", " "))
def test_keys_only_unary_range_and_txn(servers, request_):
    kvs, _, count, _ = compare_unary(servers, request_)
    if request_.count_only:
        assert count == 10 and not kvs
        return
    leases = _leases(kvs)
    if request_.keys_only and request_.sort_target != rpc_pb2.RangeRequest.VALUE:
        assert leases == {0}, "etcd 3.7 answered keys_only with leases: not the behaviour this test pins"
    elif request_.key == MIXED["key"] and not request_.limit:
        assert leases == {0, LEASE_ID}


def test_keys_only_unary_range_and_range_stream_agree(servers):
    """The same leased and unleased keys through RangeStream and unary
    Range: the same KeyValues, on etcd 3.7 and on both brains."""
    for request in (rpc_pb2.RangeRequest(keys_only=True, **MIXED), _req(b"lease/", keys_only=True),
                    rpc_pb2.RangeRequest(keys_only=True, sort_target=rpc_pb2.RangeRequest.VALUE, **MIXED)):
        unary = compare_unary(servers, request)
        streamed, status = compare(servers, request)
        assert status[0] == grpc.StatusCode.OK
        assert [kv for d in streamed for kv in d[1]] == unary[0] and streamed[-1][4] == unary[2]


def test_keys_only_across_lease_changes_and_in_a_write_txn(servers):
    """Keys whose lease changed between revisions, read now and at the
    older revision; and a write Txn that puts a leased key and then reads
    the range keys_only, unsorted and sorted by value."""
    servers.put_many([(b"relet/%d" % i, b"r%d" % i) for i in range(0, 6, 2)], lease=LEASE_ID)
    servers.put_many([(b"relet/%d" % i, b"r%d" % i) for i in range(1, 6, 2)])
    before = servers.revision()
    servers.put_many([(b"relet/%d" % i, b"s%d" % i) for i in range(0, 6, 2)])
    servers.put_many([(b"relet/%d" % i, b"s%d" % i) for i in range(1, 6, 2)], lease=LEASE_ID)
    for kw in ({}, {"revision": before}, {"sort_target": rpc_pb2.RangeRequest.VALUE},
               {"sort_target": rpc_pb2.RangeRequest.VALUE, "revision": before}):
        compare_unary(servers, _req(b"relet/", keys_only=True, **kw))
        if "sort_target" not in kw:
            compare(servers, _req(b"relet/", keys_only=True, **kw))
    txn = rpc_pb2.TxnRequest(success=[
        _put(b"relet/9", b"in a txn", LEASE_ID),
        rpc_pb2.RequestOp(request_range=_req(b"relet/", keys_only=True)),
        rpc_pb2.RequestOp(request_range=_req(b"relet/", keys_only=True, sort_target=rpc_pb2.RangeRequest.VALUE)),
    ])
    answers = servers.each(lambda st: [_unary(r.response_range) for r in st.kv.Txn(txn).responses[1:]])
    assert answers[1] == answers[0] and answers[2] == answers[0]
    unsorted, by_value = answers[0]
    assert _leases(unsorted[0]) == {0} and _leases(by_value[0]) == {0, LEASE_ID}


# -- limits and more (11-15) ------------------------------------------------------

@pytest.mark.parametrize("limit", [1, 5, 10, 11, 25, 100, 101, 5000, -1])
def test_limits(servers, limit):
    compare(servers, _req(b"sort/", limit=limit))


@pytest.mark.parametrize("limit", [0, 3, -1])
def test_count_only(servers, limit):
    got, _ = compare(servers, _req(b"small/", count_only=True, limit=limit))
    assert len(got) == 1 and got[0][4] == 5000


# -- refusals (22-27) --------------------------------------------------------------

@pytest.mark.parametrize("request_", [
    rpc_pb2.RangeRequest(),
    rpc_pb2.RangeRequest(sort_order=rpc_pb2.RangeRequest.DESCEND),
    _req(b"n9/", sort_order=7),
    _req(b"n9/", sort_target=9),
    _req(b"n9/", sort_order=rpc_pb2.RangeRequest.DESCEND),
    _req(b"n9/", sort_target=rpc_pb2.RangeRequest.MOD, sort_order=rpc_pb2.RangeRequest.ASCEND),
    _req(b"n9/", sort_target=rpc_pb2.RangeRequest.VALUE, sort_order=rpc_pb2.RangeRequest.DESCEND),
    _req(b"n9/", sort_target=rpc_pb2.RangeRequest.CREATE, sort_order=rpc_pb2.RangeRequest.ASCEND),
    _req(b"n9/", min_mod_revision=2),
    _req(b"n9/", max_mod_revision=-1),
    _req(b"n9/", min_create_revision=-5),
    _req(b"n9/", max_create_revision=3),
    _req(b"n9/", max_create_revision=3, sort_order=rpc_pb2.RangeRequest.DESCEND),
], ids=lambda r: str(r).replace("\n", " ") or "empty")
def test_refusals(servers, request_):
    got, status = compare(servers, request_)
    assert got == [] and status[0] != grpc.StatusCode.OK


@pytest.mark.parametrize("prefix,target", [
    (b"sortsmall/", rpc_pb2.RangeRequest.VERSION), (b"sortsmall/", rpc_pb2.RangeRequest.MOD),
    (b"sortsmall/", rpc_pb2.RangeRequest.CREATE), (b"sortsmall/", rpc_pb2.RangeRequest.VALUE),
    (b"sort/", rpc_pb2.RangeRequest.MOD), (b"sort/", rpc_pb2.RangeRequest.CREATE),
    (b"sort/", rpc_pb2.RangeRequest.VALUE),
])
def test_sort_targets_with_order_none_sort_each_chunk(servers, prefix, target):
    compare(servers, _req(prefix, sort_target=target))


def test_key_ascend_is_key_order(servers):
    compare(servers, _req(b"n21/", sort_order=rpc_pb2.RangeRequest.ASCEND))


# -- revisions and modes (16-18, 21, 28) ----------------------------------------------

def test_past_revision_and_future_revision(servers):
    rev = servers.revision()
    servers.put_many([(b"n21/%03d" % i, b"later") for i in range(0, 21, 4)])
    servers.each(lambda st: st.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"n21/019")))
    got, _ = compare(servers, _req(b"n21/", revision=rev))
    assert got[-1][2] == servers.revision()  # the header says the current revision
    for kw in ({}, {"count_only": True}):
        _, status = compare(servers, _req(b"n21/", revision=servers.revision() + 1, **kw))
        assert status[0] == grpc.StatusCode.OUT_OF_RANGE


def test_negative_revision_and_serializable(servers):
    compare(servers, _req(b"kib/", revision=-1))
    compare(servers, _req(b"kib/", serializable=True))


# -- lifecycle (29, 30, 32) -----------------------------------------------------------

def test_cancel_after_the_first_message_leaves_the_server_serving(servers):
    for call, st in zip(servers.raw, servers.stubs):
        it = call(_req(b"kib/"), timeout=60)
        next(it)
        it.cancel()
    compare(servers, _req(b"n20/"))
    assert len(set(servers.each(lambda st: st.kv.Range(_req(b"kib/", count_only=True)).count))) == 1


def test_deadline_shorter_than_the_stream(servers):
    for server, call in zip(servers.servers, servers.raw):
        with pytest.raises(grpc.RpcError) as e:
            for _ in call(_req(b"kib/"), timeout=0.001):
                pass
        # etcd's grpc-go server sometimes resets the stream (CANCEL) on its
        # own copy of the deadline before the client's timer fires: seen
        # once in 30 calls; brain's never did
        seen = {grpc.StatusCode.DEADLINE_EXCEEDED}
        if server.kind == "etcd":
            seen.add(grpc.StatusCode.CANCELLED)
        assert e.value.code() in seen, server.kind


def _stream_metrics(server) -> dict[str, float]:
    status, body = http_get(f"{server.client_url}/metrics")
    assert status == 200
    out = {}
    for line in body.splitlines():
        if 'grpc_method="RangeStream"' in line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_grpc_metrics_count_a_stream_once_and_each_message(servers):
    sizes = chunk_sizes(compare(servers, _req(b"small/"))[0])
    for server, call in zip(servers.servers, servers.raw):
        if server.kind == "brain" and "grpcio" in server.extra_args:
            continue  # the grpcio front serves no HTTP on its client port
        before = _stream_metrics(server)
        list(call(_req(b"small/"), timeout=60))
        after = _stream_metrics(server)
        delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        sent = [v for k, v in delta.items() if k.startswith("grpc_server_msg_sent_total")]
        started = [v for k, v in delta.items() if k.startswith("grpc_server_started_total")]
        handled = [v for k, v in delta.items() if k.startswith("grpc_server_handled_total") and 'grpc_code="OK"' in k]
        assert (sent, started, handled) == ([len(sizes)], [1.0], [1.0]), (server.kind, delta)


# -- pinning and compaction while streaming (19, 20) -------------------------------

def _pin_data(servers, prefix: bytes) -> None:
    servers.put_many([(prefix + b"%05d" % i, b"P" * 4096) for i in range(PIN_KEYS)], per_txn=50)


def _after_first_message(servers, prefix: bytes, between) -> list[tuple]:
    """Open the stream on every server, read one message, run ``between``
    on every server, then read the rest."""
    iters = [call(_req(prefix), timeout=120) for call in servers.raw]
    firsts = [next(it) for it in iters]
    between()
    results = []
    for first, it in zip(firsts, iters):
        rest = []
        status = (grpc.StatusCode.OK, "")
        try:
            rest.extend(it)
        except grpc.RpcError as e:
            status = (e.code(), e.details())
        results.append((describe([first, *rest]), status))
    return results


def test_writes_during_the_stream_do_not_show(servers):
    _pin_data(servers, b"pin/")
    start = servers.revision()
    unary = servers.stubs[0].kv.Range(_req(b"pin/", revision=start))

    def writes():
        servers.put_many([(b"pin/01000x", b"new"), (b"pin/01999", b"changed")], per_txn=1)
        servers.each(lambda st: st.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"pin/01500")))

    results = _after_first_message(servers, b"pin/", writes)
    assert results[1] == results[0] and results[2] == results[0]
    got, status = results[0]
    assert status[0] == grpc.StatusCode.OK and got[-1][2] == start
    assert [kv for d in got for kv in d[1]] == [kv.SerializeToString() for kv in unary.kvs]


def test_compaction_during_the_stream_ends_it_with_compacted(servers):
    _pin_data(servers, b"cpt/")

    def compact():
        servers.put_many([(b"cpt/00000", b"moved")])
        rev = servers.revision()
        servers.each(lambda st: st.kv.Compact(rpc_pb2.CompactionRequest(revision=rev, physical=True)))

    results = _after_first_message(servers, b"cpt/", compact)
    full = [kv.SerializeToString() for kv in servers.stubs[0].kv.Range(_req(b"cpt/")).kvs[1:]]
    for got, status in results:
        assert status == (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
        sent = [kv for d in got for kv in d[1]]
        assert 0 < len(sent) < PIN_KEYS and sent[1:] == full[:len(sent) - 1]
        assert all(d[0] == ("kvs",) for d in got)


def test_compacted_revision_refused_before_any_message(servers):
    rev = servers.revision()  # compacted at the last test's revision, which is still current
    compare(servers, _req(b"n9/", revision=rev))
    _, status = compare(servers, _req(b"n9/", revision=rev - 1))
    assert status == (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")


# -- a lower --max-request-bytes (5) ------------------------------------------------

@pytest.fixture(scope="module")
def small_target():
    s = _start(["--max-request-bytes", str(SMALL_TARGET)])
    try:
        s.put_many([(b"t/%04d" % i, b"t" * (3000 if i % 7 else 200)) for i in range(300)], per_txn=1)
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("kw", [{}, {"keys_only": True}, {"limit": 40}])
def test_chunks_shrink_toward_a_small_target(small_target, kw):
    got, status = compare(small_target, _req(b"t/", **kw))
    assert status[0] == grpc.StatusCode.OK
    if not kw:
        assert min(chunk_sizes(got)) < 10


# -- through clientv3 3.7: etcdctl get --stream (31) -------------------------------------

_HEADER_IDS = re.compile(r'"(cluster_id|member_id|raft_term)":\d+')


def _etcdctl(ctl: str, server, args: list[str]) -> tuple[int, str, str]:
    r = subprocess.run([ctl, f"--endpoints={server.endpoint}", *args], capture_output=True, text=True, timeout=120)
    return r.returncode, _HEADER_IDS.sub(r'"\1":<id>', r.stdout), r.stderr


@pytest.mark.parametrize("args", [
    ["--prefix", "n21/"], ["--prefix", "sort/", "--limit", "25"], ["--prefix", "small/", "--keys-only"],
    ["--prefix", "small/", "--count-only", "-w", "json"], ["--prefix", "lease/", "-w", "json"],
    ["--prefix", "n21/", "--rev", "30"], ["--prefix", "sortsmall/", "--sort-by", "MODIFY"],
    ["--prefix", "n9/", "--order", "DESCEND"],
])
def test_etcdctl_get_stream(servers, args):
    ctl = etcd_tool("etcdctl-3.7")
    etcd = _etcdctl(ctl, servers.servers[0], ["get", "--stream", *args])
    for server in servers.servers[1:]:
        assert _etcdctl(ctl, server, ["get", "--stream", *args]) == etcd, server.extra_args
    if etcd[0] == 0 and "json" not in args:  # a merged stream prints as the unary get does
        assert _etcdctl(ctl, servers.servers[0], ["get", *args]) == etcd
