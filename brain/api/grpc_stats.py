"""Per-method gRPC call counts, as etcd exports them (go-grpc-prometheus).

A server interceptor counts, for every call, labelled by grpc_type
(unary, client_stream, server_stream, bidi_stream), grpc_service and
grpc_method:

* started calls                           -> grpc_server_started_total
* finished calls, by status code          -> grpc_server_handled_total{grpc_code}
* messages received and sent              -> grpc_server_msg_received_total,
                                             grpc_server_msg_sent_total

The numbers live in a plain ``GrpcStats`` object; brain.metrics turns them
into Prometheus families at scrape time, so this layer needs no metrics
library.  Status codes are named as Go names them ("OK", "NotFound", ...),
which is what etcd's dashboards match on.
"""

from __future__ import annotations

import threading

import grpc

# grpc.StatusCode -> the Go name used in grpc_code labels.
GO_CODE_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}

UNARY, CLIENT_STREAM, SERVER_STREAM, BIDI_STREAM = "unary", "client_stream", "server_stream", "bidi_stream"


class GrpcStats:
    """Counters keyed by (type, service, method[, code]); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started: dict[tuple[str, str, str], int] = {}
        self.handled: dict[tuple[str, str, str, str], int] = {}
        self.received: dict[tuple[str, str, str], int] = {}
        self.sent: dict[tuple[str, str, str], int] = {}

    def on_start(self, key: tuple[str, str, str], calls: int = 1) -> None:
        with self._lock:
            self.started[key] = self.started.get(key, 0) + calls

    def on_messages(self, key: tuple[str, str, str], received: int, sent: int) -> None:
        with self._lock:
            if received:
                self.received[key] = self.received.get(key, 0) + received
            if sent:
                self.sent[key] = self.sent.get(key, 0) + sent

    def on_handled(self, key: tuple[str, str, str], code: str, received: int = 0, sent: int = 0,
                   calls: int = 1) -> None:
        hkey = (*key, code)
        with self._lock:
            self.handled[hkey] = self.handled.get(hkey, 0) + calls
            if received:
                self.received[key] = self.received.get(key, 0) + received
            if sent:
                self.sent[key] = self.sent.get(key, 0) + sent

    def snapshot(self) -> tuple[dict, dict, dict, dict]:
        """Copies of (started, handled, received, sent)."""
        with self._lock:
            return dict(self.started), dict(self.handled), dict(self.received), dict(self.sent)


def _code_name(context, failed: bool) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - older grpc: no accessor
        code = None
    if code is None:
        return "Unknown" if failed else "OK"
    if isinstance(code, grpc.StatusCode):
        return GO_CODE_NAMES.get(code, "Unknown")
    return "Unknown"


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class StatsInterceptor(grpc.ServerInterceptor):
    """Counts calls into a GrpcStats.  Wrapped handlers are cached per method,
    so the per-call cost is one dict lookup and the counting itself."""

    def __init__(self, stats: GrpcStats) -> None:
        self.stats = stats
        self._cache: dict[str, tuple[object, object]] = {}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._cache[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler):
        service, name = _split(method)
        stats = self.stats
        if handler.unary_unary is not None:
            fn = handler.unary_unary
            key = (UNARY, service, name)

            def unary_unary(request, context):
                stats.on_start(key)
                try:
                    resp = fn(request, context)
                except BaseException:
                    stats.on_handled(key, _code_name(context, True), 1, 0)
                    raise
                code = _code_name(context, False)
                stats.on_handled(key, code, 1, 1 if code == "OK" else 0)
                return resp

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            fn = handler.unary_stream
            key = (SERVER_STREAM, service, name)

            def unary_stream(request, context):
                stats.on_start(key)
                return _count_stream(stats, key, context, lambda: fn(request, context), None, 1)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            fn = handler.stream_unary
            key = (CLIENT_STREAM, service, name)

            def stream_unary(request_iterator, context):
                stats.on_start(key)
                counted = _CountingIterator(request_iterator)
                try:
                    resp = fn(counted, context)
                except BaseException:
                    stats.on_handled(key, _code_name(context, True), counted.count, 0)
                    raise
                code = _code_name(context, False)
                stats.on_handled(key, code, counted.count, 1 if code == "OK" else 0)
                return resp

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        fn = handler.stream_stream
        key = (BIDI_STREAM, service, name)

        def stream_stream(request_iterator, context):
            stats.on_start(key)
            counted = _CountingIterator(request_iterator)
            return _count_stream(stats, key, context, lambda: fn(counted, context), counted, 0)

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


class _CountingIterator:
    __slots__ = ("it", "count")

    def __init__(self, it) -> None:
        self.it = it
        self.count = 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.it)
        self.count += 1
        return item

    def __getattr__(self, name):  # grpc's request iterators have extras (e.g. cancel)
        return getattr(self.it, name)


def _count_stream(stats: GrpcStats, key, context, start, counted: _CountingIterator | None, received: int):
    sent = 0
    code = None
    try:
        for item in start():
            sent += 1
            yield item
    except GeneratorExit:
        code = "Canceled"
        raise
    except BaseException:
        code = _code_name(context, True)
        raise
    finally:
        if code is None:
            code = _code_name(context, False)
        stats.on_handled(key, code, received + (counted.count if counted is not None else 0), sent)
