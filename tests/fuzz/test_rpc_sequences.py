"""Random RPC sequences against a live `brain serve` (hypothesis), over
plaintext TCP and a unix socket: valid and invalid unary calls (request
bytes made up), Watch and LeaseKeepAlive streams opened, fed, half-closed,
cancelled and left open across later steps, and garbage written on raw
sockets in between (bytes after HTTP/2's preface, frames of made-up kinds
and lengths, gRPC messages cut short, HTTP/1.1 requests).

What must hold: every call ends within WATCHDOG seconds (a call that does
not is a hang) with a response or etcd's error (never brain's UNKNOWN
"internal error"); after each sequence the server answers a Put and a
Range; once every client is gone /metrics shows no stream left (watch
streams and watchers at 0, every Watch and LeaseKeepAlive started is
handled, no connection open but the scrape's); the server's log has no
traceback and no Rust panic.  BRAIN_RPC_SEQUENCES sequences per listener
kind (40 under `make test`, 1000 under `make test-full`).
"""

from __future__ import annotations

import os
import queue
import re
import socket
import struct
import threading
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.support.servers import BrainServer, grpc_channel, kv_stub, require_brain

SEQUENCES = int(os.environ.get("BRAIN_RPC_SEQUENCES", "40"))
WATCHDOG = 10.0  # seconds any one call may take
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INTERNAL_ERROR = "brain: internal error"

# every unary method, for calls with made-up request bytes
UNARY = ["/etcdserverpb.KV/Range", "/etcdserverpb.KV/Put", "/etcdserverpb.KV/DeleteRange", "/etcdserverpb.KV/Txn",
         "/etcdserverpb.KV/Compact", "/etcdserverpb.Lease/LeaseGrant", "/etcdserverpb.Lease/LeaseRevoke",
         "/etcdserverpb.Lease/LeaseTimeToLive", "/etcdserverpb.Lease/LeaseLeases", "/etcdserverpb.Maintenance/Status",
         "/etcdserverpb.Maintenance/Hash", "/etcdserverpb.Maintenance/HashKV", "/etcdserverpb.Maintenance/Alarm",
         "/etcdserverpb.Cluster/MemberList", "/grpc.health.v1.Health/Check", "/etcdserverpb.KV/NoSuchMethod",
         "/no.such.Service/Call"]

keys = st.sampled_from([b"a", b"b", b"/registry/pods/x", b"\x00", b"\xff\xfe"])
lease_ids = st.sampled_from([0, 1, 1000, 2**62, -5])

valid_calls = st.one_of(
    st.builds(lambda k, v: ("Put", pb.PutRequest(key=k, value=v)), keys, st.binary(max_size=64)),
    st.builds(lambda k: ("Range", pb.RangeRequest(key=k, range_end=b"\x00")), keys),
    st.builds(lambda k: ("DeleteRange", pb.DeleteRangeRequest(key=k)), keys),
    st.builds(lambda r: ("Compact", pb.CompactionRequest(revision=r)), st.integers(-2, 50)),
    st.builds(lambda t, i: ("LeaseGrant", pb.LeaseGrantRequest(TTL=t, ID=i)), st.integers(-1, 100), lease_ids),
    st.builds(lambda i: ("LeaseRevoke", pb.LeaseRevokeRequest(ID=i)), lease_ids),
)

steps = st.one_of(
    st.tuples(st.just("valid"), valid_calls),
    st.tuples(st.just("raw"), st.sampled_from(UNARY), st.binary(max_size=48)),
    st.tuples(st.just("watch"), st.lists(st.one_of(keys, st.binary(max_size=12)), max_size=3),
              st.sampled_from(["cancel", "half-close", "keep"])),
    st.tuples(st.just("keepalive"), st.lists(lease_ids, max_size=3), st.sampled_from(["cancel", "half-close", "keep"])),
    st.tuples(st.just("garbage"), st.sampled_from(["preface+bytes", "frames", "cut-message", "http1", "bytes"]),
              st.binary(max_size=96)),
)


