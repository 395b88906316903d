"""Watch over gRPC against a running brain: many watchers per stream,
historical starts, compaction, RequestProgress ordering, progress_notify,
slow consumers, and history that survives restarts (SIGTERM and kill -9)."""

from __future__ import annotations

import queue
import threading
import time

import grpc

from tests.support.servers import grpc_channel
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

T = 15  # seconds: every wait in this file is bounded by this


class WatchClient:
    """One Watch stream fed from a queue; responses collected by a thread."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc_channel(endpoint)
        self.stub = rpc_pb2_grpc.WatchStub(self.channel)
        self.requests: queue.Queue = queue.Queue()
        self.responses: queue.Queue = queue.Queue()
        self.call = self.stub.Watch(iter(self.requests.get, None), metadata=[("hasleader", "true")])
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        try:
            for resp in self.call:
                self.responses.put(resp)
        except grpc.RpcError:
            pass

    def create(self, key: bytes, range_end: bytes = b"", start: int = 0, **kw) -> rpc_pb2.WatchResponse:
        self.requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=key, range_end=range_end, start_revision=start, **kw)))
        resp = self.next()
        assert resp.created, resp
        return resp

    def progress(self) -> None:
        self.requests.put(rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest()))

    def cancel(self, wid: int) -> None:
        self.requests.put(rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=wid)))

    def next(self, timeout: float = T) -> rpc_pb2.WatchResponse:
        return self.responses.get(timeout=timeout)

    def events(self, n: int, timeout: float = T) -> list:
        """Collect n events (any watchers), returning (watch_id, event) pairs."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            resp = self.next(max(0.01, deadline - time.monotonic()))
            out.extend((resp.watch_id, ev) for ev in resp.events)
        return out

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def kv(brain_server):
    ch = grpc_channel(brain_server.endpoint)
    yield rpc_pb2_grpc.KVStub(ch)
    ch.close()


def put(kv, key: bytes, value: bytes = b"v") -> int:
    return kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=T).header.revision


def test_many_watchers_one_stream_txn_events_together(brain_server, kv):
    w = WatchClient(brain_server.endpoint)
    try:
        a = w.create(b"a", b"b")  # prefix a
        b = w.create(b"b1", prev_kv=True)
        assert (a.watch_id, b.watch_id) == (0, 1)  # etcd assigns 0, 1, ... per stream
        put(kv, b"b1", b"old")
        rev = kv.Txn(rpc_pb2.TxnRequest(success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"a1", value=b"x")),
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"a2", value=b"y")),
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"b1", value=b"new")),
        ]), timeout=T).header.revision
        got: dict[int, list] = {0: [], 1: []}
        while len(got[0]) < 1 or sum(len(r.events) for r in got[1]) < 2:
            resp = w.next()
            got[resp.watch_id].append(resp)
        (txn_a,) = got[0]
        assert [e.kv.key for e in txn_a.events] == [b"a1", b"a2"]  # one Txn: one response
        assert txn_a.header.revision == rev
        # A stream that falls behind may carry both of b1's events in one
        # response (brain.mvcc.watch.coalesce); they stay in order.
        create_b, update_b = [e for r in got[1] for e in r.events]
        assert not create_b.HasField("prev_kv")
        assert update_b.prev_kv.value == b"old"
    finally:
        w.close()


def test_history_compaction_and_invalid_creates(brain_server, kv):
    revs = [put(kv, b"h", b"%d" % i) for i in range(5)]
    kv.Compact(rpc_pb2.CompactionRequest(revision=revs[2], physical=True), timeout=T)
    w = WatchClient(brain_server.endpoint)
    try:
        ok = w.create(b"h", start=revs[2])
        got = [e.kv.value for _, e in w.events(3)]
        assert got == [b"2", b"3", b"4"]
        old = w.create(b"h", start=revs[0])
        resp = w.next()
        assert resp.watch_id == old.watch_id and resp.canceled and resp.compact_revision == revs[2]
        bad = w.create(b"z", b"a")  # empty range
        assert bad.canceled and bad.watch_id == -1 and bad.cancel_reason == "mvcc: watcher range is empty"
        mine = w.create(b"q", watch_id=7)
        assert mine.watch_id == 7 and not mine.canceled
        dup = w.create(b"q", watch_id=7)
        assert dup.canceled and dup.watch_id == -1
        assert dup.cancel_reason == "mvcc: duplicate watch ID provided on the WatchStream"
        w.cancel(ok.watch_id)
        assert w.next().canceled
    finally:
        w.close()


