"""grpc.health.v1.Health, answered as etcd answers it.

etcd registers grpc-go's health server on every client listener and marks
the whole server ("") SERVING as it starts serving (v3rpc/grpc.go,
health.go).  From grpc-go's server (health/server.go) come the answers to
names it does not know:

    Check("")         SERVING
    Check("other")    NOT_FOUND "unknown service"
    Watch("")         SERVING, then one message per change, until the client goes
    Watch("other")    SERVICE_UNKNOWN, and the stream stays open
    List()            {"": SERVING}  (etcd 3.6; etcd 3.4's grpc-go answers UNIMPLEMENTED)

Where brain says NOT_SERVING (etcd's status stays SERVING; only a defrag
under a feature gate changes it):

* shutting down: from SIGTERM on, open Watch streams get NOT_SERVING
  before the server ends them.  A Check sent then is refused with
  UNAVAILABLE like every new call, which is what a client of etcd sees too
  (etcd 3.6 sends GOAWAY and closes its listeners at once; its open health
  watchers hear nothing until its grace ends);
* a cluster replica that knows no leader, or whose journal (its NATS
  connection) is unreachable: writes and linearizable reads cannot be
  answered there, so a load balancer should send clients elsewhere.

The cluster's state is read through one function, ``problem()`` (None:
serving; else why not: brain.cluster.Replica.serving_problem), polled every POLL_INTERVAL while Watch streams are
open: the election, too, learns of a lost leader by polling.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from brain.api.pb.grpc.health.v1 import health_pb2
from brain.api.rpc_table import SERVER_STREAM, Rpc, ServiceTable
from brain.api.status import unparsable
from brain.api.authz import PUBLIC
from brain.api.unary import SHUTTING_DOWN, stepped_rpc
from brain.mvcc.errors import EtcdError

log = logging.getLogger("brain.api.health")

SERVICE = "grpc.health.v1.Health"
ALL_SERVICES = ""  # the only name etcd registers: the server as a whole

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

POLL_INTERVAL = 0.2  # seconds between looks at a replica's leader and journal (the election's poll)

_ENDED = object()  # a grpcio Watch's queue: the server ends the stream
_GONE = object()  # ... the call is over (the client went away)


def unknown_service() -> EtcdError:
    """grpc-go's answer to Check for a name it does not know."""
    return EtcdError("NOT_FOUND", "unknown service")


def encode(status: int) -> bytes:
    return health_pb2.HealthCheckResponse(status=status).SerializeToString()


class _Watcher:
    __slots__ = ("service", "send", "end", "last")

    def __init__(self, service: str, send: Callable[[int], None], end: Callable[[], None] | None) -> None:
        self.service = service
        self.send = send
        self.end = end
        self.last = -1