@pytest.fixture(scope="module", params=["http", "unix"])
def server(request):
    require_brain()
    with BrainServer(transport=request.param) as srv:
        yield srv


def _call_raw(channel: grpc.Channel, method: str, payload: bytes):
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=WATCHDOG)
    except grpc.RpcError as e:
        _check_error(e, method)


def _check_error(e: grpc.RpcError, what: str) -> None:
    code, details = e.code(), e.details() or ""
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{what}: no answer within {WATCHDOG} s"
    assert not details.startswith(INTERNAL_ERROR), f"{what}: {code} {details}"
    assert code != grpc.StatusCode.UNAVAILABLE or "shutting down" not in details, f"{what}: {details}"


class _Stream:
    """A bidirectional stream fed from a queue, read on a thread of its own."""

    def __init__(self, method, requests: list) -> None:
        self.q: queue.Queue = queue.Queue()
        for r in requests:
            self.q.put(r)
        self.call = method(iter(self.q.get, None), timeout=60)
        self.error: grpc.RpcError | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError as e:
            self.error = e

    def half_close(self) -> None:
        self.q.put(None)

    def end(self) -> None:
        self.call.cancel()
        self.reader.join(WATCHDOG)
        assert not self.reader.is_alive(), f"a stream did not end within {WATCHDOG} s of its cancel"
        if self.error is not None and self.error.code() != grpc.StatusCode.CANCELLED:
            _check_error(self.error, "stream")


def _raw_socket(server: BrainServer) -> socket.socket:
    if server.transport == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"{server.root}/brain.sock")
    else:
        s = socket.create_connection(("127.0.0.1", server.port))
    s.settimeout(2.0)
    return s


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    n = len(payload)
    return bytes([n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags]) + struct.pack(">I", stream) + payload