def test_request_progress_follows_every_event(brain_server, kv):
    w = WatchClient(brain_server.endpoint)
    try:
        w.create(b"p/", b"p0")
        w.create(b"p/", b"p0", start=1)  # a watcher still catching up from revision 1
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                put(kv, b"p/%d" % (i % 50))
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        seen_max = 0
        progresses = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            w.progress()
            for _ in range(200):
                resp = w.next()
                if resp.watch_id == -1:
                    assert resp.header.revision >= seen_max
                    progresses += 1
                    break
                for ev in resp.events:
                    seen_max = max(seen_max, ev.kv.mod_revision)
        stop.set()
        t.join()
        assert progresses > 0
    finally:
        w.close()


def test_progress_notify_interval(brain_factory):
    srv = brain_factory(extra_args=["--watch-progress-notify-interval", "300ms"])
    w = WatchClient(srv.endpoint)
    try:
        c = w.create(b"idle", progress_notify=True)
        resp = w.next(timeout=5)
        assert resp.watch_id == c.watch_id and not resp.events and resp.header.revision >= 1
    finally:
        w.close()


def test_slow_consumer_does_not_block_writes_and_catches_up(brain_factory):
    srv = brain_factory(extra_args=["--watch-queue-events", "100"])
    ch = grpc_channel(srv.endpoint)
    kv = rpc_pb2_grpc.KVStub(ch)
    # A raw stream whose responses nobody reads for a while.
    reqs: queue.Queue = queue.Queue()
    call = rpc_pb2_grpc.WatchStub(ch).Watch(iter(reqs.get, None))
    reqs.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"s/", range_end=b"s0")))
    fast = WatchClient(srv.endpoint)
    try:
        fast.create(b"s/", b"s0")
        n = 0
        started = time.monotonic()
        for batch in range(60):
            kv.Txn(rpc_pb2.TxnRequest(success=[
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"s/%04d" % (batch * 50 + i), value=b"x" * 64))
                for i in range(50)]), timeout=T)
            n += 50
        write_seconds = time.monotonic() - started
        # The fast watcher got everything while the slow one was not read.
        assert len(fast.events(n)) == n
        # Now drain the slow stream: every event exactly once, in order.
        revs = []
        for resp in call:
            revs.extend(ev.kv.mod_revision for ev in resp.events)
            if len(revs) >= n:
                break
        assert len(revs) == n and revs == sorted(revs)
        assert write_seconds < 60
    finally:
        reqs.put(None)
        call.cancel()
        fast.close()
        ch.close()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_watch_history_survives_restart(brain_factory, how):
    srv = brain_factory(shards=4, extra_args=["--checkpoint-interval", "300ms"])
    ch = grpc_channel(srv.endpoint)
    kv = rpc_pb2_grpc.KVStub(ch)
    expected = []
    for i in range(300):
        key = b"r/%03d" % (i % 40)
        rev = put(kv, key, b"%d" % i)
        expected.append((rev, key, b"%d" % i))
        if i == 150:
            time.sleep(0.5)  # let a checkpoint move the first half into lmdb
    kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"r/000"), timeout=T)
    ch.close()
    if how == "kill9":
        srv.kill9()
        srv.start()
    else:
        srv.restart()
    w = WatchClient(srv.endpoint)
    try:
        w.create(b"r/", b"r0", start=expected[0][0], prev_kv=True)
        got = w.events(len(expected) + 1)
        assert [(e.kv.mod_revision, e.kv.key, e.kv.value) for _, e in got[:-1]] == expected
        assert got[-1][1].type == 1 and got[-1][1].kv.key == b"r/000"
        # prev_kv of every update is the value before it
        assert got[45][1].prev_kv.value == expected[5][2]
    finally:
        w.close()


def test_fragmented_watch_response(brain_factory):
    """etcd's fragment option: a response larger than --max-request-bytes +
    512 KiB is split, fragment=true on all but the last part."""
    srv = brain_factory(extra_args=["--max-request-bytes", "65536"])
    ch = grpc_channel(srv.endpoint)
    kv = rpc_pb2_grpc.KVStub(ch)
    for i in range(24):
        put(kv, b"f/%02d" % i, bytes([65 + i]) * 60000)
    w = WatchClient(srv.endpoint)
    try:
        w.create(b"f/", b"f0", prev_kv=True, fragment=True)
        kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"f/", range_end=b"f0"), timeout=T)
        parts = []
        while True:
            resp = w.next()
            parts.append(resp)
            if not resp.fragment:
                break
        assert len(parts) >= 2
        assert all(p.fragment for p in parts[:-1])
        events = [e for p in parts for e in p.events]
        assert [e.kv.key for e in events] == [b"f/%02d" % i for i in range(24)]
        assert all(len(e.prev_kv.value) == 60000 for e in events)
        assert all(p.ByteSize() < 65536 + 512 * 1024 + 70000 for p in parts)
    finally:
        w.close()
        ch.close()