class HealthService:
    """The server's health, for both fronts: ``check`` and ``list`` are
    steps (brain.api.unary), ``watch`` subscribes a stream to changes.

    ``problem``: a function saying why the server cannot serve (None when it
    can), for a cluster replica; None on a single node."""

    def __init__(self, problem: Callable[[], str | None] | None = None, *,
                 poll_interval: float = POLL_INTERVAL) -> None:
        self.problem = problem
        self.poll_interval = poll_interval
        self._lock = threading.Lock()  # guards everything below; held while sending (sends do not block)
        self._watchers: set[_Watcher] = set()
        self._shutting_down = False
        self._status = SERVING
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    # -- state ---------------------------------------------------------------------

    def _reason(self) -> str | None:
        """Why "" is NOT_SERVING now, or None."""
        if self._shutting_down:
            return "shutting down"
        if self.problem is None:
            return None
        try:
            return self.problem()
        except Exception as e:  # noqa: BLE001 - a state we cannot read is not one we serve in
            return f"state unreadable: {e!r}"

    def _update(self) -> None:
        """Recompute the status (lock held), logging a change as etcd does."""
        reason = self._reason()
        status = NOT_SERVING if reason else SERVING
        if status != self._status:
            fields = {"service": ALL_SERVICES, "status": health_pb2.HealthCheckResponse.ServingStatus.Name(status)}
            if reason:
                fields["reason"] = reason
            log.log(logging.WARNING if reason else logging.INFO, "grpc service status changed",
                    extra={"fields": fields})
            self._status = status

    def status(self) -> int:
        """The status of "" now."""
        with self._lock:
            self._update()
            return self._status

    def refresh(self) -> None:
        """Look at the state again and tell every watcher of a change."""
        with self._lock:
            self._update()
            self._publish()

    def _publish(self) -> None:
        for w in self._watchers:
            if w.service == ALL_SERVICES and w.last != self._status:
                w.last = self._status
                w.send(self._status)

    def shutdown(self) -> None:
        """The server is stopping: NOT_SERVING from now on, told to every
        watcher at once (grpc-go's Server.Shutdown)."""
        self._stop.set()
        with self._lock:
            self._shutting_down = True
            self._update()
            self._publish()

    def end_streams(self) -> None:
        """End every Watch stream that asked to be ended (the grpcio front's:
        its streams would hold the grace period open)."""
        with self._lock:
            watchers, self._watchers = self._watchers, set()
        for w in watchers:
            if w.end is not None:
                w.end()

    # -- the calls --------------------------------------------------------------------

    def check(self, request: health_pb2.HealthCheckRequest) -> health_pb2.HealthCheckResponse:
        if request.service != ALL_SERVICES:
            raise unknown_service()
        return health_pb2.HealthCheckResponse(status=self.status())

    def list(self, _request: health_pb2.HealthListRequest) -> health_pb2.HealthListResponse:
        out = health_pb2.HealthListResponse()
        out.statuses[ALL_SERVICES].status = self.status()
        return out

    def watch(self, request: health_pb2.HealthCheckRequest, send: Callable[[int], None],
              end: Callable[[], None] | None = None) -> Callable[[], None]:
        """Send the status now, then each change, with ``send(status)``
        (called with this service's lock held: it must not block); returns
        the function that unsubscribes.  A name other than "" gets
        SERVICE_UNKNOWN and nothing after it: no other name is registered.
        ``end()``, if given, is how end_streams ends the stream."""
        w = _Watcher(request.service, send, end)
        with self._lock:
            self._update()
            w.last = self._status if w.service == ALL_SERVICES else SERVICE_UNKNOWN
            send(w.last)
            self._watchers.add(w)
            if w.service == ALL_SERVICES:
                self._start_monitor()

        def cancel() -> None:
            with self._lock:
                self._watchers.discard(w)

        return cancel

    # -- Watch on grpcio (the native front subscribes with watch()) ----------------------

    def WatchRaw(self, raw: bytes, context):
        """Watch on the request's bytes: a malformed one gets grpc-go's text."""
        try:
            request = health_pb2.HealthCheckRequest.FromString(raw)
        except DecodeError as e:
            context.abort(*unparsable(e))
        yield from self.Watch(request, context)

    def Watch(self, request, context):
        """A generator on a grpcio thread: statuses from a queue, until the
        client goes or end_streams ends it with UNAVAILABLE."""
        updates: queue.SimpleQueue = queue.SimpleQueue()
        cancel = self.watch(request, updates.put, end=lambda: updates.put(_ENDED))
        if not context.add_callback(lambda: updates.put(_GONE)):
            cancel()  # the call ended before the callback could be added
            return
        try:
            while (status := updates.get()) is not _GONE:
                if status is _ENDED:
                    context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
                yield health_pb2.HealthCheckResponse(status=status)
        finally:
            cancel()

    def rpc_table(self) -> ServiceTable:
        # Check and List neither wait for a write nor read the store: no engine
        return ServiceTable(SERVICE, (
            # not behind etcd's auth: no caller is named, whatever token comes along
            stepped_rpc(None, "Check", health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse, self.check,
                        guard=PUBLIC),
            stepped_rpc(None, "List", health_pb2.HealthListRequest, health_pb2.HealthListResponse, self.list,
                        guard=PUBLIC),
            Rpc("Watch", health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse, self.WatchRaw,
                shape=SERVER_STREAM, subscribe=self.watch, encode=encode, raw_request=True),
        ))

    # -- polling a replica's state while someone watches ----------------------------------

    def _start_monitor(self) -> None:
        """(lock held) Poll the replica while someone watches ""."""
        if self.problem is None or self._monitor is not None or self._stop.is_set():
            return
        self._monitor = threading.Thread(target=self._poll, name="brain-health", daemon=True)
        self._monitor.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_interval):
            with self._lock:
                if not any(w.service == ALL_SERVICES for w in self._watchers):
                    self._monitor = None  # the next watcher starts another
                    return
                self._update()
                self._publish()

    def close(self) -> None:
        self.shutdown()
        with self._lock:
            monitor, self._monitor = self._monitor, None
        if monitor is not None:
            monitor.join(2)

