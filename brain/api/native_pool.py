"""What the native front runs in a small thread pool: work its dispatch
thread must not wait for.

* the rare unary calls (Maintenance, Cluster): servicer methods written for
  grpcio, called with ``PoolContext``, just enough of a ServicerContext;
* server streams driven by a generator (Maintenance.Snapshot,
  KV.RangeStream): a ``PooledStream`` session whose thread sends each
  response and waits while the stream's send queue is full;
* etcd's HTTP endpoints on the client port (/health, /version, /metrics,
  ...), every answer with etcd's default CORS headers.
"""

from __future__ import annotations

import logging
import threading

from google.protobuf.message import DecodeError

from brain.api.native_sessions import Session, Sessions
from brain.api.status import OK, Status, fail_call, unparsable

# one logger for the transport's Python side (brain.api.native_front)
log = logging.getLogger("brain.api.native_front")

# etcd's client port allows every origin (--cors defaults to "*"), so every
# HTTP answer there carries these (embed/serve.go's corsHandler).
CORS_HEADERS = [("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE"),
                ("Access-Control-Allow-Origin", "*"),
                ("Access-Control-Allow-Headers", "accept, content-type, authorization")]


class Abort(Exception):
    """How PoolContext.abort ends a servicer method: with its status."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


class PoolContext:
    """Just enough of grpc.ServicerContext for the servicer methods that
    run in the pool: they abort, ask whether to go on, and ask who calls
    (the auth token metadata and the client certificate's common name,
    from the transport's event: ``who``, the name or (name, token))."""

    __slots__ = ("cancelled", "who")

    def __init__(self, who=None) -> None:
        self.cancelled = False
        self.who = who

    def abort(self, code, details):
        raise Abort(Status.of(code, details))

    def is_active(self) -> bool:
        return not self.cancelled

    def invocation_metadata(self):
        who = self.who
        return (("token", who[1]),) if type(who) is tuple else ()

    def auth_context(self) -> dict:
        who = self.who
        name = who[0] if type(who) is tuple else who
        return {"x509_common_name": [name.encode()]} if name else {}


class PooledStream(Session):
    """A server stream a pool thread drives (``Pool.server_stream``); the
    dispatch thread only tells it that it may send again, or must stop."""

    __slots__ = ("ready", "context")

    def __init__(self, sessions: Sessions, sid: int, method, who=None) -> None:
        super().__init__(sessions, sid, method)
        self.ready = threading.Event()
        self.context = PoolContext(who)

    def on_writable(self) -> None:
        self.writable = True
        self.ready.set()

    def ended(self, code_name: str) -> None:
        self.let_go()  # its pool thread ends the call and counts it

    def release(self) -> None:
        self.context.cancelled = True
        self.ready.set()


class Pool:
    """Submits the pool's work (from the dispatch thread) and runs it (on
    the executor's threads).  Calls and streams are counted in ``inflight``
    until answered; HTTP requests are not."""

    def __init__(self, executor, transport, stats, sessions: Sessions, inflight, http=None) -> None:
        self.executor = executor
        self.transport = transport
        self.stats = stats
        self.sessions = sessions
        self.inflight = inflight  # begin() / end(n): what a graceful stop waits for
        self.http = http  # answer(method, target), brain.metrics.http's endpoints

    def unary(self, cid: int, m, payload: bytes, who=None) -> None:
        self.inflight.begin()
        self.executor.submit(self._run_unary, cid, m, payload, who)

    def server_stream(self, cid: int, m, payload: bytes, who=None) -> None:
        self.inflight.begin()
        s = self.sessions.add(PooledStream(self.sessions, cid, m, who))
        self.executor.submit(self._run_server_stream, s, payload)

    def http_request(self, rid: int, method: str, target: str) -> None:
        self.executor.submit(self._run_http, rid, method, target)

    def _run_unary(self, cid: int, m, payload: bytes, who=None) -> None:
        try:
            data = m.call(payload, PoolContext(who)).SerializeToString()
            self.stats.on_handled(m.stats_key, "OK", 1, 1)
            self.transport.respond(cid, data)
        except Abort as a:
            fail_call(self.transport, self.stats, cid, m.stats_key, a.status)
        except Exception as e:  # noqa: BLE001
            fail_call(self.transport, self.stats, cid, m.stats_key, Status.of_error(e, m.name))
        finally:
            self.inflight.end(1)

    def _run_server_stream(self, s: PooledStream, payload: bytes) -> None:
        m = s.method
        status = OK
        gen = None
        try:
            request = m.parse(payload)
            gen = m.call(request, s.context)
            for resp in gen:
                if s.context.cancelled:
                    status = Status(OK.code, "Canceled", "")  # counted so; nothing is sent: the call is over
                    break
                s.sent += 1
                if not self.transport.send(s.sid, [resp.SerializeToString()]):
                    s.writable = False
                    while not s.writable and not s.context.cancelled:
                        s.ready.wait(1.0)
                        s.ready.clear()
        except DecodeError as e:
            status = Status.of(*unparsable(e))
        except Abort as a:
            status = a.status
        except Exception as e:  # noqa: BLE001
            status = Status.of_error(e, m.name)
        finally:
            if gen is not None:
                gen.close()
            if not s.context.cancelled:
                self.transport.finish(s.sid, status.code, status.message)
            self.sessions.pop(s.sid)
            if s.unwatch is not None:
                s.unwatch()
            self.stats.on_handled(m.stats_key, status.name, 1, s.sent)
            self.inflight.end(1)

    def _run_http(self, rid: int, method: str, target: str) -> None:
        try:
            if method == "OPTIONS":  # etcd's CORS handler answers every preflight itself
                a = (200, [], b"")
            elif self.http is None:
                a = (404, [("Content-Type", "text/plain; charset=utf-8")], b"404 page not found\n")
            else:
                ans = self.http.answer(method, target)
                a = (ans.status, ans.header_list(), ans.body)
        except Exception:  # noqa: BLE001
            log.exception("HTTP %s %s failed", method, target)
            a = (500, [("Content-Type", "text/plain; charset=utf-8")], b"Internal Server Error\n")
        self.transport.http_respond(rid, a[0], CORS_HEADERS + a[1], a[2])


__all__ = ["Abort", "CORS_HEADERS", "Pool", "PoolContext", "PooledStream"]
