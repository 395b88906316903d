"""The batching gRPC front: unary etcd calls without grpcio's per-call cost.

Why it exists: a grpcio server spends about 190 us of CPU per call on
dispatch alone, three times what etcd spends on a whole durable Put
(../notes in the issue tracker; measured again in benchmarks/README.md).
pygrpc-native runs HTTP/2 and gRPC framing on Rust threads outside the GIL
and hands calls to Python in batches.  One dispatch thread here takes a
batch and

* answers reads (Range, read-only Txn) at once, at the committed revision;
* hands every write of the batch to the engine in one ``submit_many``, so
  they share one journal append and one fdatasync; the engine's committer
  answers each call when its write is durable (``Deferred.finish``);
* passes rare unary calls (Maintenance, Cluster, lease queries) to a small
  thread pool that runs the grpcio servicer methods with a minimal context.

What stays on grpcio:

* the streaming methods (Watch, LeaseKeepAlive, Snapshot): the front
  forwards them to a grpcio server on a private unix socket
  (``set_fallback``), transparently to clients;
* TLS listeners: the front has no TLS, so ApiServer serves https:// URLs
  with grpcio alone;
* unix:// listeners: grpc-go clients send the socket path as the HTTP/2
  :authority, which the front refuses (PROTOCOL_ERROR), so those stay on
  grpcio as well.

Errors keep etcd's codes and texts (brain.api.unary.status_of); an oversized
request gets grpc-go's text, as on the grpcio path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from brain.api.grpc_stats import GO_CODE_NAMES, UNARY, GrpcStats
from brain.api.unary import Deferred, status_of

log = logging.getLogger("brain.api.front")

try:  # optional: without it every listener is served by grpcio
    from pygrpc_native import EVENT_CALL, NativeGrpcFront
except ImportError:  # pragma: no cover - depends on the install
    NativeGrpcFront = None
    EVENT_CALL = 0

BATCH_EVENTS = 1024  # calls taken from the front per dispatch round


def io_threads() -> int:
    """The front's HTTP/2 threads: half the cores, at least one, at most 4.
    They compete with the GIL-holding Python threads for CPU; on 2 cores one
    I/O thread gave 15-40% more Puts/s than two at 64 and 256 clients, with
    ~12% less server CPU per call (benchmarks/README.md)."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))
_OK = "OK"
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def available() -> bool:
    return NativeGrpcFront is not None


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _PoolContext:
    """Just enough of grpc.ServicerContext for the unary servicer methods
    that run in the pool: they only ever abort."""

    __slots__ = ()

    def abort(self, code, details):
        raise _Abort(code, details)

    def is_active(self) -> bool:
        return True


class Method:
    """One unary method served by the front: either a brain.api.unary
    ``step`` with its request class (run on the dispatch thread), or a
    grpcio unary handler function ``call(raw_bytes, context)`` that parses
    the request itself (run in the pool)."""

    __slots__ = ("path", "name", "parse", "step", "call", "stats_key")

    def __init__(self, service: str, name: str, *, request_cls=None, step=None, call=None) -> None:
        if (step is None) == (call is None) or (step is not None and request_cls is None):
            raise ValueError("a Method needs a step and its request class, or a call")
        self.path = f"/{service}/{name}"
        self.name = name
        self.parse = request_cls.FromString if request_cls is not None else None
        self.step = step
        self.call = call
        self.stats_key = (UNARY, service, name)


