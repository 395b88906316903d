"""etcd's require-leader: calls that carry ``hasleader: true`` need a leader.

A client sets the gRPC metadata ``hasleader: true`` (clientv3's
WithRequireLeader; kube-apiserver on every watch and progress request) to
hear at once when the member it talks to is cut off, instead of waiting on a
stream that will stay silent.  etcd's interceptors (v3rpc/interceptor.go)
then do, and so does brain on both transports:

* a unary call, or a stream being opened, on a server without a leader
  fails at once with UNAVAILABLE ``etcdserver: no leader``;
* an open stream with the metadata is ended with that status once the
  server has had no leader for ``NO_LEADER_CHECKS`` checks in a row, one
  check every election timeout (etcd's monitorLeader: reconnecting streams
  costs more than refusing new calls, so it waits longer for streams);
* without the metadata nothing changes.

"Has a leader" is the engine's (brain.engine.Engine.has_leader): always on
a single node; on a replica, brain.cluster.Replica.has_leader.  With etcd's
default election timeout (1 s) a stream ends 3-4 s after its member lost the
leader; brain counts in its own --election-timeout.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import grpc

from brain.mvcc.errors import ErrNoLeader

log = logging.getLogger("brain.api.require_leader")

METADATA_KEY = "hasleader"  # rpctypes.MetadataRequireLeaderKey
METADATA_VALUE = "true"  # rpctypes.MetadataHasLeader
NO_LEADER_CHECKS = 3  # etcd's maxNoLeaderCnt

__all__ = ["LeaderMonitor", "METADATA_KEY", "METADATA_VALUE", "NO_LEADER_CHECKS", "NoLeaderCount",
           "RequireLeaderInterceptor", "requires_leader"]


def requires_leader(metadata) -> bool:
    """Whether gRPC metadata ((key, value) pairs) asks for a leader: as etcd
    reads it, the first ``hasleader`` value must be exactly "true"."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return value == METADATA_VALUE
    return False


class NoLeaderCount:
    """The monitor's arithmetic, apart from its clock: ``check(has_leader)``
    once per election timeout; True when open streams must end now.

    Worked example (checks every 1 s, leader lost at t=0.4): checks at 1, 2
    and 3 see none, so streams end at t=3 (2.6 s after the loss); lost at
    t=0.9 they end at t=3 as well; a leader seen at t=2 starts the count
    again.  Once the count is reached every later check without a leader
    ends the streams opened since (etcd does the same)."""

    __slots__ = ("checks", "missed")

    def __init__(self, checks: int = NO_LEADER_CHECKS) -> None:
        self.checks = checks
        self.missed = 0

    def check(self, has_leader: bool) -> bool:
        self.missed = 0 if has_leader else self.missed + 1
        return self.missed >= self.checks


class LeaderMonitor:
    """The open require-leader streams of one API server, and the thread
    that ends them with ``etcdserver: no leader`` (etcd's monitorLeader).

    ``watch(cancel)`` registers a stream by the function that ends it
    (called on the monitor's thread; it must not block) and returns the
    function that unregisters it, to call when the stream ends otherwise.
    The thread runs only on servers that can lose their leader
    (``start(interval)``)."""

    def __init__(self, has_leader: Callable[[], bool], checks: int = NO_LEADER_CHECKS) -> None:
        self.has_leader = has_leader
        self._count = NoLeaderCount(checks)
        self._lock = threading.Lock()  # guards _streams; never held while a cancel runs
        self._streams: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cancelled = 0  # streams ended for want of a leader

    def watch(self, cancel: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._next += 1
            token = self._next
            self._streams[token] = cancel

        def forget() -> None:
            with self._lock:
                self._streams.pop(token, None)

        return forget

    def stats(self) -> dict:
        """For the metrics: require-leader streams open now and ended so far."""
        with self._lock:
            return {"require_leader_streams": len(self._streams), "require_leader_ended": self.cancelled}

    def start(self, interval: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(interval,), name="brain-require-leader",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.check_now()
            except Exception:  # noqa: BLE001 - the monitor must survive a bug
                log.exception("require-leader check failed")

    def check_now(self) -> int:
        """One check (the thread's, every interval): ends every registered
        stream when the count is reached; how many it ended."""
        if not self._count.check(self.has_leader()):
            return 0
        with self._lock:
            cancels = list(self._streams.values())
            self._streams.clear()
        for cancel in cancels:
            try:
                cancel()
            except Exception:  # noqa: BLE001 - one stream's failure must not spare the others
                log.exception("ending a require-leader stream failed")
        if cancels:
            self.cancelled += len(cancels)
            log.warning("no leader for %d checks: ended %d require-leader streams with %r",
                        self._count.checks, len(cancels), ErrNoLeader.message)
        return len(cancels)


class _CancellableContext:
    """A grpcio stream's context that the monitor can end (etcd's
    cancellableContext): ``is_active()`` turns False and the callbacks the
    servicer added run (the Watch servicer closes its handle), so the
    servicer's generator returns and the wrapper ends the call with the
    reason."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context
        self._callbacks: list[Callable[[], None]] = []
        self.no_leader = False

    def __getattr__(self, name: str):
        return getattr(self._context, name)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._callbacks.append(callback)
        return self._context.add_callback(callback)

    def is_active(self) -> bool:
        return not self.no_leader and self._context.is_active()

    def cancel_no_leader(self) -> None:
        self.no_leader = True
        for callback in self._callbacks:
            callback()


class RequireLeaderInterceptor(grpc.ServerInterceptor):
    """grpcio's half of etcd's stream interceptor: a stream that requires a
    leader is refused without one, else watched by ``monitor`` until it ends.

    Unary calls are checked in their handler, after the request is parsed,
    where etcd checks them (brain.api.unary.call_on_bytes).  A servicer that
    blocks on the client's next message (LeaseKeepAlive) ends at that
    message; Watch ends at once."""

    def __init__(self, monitor: LeaderMonitor) -> None:
        self.monitor = monitor
        self._wrapped: dict[str, tuple[object, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        if not requires_leader(handler_call_details.invocation_metadata):
            return handler
        cached = self._wrapped.get(handler_call_details.method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._wrap(handler))
            self._wrapped[handler_call_details.method] = cached
        return cached[1]

    def _wrap(self, handler) -> grpc.RpcMethodHandler:
        fn = handler.stream_stream or handler.unary_stream
        monitor = self.monitor

        def behavior(request_or_iterator, context):
            if not monitor.has_leader():
                context.abort(grpc.StatusCode.UNAVAILABLE, ErrNoLeader.message)
            ctx = _CancellableContext(context)
            forget = monitor.watch(ctx.cancel_no_leader)
            try:
                for response in fn(request_or_iterator, ctx):
                    if ctx.no_leader:
                        break
                    yield response
            finally:
                forget()
            if ctx.no_leader:
                context.abort(grpc.StatusCode.UNAVAILABLE, ErrNoLeader.message)

        make = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                else grpc.unary_stream_rpc_method_handler)
        return make(behavior, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