def _garbage(server: BrainServer, kind: str, data: bytes) -> None:
    if kind == "preface+bytes":
        out = PREFACE + data
    elif kind == "frames":
        # a SETTINGS frame, then frames whose kinds, flags, streams and lengths come from the data
        out = PREFACE + _frame(4, 0, 0, b"")
        for i in range(0, len(data) - 3, 12):
            chunk = data[i:i + 12]
            out += _frame(chunk[0] % 11, chunk[1], chunk[2] % 8, chunk[3:])
    elif kind == "cut-message":
        # HEADERS of a gRPC call in HPACK literals (no table), then a DATA frame whose message is cut short
        block = b"".join(bytes([0, len(n)]) + n + bytes([len(v)]) + v for n, v in [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/etcdserverpb.KV/Put"),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        msg = b"\x00" + struct.pack(">I", len(data) + 10) + data
        out = PREFACE + _frame(4, 0, 0, b"") + _frame(1, 4, 1, block) + _frame(0, 1, 1, msg)
    elif kind == "http1":
        out = b"GET /" + data.replace(b"\r", b"").replace(b"\n", b"") + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    else:
        out = data or b"\x00"
    with _raw_socket(server) as s:
        try:
            s.sendall(out)
            s.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + WATCHDOG
            while time.monotonic() < deadline and s.recv(65536):
                pass
        except (socket.timeout, OSError):
            pass  # the server may keep the connection open (a partial frame) or reset it


def _metrics(server: BrainServer) -> str:
    with _raw_socket(server) as s:
        s.settimeout(WATCHDOG)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := s.recv(1 << 16):
            body += chunk
    return body.decode(errors="replace")


def _value(text: str, name: str, labels: str = "") -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def _no_streams_left(server: BrainServer) -> str:
    """'' once /metrics shows no stream left, else what is left (polled: cancels travel)."""
    deadline = time.monotonic() + WATCHDOG
    while True:
        text = _metrics(server)
        left = []
        for gauge in ("etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_watcher_total"):
            if _value(text, gauge):
                left.append(f"{gauge} {_value(text, gauge)}")
        for method in ("Watch", "LeaseKeepAlive"):
            started = _value(text, "grpc_server_started_total", f'grpc_method="{method}"')
            handled = _value(text, "grpc_server_handled_total", f'grpc_method="{method}"')
            if started != handled:
                left.append(f"{method}: {started} started, {handled} handled")
        if _value(text, "brain_transport_connections_open") > 1:  # the scrape's own
            left.append(f"connections open {_value(text, 'brain_transport_connections_open')}")
        if not left or time.monotonic() > deadline:
            return "; ".join(left)
        time.sleep(0.2)


@settings(max_examples=SEQUENCES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(sequence=st.lists(steps, min_size=1, max_size=12))
def test_random_rpc_sequences(server, sequence) -> None:
    streams: list[_Stream] = []
    with kv_stub(server.endpoint) as stubs:
        try:
            for step in sequence:
                kind = step[0]
                if kind == "valid":
                    name, request = step[1]
                    method = getattr(stubs.lease if name.startswith("Lease") else stubs.kv, name)
                    try:
                        method(request, timeout=WATCHDOG)
                    except grpc.RpcError as e:
                        _check_error(e, name)
                elif kind == "raw":
                    _call_raw(stubs.channel, step[1], step[2])
                elif kind in ("watch", "keepalive"):
                    if kind == "watch":
                        reqs = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=k, prev_kv=True))
                                for k in step[1]]
                        s = _Stream(stubs.watch.Watch, reqs)
                    else:
                        s = _Stream(stubs.lease.LeaseKeepAlive, [pb.LeaseKeepAliveRequest(ID=i) for i in step[1]])
                    streams.append(s)
                    if step[2] == "cancel":
                        s.end()
                    elif step[2] == "half-close":
                        s.half_close()
                else:
                    _garbage(server, step[1], step[2])
            # the server serves normally
            stubs.kv.Put(pb.PutRequest(key=b"after", value=b"v"), timeout=WATCHDOG)
            r = stubs.kv.Range(pb.RangeRequest(key=b"after"), timeout=WATCHDOG)
            assert [kv.value for kv in r.kvs] == [b"v"]
        finally:
            for s in streams:
                s.end()
    assert server.running, server.log_tail()
    left = _no_streams_left(server)
    assert not left, f"left once every client is gone: {left}"
    log = server.log_tail()
    for bad in ("Traceback", "panicked", INTERNAL_ERROR):
        assert bad not in log, log


def test_a_server_after_the_sequences_still_serves(server) -> None:
    """The module's server, after every sequence: a fresh client's Put and Range."""
    with grpc_channel(server.endpoint) as ch:
        grpc.channel_ready_future(ch).result(timeout=WATCHDOG)
    with kv_stub(server.endpoint) as stubs:
        stubs.kv.Put(pb.PutRequest(key=b"last", value=b"1"), timeout=WATCHDOG)
        assert stubs.kv.Range(pb.RangeRequest(key=b"last"), timeout=WATCHDOG).count == 1


def test_the_rewriters_regression_inputs_on_a_live_socket(server) -> None:
    """What the `authority` fuzz target found (tests/fuzz/corpus/authority/
    regress-*), sent to the live listener: on a unix socket every header
    block goes through the rewriter, and hpack's panic on the first one
    killed the connection's task with a Rust panic in the log."""
    inputs = sorted((Path(__file__).resolve().parent / "corpus" / "authority").glob("regress-*"))
    assert inputs
    for f in inputs:
        with _raw_socket(server) as s:
            s.sendall(PREFACE + f.read_bytes()[1:])  # the target's first byte chooses its mode and cuts
            try:
                while s.recv(65536):
                    pass
            except (socket.timeout, OSError):
                pass
    with kv_stub(server.endpoint) as stubs:
        stubs.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=WATCHDOG)
        assert stubs.kv.Range(pb.RangeRequest(key=b"k"), timeout=WATCHDOG).count == 1
    log = server.log_tail()
    assert "panicked" not in log, log