class NativeFront:
    """Serves ``methods`` on one plain-TCP address; every other
    method goes to the grpcio server listening on ``fallback_socket``."""

    def __init__(self, engine, address: str, methods: list[Method], *, fallback_socket: str,
                 recv_limit: int, stats: GrpcStats, pool: futures.Executor,
                 keepalive_time_ms: int, keepalive_timeout_ms: int) -> None:
        if NativeGrpcFront is None:
            raise RuntimeError("pygrpc-native is not installed")
        self.engine = engine
        self.methods = methods
        self.recv_limit = recv_limit
        self.stats = stats
        self.pool = pool
        self.address = address
        self._front_args = dict(
            io_threads=io_threads(),
            keepalive_time_ms=keepalive_time_ms,
            keepalive_timeout_ms=keepalive_timeout_ms,
            keepalive_permit_without_calls=True,
            max_concurrent_streams=2**31 - 1,  # etcd: math.MaxUint32
        )
        self._fallback_socket = fallback_socket
        self._front = None
        self._thread: threading.Thread | None = None
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._idle = threading.Condition(self._inflight_lock)
        self._stopping = False

    def bind(self) -> int:
        """Bind the listener (calls queue until ``start``); the TCP port."""
        front = NativeGrpcFront(self.address, [(m.path, False) for m in self.methods], **self._front_args)
        front.set_fallback(self._fallback_socket)
        front.start()
        self._front = front
        return front.bound_port

    def start(self) -> None:
        self._thread = threading.Thread(target=self._dispatch, name="grpc-front", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, wait up to ``grace`` seconds for calls in
        flight (writes waiting for their fdatasync), then close."""
        self._stopping = True
        deadline = time.monotonic() + (grace or 0.0)
        with self._idle:
            while self._inflight and grace:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
        if self._front is not None:
            if grace:
                # close() drops connections at once: give the I/O threads a
                # moment to write the answers handed to respond() just now.
                time.sleep(0.1)
            self._front.close()
        if self._thread is not None:
            self._thread.join(5)

    # -- dispatch ------------------------------------------------------------

    def _dispatch(self) -> None:
        front = self._front
        methods = self.methods
        recv_limit = self.recv_limit
        stats = self.stats
        submit_batch = self.engine.submit_batch
        respond = front.respond
        while (events := front.recv_batch(BATCH_EVENTS)) is not None:
            writes = []
            started: dict = {}
            answered: dict = {}
            for kind, call_id, method_id, payload, _client in events:
                if kind != EVENT_CALL:
                    continue  # a cancel: answers to it are dropped by the front
                m = methods[method_id]
                started[m.stats_key] = started.get(m.stats_key, 0) + 1
                if self._stopping:
                    self._fail(call_id, m, _UNAVAILABLE, "Unavailable", "brain: server is shutting down")
                    continue
                if len(payload) > recv_limit:
                    self._fail(call_id, m, _RESOURCE_EXHAUSTED, "ResourceExhausted",
                               f"grpc: received message larger than max ({len(payload)} vs. {recv_limit})")
                    continue
                if m.step is None:
                    self._begin()
                    self.pool.submit(self._run_pooled, call_id, m, payload)
                    continue
                try:
                    request = m.parse(payload)
                except DecodeError as e:
                    self._fail(call_id, m, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
                    continue
                try:
                    out = m.step(request)
                    if type(out) is Deferred:
                        writes.append((call_id, m, out))
                        continue
                    respond(call_id, out.SerializeToString())
                    answered[m.stats_key] = answered.get(m.stats_key, 0) + 1
                except Exception as e:  # noqa: BLE001 - every failure becomes a status
                    self._fail_with(call_id, m, e)
            for key, n in started.items():
                stats.on_start(key, n)
            for key, n in answered.items():
                stats.on_handled(key, _OK, n, n, calls=n)
            if writes:
                with self._inflight_lock:
                    self._inflight += len(writes)
                try:
                    submit_batch([w[2].request for w in writes], self._completer(writes))
                except Exception as e:  # noqa: BLE001
                    for call_id, m, _ in writes:
                        self._fail_with(call_id, m, e)
                    self._end(len(writes))

    def _completer(self, writes: list):
        """Answers the calls of one dispatch round as the engine settles
        their writes (on the committer thread, once per commit batch)."""
        respond = self._front.respond
        stats = self.stats

        def settled(items) -> None:
            ok: dict = {}
            try:
                for index, result, exc in items:
                    call_id, m, deferred = writes[index]
                    if exc is None:
                        try:
                            data = deferred.finish(result).SerializeToString()
                        except Exception as e:  # noqa: BLE001
                            exc = e
                        else:
                            respond(call_id, data)
                            ok[m.stats_key] = ok.get(m.stats_key, 0) + 1
                            continue
                    self._fail_with(call_id, m, exc)
            finally:
                for key, n in ok.items():
                    stats.on_handled(key, _OK, n, n, calls=n)
                self._end(len(items))

        return settled

    def _run_pooled(self, call_id: int, m: Method, payload: bytes) -> None:
        try:
            resp = m.call(payload, _PoolContext())
            self._front.respond(call_id, resp.SerializeToString())
            self.stats.on_handled(m.stats_key, _OK, 1, 1)
        except _Abort as a:
            self._fail(call_id, m, a.code.value[0], GO_CODE_NAMES.get(a.code, "Unknown"), a.details)
        except Exception as e:  # noqa: BLE001
            self._fail_with(call_id, m, e)
        finally:
            self._end(1)

    def _begin(self) -> None:
        with self._inflight_lock:
            self._inflight += 1

    def _end(self, n: int) -> None:
        with self._idle:
            self._inflight -= n
            if not self._inflight:
                self._idle.notify_all()

    def _fail_with(self, call_id: int, m: Method, exc: BaseException) -> None:
        code, message = status_of(exc, m.name)
        self._fail(call_id, m, code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)

    def _fail(self, call_id: int, m: Method, code: int, code_name: str, message: str) -> None:
        self._front.fail(call_id, code, message)
        self.stats.on_handled(m.stats_key, code_name, 1, 0)
