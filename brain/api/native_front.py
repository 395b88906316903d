"""The native front: every etcd RPC and etcd's HTTP endpoints, on brain's
own transport (brain._transport, Rust), for every listener kind.

Why it exists: a grpcio server spends about 190 us of CPU per call on
dispatch alone, three times what etcd spends on a whole durable Put, and
its TLS path costs more still (benchmarks/README.md).  The transport runs
sockets, TLS, HTTP/2 and gRPC framing on Rust threads outside the GIL and
hands everything to Python as events, in batches.  One dispatch thread
here takes a batch and

* answers serializable reads at once, at the committed revision;
* answers linearizable reads (Range, read-only Txn, LeaseTimeToLive,
  LeaseLeases) behind ONE ``engine.read_barrier`` per batch: at once when
  it says so, else when its callback fires (a clustered replica);
* hands every write of the batch to the engine in ONE ``submit_batch``, so
  they share one journal append and one fdatasync; the committer answers
  each call when its write is durable (``Deferred.finish``);
* feeds stream messages to their sessions: Watch (brain.api.watch
  WatchStream, polled when the hub says it has responses) and
  LeaseKeepAlive (the batch's renewals in ONE ``lease_keepalive_many``);
* subscribes health Watch streams (grpc.health.v1) to the health
  service, which sends each status change from whichever thread sees it;
* passes rare calls (Maintenance, Cluster, the Snapshot stream) and HTTP
  requests (/health, /version, /metrics, ...) to a small thread pool.

No thread per stream: a stream is a session object keyed by the
transport's id.  Each stream's send queue is bounded in the transport;
when ``send`` reports it full, the front stops polling that stream until
the transport says it is writable again.

Errors keep etcd's codes and texts (brain.api.status.status_of); an
oversized request gets grpc-go's text.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections import deque
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from brain.api.grpc_stats import BIDI_STREAM, GO_CODE_NAMES, SERVER_STREAM, UNARY, GrpcStats
from brain.api.native_listeners import TlsFiles, reuse_port_socket
from brain.api.rpc_table import LINEARIZABLE, Rpc, ServiceTable
from brain.api.status import status_of
from brain.api.unary import SHUTTING_DOWN, Deferred, call_on_bytes
from brain.mvcc.errors import ErrNoLeader

log = logging.getLogger("brain.api.native_front")

try:  # built by maturin with the package (pip install . needs cargo)
    _transport = importlib.import_module("brain._transport")  # its own error text, not from-import's
except ImportError as e:  # pragma: no cover - depends on the build
    _transport = None
    _IMPORT_ERROR = str(e) or type(e).__name__
else:
    _IMPORT_ERROR = ""

BATCH_EVENTS = 1024  # events taken from the transport per dispatch round

_OK = 0
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]

# etcd's client port allows every origin (--cors defaults to "*"), so every
# HTTP answer there carries these (embed/serve.go's corsHandler).
CORS_HEADERS = [("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE"),
                ("Access-Control-Allow-Origin", "*"),
                ("Access-Control-Allow-Headers", "accept, content-type, authorization")]

def available() -> bool:
    return _transport is not None


def unavailable_message() -> str:
    """Why `--grpc-front native` cannot serve, on one line, naming both
    fixes: brain never falls back to grpcio on its own, since grpcio serves
    no HTTP endpoints on the client port and costs several times the CPU."""
    return (f"--grpc-front native: brain's transport module brain._transport cannot be imported "
            f"({_IMPORT_ERROR}); reinstall brain (pip install . builds it, with cargo) "
            f"or start it with --grpc-front grpcio")


def io_threads() -> int:
    """The transport's I/O threads: half the cores, at least one, at most 4.
    They compete with the GIL-holding Python threads for CPU; on 2 cores one
    I/O thread measured best (benchmarks/README.md)."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _PoolContext:
    """Just enough of grpc.ServicerContext for the servicer methods that
    run in the pool: they only ever abort (or ask whether to go on)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def abort(self, code, details):
        raise _Abort(code, details)

    def is_active(self) -> bool:
        return not self.cancelled


class Method:
    """One method of the front, by the transport's method id (made from a
    service's table row by front_methods).

    kinds: a unary ``step`` with its request class (run on the dispatch
    thread; ``read`` classifies a request as SERIALIZABLE, LINEARIZABLE or
    None for a write); a unary ``call(raw, context)`` on the request's bytes
    (run in the pool); a server-streaming ``call(request, context)`` generator (run
    in the pool); a server stream fed by ``subscribe(request, send)``,
    which returns the function that unsubscribes (no thread: ``send`` is
    called by whoever has news); or a bidirectional ``stream``, named by
    its session kind ("watch", "keepalive").
    """

    __slots__ = ("path", "name", "kind", "parse", "step", "call", "stream", "read", "subscribe", "encode",
                 "stats_key")

    def __init__(self, service: str, name: str, *, request_cls=None, step=None, call=None, stream=None,
                 server_stream=False, read=None, subscribe=None, encode=None) -> None:
        self.path = f"/{service}/{name}"
        self.name = name
        self.parse = request_cls.FromString if request_cls is not None else None
        self.step = step
        self.call = call
        self.stream = stream
        self.read = read
        self.subscribe = subscribe  # with encode(item) -> bytes for what it sends
        self.encode = encode
        server_stream = server_stream or subscribe is not None
        if stream is not None:
            self.kind = _transport.KIND_BIDI if _transport else 2
            self.stats_key = (BIDI_STREAM, service, name)
        elif server_stream:
            self.kind = _transport.KIND_SERVER_STREAM if _transport else 1
            self.stats_key = (SERVER_STREAM, service, name)
        else:
            self.kind = _transport.KIND_UNARY if _transport else 0
            self.stats_key = (UNARY, service, name)
        if (step is not None or subscribe is not None) and request_cls is None:
            raise ValueError("a step or a subscription needs its request class")


class _Session:
    """A stream served by the front: its transport id and method;
    ``unwatch`` unregisters a require-leader stream from the leader monitor."""

    __slots__ = ("sid", "method", "writable", "received", "sent", "unwatch")

    def __init__(self, sid: int, method: Method) -> None:
        self.sid = sid
        self.method = method
        self.writable = True
        self.received = 0
        self.sent = 0
        self.unwatch = None


class _WatchSession(_Session):
    __slots__ = ("watch",)


class _KeepAliveSession(_Session):
    __slots__ = ("outstanding", "half_closed", "done")

    def __init__(self, sid: int, method: Method) -> None:
        super().__init__(sid, method)
        self.outstanding = 0
        self.half_closed = False
        self.done = False


class _SubscribedStream(_Session):
    __slots__ = ("cancel",)

    def __init__(self, sid: int, method: Method) -> None:
        super().__init__(sid, method)
        self.cancel = None


class _PooledStream(_Session):
    __slots__ = ("ready", "context")

    def __init__(self, sid: int, method: Method) -> None:
        super().__init__(sid, method)
        self.ready = threading.Event()
        self.context = _PoolContext()


def check_tls(tls: TlsFiles) -> None:
    """Load the TLS files as a listener would; ValueError says what is wrong."""
    _transport.check_tls(tls.args)


class NativeFront:
    """Serves ``methods`` (and, when ``http`` is given, etcd's HTTP
    endpoints) on any number of listeners through one transport."""

    def __init__(self, engine, methods: list[Method], *, recv_limit: int, stats: GrpcStats,
                 pool: futures.Executor, http=None, watch_service=None, lease_service=None, leader_monitor=None,
                 keepalive_time_ms: int, keepalive_timeout_ms: int, keepalive_min_time_ms: int = 5000,
                 send_queue_bytes: int = 4 << 20) -> None:
        if _transport is None:
            raise RuntimeError(unavailable_message())
        self.engine = engine
        self.methods = methods
        self.recv_limit = recv_limit
        self.stats = stats
        self.pool = pool
        self.http = http
        self.watch_service = watch_service
        self.lease_service = lease_service
        self.leader_monitor = leader_monitor  # brain.api.require_leader.LeaderMonitor
        self.transport = _transport.Transport(
            [(m.path, m.kind) for m in methods], io_threads=io_threads(),
            # over the limit the transport passes the length, not the body
            max_recv_bytes=recv_limit, send_queue_bytes=send_queue_bytes,
            keepalive_interval_ms=keepalive_time_ms, keepalive_timeout_ms=keepalive_timeout_ms,
            keepalive_min_time_ms=keepalive_min_time_ms)
        self._sessions: dict[int, _Session] = {}
        self._ready: deque[int] = deque()  # streams with responses to poll
        self._wake_pending = False
        self._later: deque = deque()  # engine callbacks to finish on the dispatch thread
        self._dispatch_ident = 0
        self._thread: threading.Thread | None = None
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._idle = threading.Condition(self._inflight_lock)
        self._stopping = False

    # -- listeners and lifecycle -------------------------------------------

    def listen_tcp(self, host: str, port: int, tls: TlsFiles | None = None, *, reuse_port: bool = False) -> int:
        """Bind now (a taken port fails here); the bound port.  ``reuse_port``:
        etcd's --socket-reuse-port (brain.api.native_listeners)."""
        args = tls.args if tls else None
        if not reuse_port:
            return self.transport.listen_tcp(host, port, args)
        return self.transport.listen_tcp_fd(reuse_port_socket(host, port), args)

    def listen_unix(self, path: str, tls: TlsFiles | None = None) -> None:
        self.transport.listen_unix(path, tls.args if tls else None)

    def start(self) -> None:
        self.transport.start()
        self._thread = threading.Thread(target=self._dispatch, name="brain-front", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, wait up to ``grace`` seconds for calls in
        flight (writes waiting for their fdatasync), end the streams, close."""
        self._stopping = True
        # Subscribed streams (health Watch) never end on their own, and the
        # grace is for calls that do: end them now, on the dispatch thread,
        # which owns the sessions (they were told NOT_SERVING already).
        self._run_on_dispatch(self._end_subscriptions, _UNAVAILABLE, "Unavailable", SHUTTING_DOWN)
        deadline = time.monotonic() + (grace or 0.0)
        with self._idle:
            while self._inflight and grace:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
        if grace:
            time.sleep(0.05)  # let the I/O thread write the last answers
        self.transport.close()
        if self._thread is not None:
            self._thread.join(5)
        for s in list(self._sessions.values()):
            if isinstance(s, _WatchSession):
                s.watch.close()
            elif isinstance(s, _PooledStream):
                s.context.cancelled = True
                s.ready.set()
        self._sessions.clear()

    def transport_stats(self) -> dict:
        return self.transport.stats()

    # -- dispatch ------------------------------------------------------------

    def _on_dispatch_thread(self, fn, *args) -> None:
        """Run ``fn(*args)`` now when called on the dispatch thread (the
        engine answered at once), else queue it there: sessions and the
        read bookkeeping are only ever touched by that thread."""
        if threading.get_ident() == self._dispatch_ident:
            fn(*args)
        else:
            self._later.append((fn, args))
            self.transport.wake()

    def _run_on_dispatch(self, fn, *args, timeout: float = 2.0) -> None:
        """Run ``fn(*args)`` on the dispatch thread and wait for it (from
        another thread; at once when the dispatch thread is not running)."""
        if self._thread is None or not self._thread.is_alive():
            fn(*args)
            return
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._later.append((run, ()))
        self.transport.wake()
        done.wait(timeout)

    def _dispatch(self) -> None:
        self._dispatch_ident = threading.get_ident()
        t = self.transport
        EV_CALL, EV_OPEN, EV_MESSAGE = _transport.EV_CALL, _transport.EV_OPEN, _transport.EV_MESSAGE
        REQUIRE_LEADER = _transport.REQUIRE_LEADER
        while (events := t.recv_batch(BATCH_EVENTS)) is not None:
            try:
                if events:
                    self._round(events, EV_CALL, EV_OPEN, EV_MESSAGE, REQUIRE_LEADER)
                self._wake_pending = False
                while self._later:
                    fn, args = self._later.popleft()
                    fn(*args)
                self._pump()
            except Exception:  # noqa: BLE001 - the dispatch thread must survive a bug
                log.exception("front dispatch round failed")

    def _round(self, events, EV_CALL, EV_OPEN, EV_MESSAGE, REQUIRE_LEADER) -> None:
        methods = self.methods
        stats = self.stats
        replies = []  # (id, response bytes): sent in one respond_many
        reply = replies.append
        writes = []
        reads = []
        renewals = []
        started: dict = {}
        answered: dict = {}
        for kind, cid, mid, payload, _cn in events:
            if kind == EV_CALL:
                m = methods[mid]
                started[m.stats_key] = started.get(m.stats_key, 0) + 1
                if self._stopping:
                    self._fail(cid, m, _UNAVAILABLE, "Unavailable", SHUTTING_DOWN)
                    continue
                if m.subscribe is not None:
                    self._subscribe(cid, m, payload)
                    continue
                if m.step is None:
                    self._begin()
                    if m.kind == _transport.KIND_SERVER_STREAM:
                        s = self._sessions[cid] = _PooledStream(cid, m)
                        self.pool.submit(self._run_server_stream, s, payload)
                    else:
                        self.pool.submit(self._run_pooled, cid, m, payload)
                    continue
                try:
                    request = m.parse(payload)
                except DecodeError as e:
                    self._fail(cid, m, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
                    continue
                try:
                    if m.read is not None and m.read(request) == LINEARIZABLE:
                        reads.append((cid, m, request))
                        continue
                    out = m.step(request)
                    if type(out) is Deferred:
                        writes.append((cid, m, out))
                        continue
                    reply((cid, out.SerializeToString()))
                    answered[m.stats_key] = answered.get(m.stats_key, 0) + 1
                except Exception as e:  # noqa: BLE001 - every failure becomes a status
                    self._fail_with(cid, m, e)
            elif kind == EV_MESSAGE:
                s = self._sessions.get(cid)
                if s is None:
                    continue
                s.received += 1
                if type(s) is _KeepAliveSession:
                    try:
                        renewals.append((s, self.lease_service.parse_keepalive(payload)))
                        # counted now: a half-close later in this batch must
                        # not end the stream before this renewal is answered
                        s.outstanding += 1
                    except DecodeError as e:
                        self._finish(s, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
                elif type(s) is _WatchSession:
                    try:
                        s.watch.on_message(payload)
                    except DecodeError as e:
                        self._finish(s, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
                    except Exception as e:  # noqa: BLE001
                        code, message = status_of(e, "Watch")
                        self._finish(s, code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)
            elif kind == EV_OPEN:
                m = methods[mid]
                stats.on_start(m.stats_key)
                if self._stopping:
                    self.transport.finish(cid, _UNAVAILABLE, SHUTTING_DOWN)
                    stats.on_handled(m.stats_key, "Unavailable")
                    continue
                self._open(cid, m)
            elif kind & REQUIRE_LEADER:  # after the common kinds: calls without it pay nothing
                self._require_leader(kind ^ REQUIRE_LEADER, cid, mid, payload, _cn)
            else:
                self._other(kind, cid, mid, payload, _cn)
        # Counted before anything is answered: a client that has its answer
        # sees its call in the metrics.
        for key, n in started.items():
            stats.on_start(key, n)
        if writes:
            self._submit(writes)
        if reads:
            self._read_barrier(reads, replies)
        for key, n in answered.items():
            stats.on_handled(key, "OK", n, n, calls=n)
        if replies:
            self.transport.respond_many(replies)
        if renewals:
            self._renew(renewals)

    def _other(self, kind, cid, mid, payload, last) -> None:
        T = _transport
        if kind == T.EV_WRITABLE:
            s = self._sessions.get(cid)
            if s is not None:
                s.writable = True
                if isinstance(s, _PooledStream):
                    s.ready.set()
                else:
                    self._ready.append(cid)
        elif kind == T.EV_HALF_CLOSED:
            s = self._sessions.get(cid)
            if type(s) is _KeepAliveSession:
                # etcd ends LeaseKeepAlive when the client is done sending,
                # once every renewal asked for has been answered.
                s.half_closed = True
                if not s.outstanding:
                    self._finish(s, _OK, "OK", "")
            # A Watch client that half-closes keeps receiving, as with etcd.
        elif kind == T.EV_CANCELLED:
            s = self._sessions.pop(cid, None)
            if s is not None:
                self._closed(s, "Canceled")
        elif kind == T.EV_OVERSIZED:
            m = self.methods[mid]
            text = f"grpc: received message larger than max ({payload} vs. {self.recv_limit})"
            s = self._sessions.get(cid)
            if s is not None:
                self._finish(s, _RESOURCE_EXHAUSTED, "ResourceExhausted", text)
            else:
                self.stats.on_start(m.stats_key)
                self._fail(cid, m, _RESOURCE_EXHAUSTED, "ResourceExhausted", text)
        elif kind == T.EV_HTTP:
            self.pool.submit(self._run_http, cid, mid, payload)
        elif kind == T.EV_REJECTED:
            # etcd's line for a refused handshake (its embed/config_logging.go): a
            # warning, or debug for a peer that closed or never spoke (cid 1).
            log.log(logging.DEBUG if cid else logging.WARNING, "rejected connection on client endpoint",
                    extra={"fields": {"remote-addr": mid, "server-name": payload, "error": last}})

    # -- reads -------------------------------------------------------------

    def _read_barrier(self, reads: list, replies: list) -> None:
        """One barrier for every linearizable read of the round; answers
        go to ``replies`` when it passes at once."""
        self._begin(len(reads))
        try:
            now = self.engine.read_barrier(lambda exc: self._barrier_passed(reads, exc))
        except Exception as e:  # noqa: BLE001
            self._answer_reads(reads, e, True)
            return
        if now:
            self._answer_reads(reads, None, True, replies)

    def _barrier_passed(self, reads: list, exc) -> None:
        # on an engine thread: the reads are answered on the dispatch thread
        self._on_dispatch_thread(self._answer_reads, reads, exc, True)

    def _answer_reads(self, reads: list, exc, waited: bool = False, replies: list | None = None) -> None:
        out = [] if replies is None else replies
        ok: dict = {}
        try:
            for cid, m, request in reads:
                if exc is not None:
                    self._fail_with(cid, m, exc)
                    continue
                try:
                    out.append((cid, m.step(request).SerializeToString()))
                    ok[m.stats_key] = ok.get(m.stats_key, 0) + 1
                except Exception as e:  # noqa: BLE001
                    self._fail_with(cid, m, e)
            for key, n in ok.items():
                self.stats.on_handled(key, "OK", n, n, calls=n)
            if replies is None and out:
                self.transport.respond_many(out)
        finally:
            if waited:
                self._end(len(reads))

    # -- writes ------------------------------------------------------------

    def _submit(self, writes: list) -> None:
        self._begin(len(writes))
        try:
            self.engine.submit_batch([w[2].request for w in writes], self._completer(writes))
        except Exception as e:  # noqa: BLE001
            for cid, m, _ in writes:
                self._fail_with(cid, m, e)
            self._end(len(writes))

    def _completer(self, writes: list):
        """Answers the calls of one dispatch round as the engine settles
        their writes.  The engine hands the outcomes over on its committer
        thread, once per commit batch; they are encoded and sent on the
        dispatch thread, so the committer, the one thread that decides
        writes, goes straight back to deciding."""
        respond_many = self.transport.respond_many
        stats = self.stats

        def settled(items) -> None:  # on the committer (or at once, on this thread)
            self._on_dispatch_thread(answer, items)

        def answer(items) -> None:
            ok: dict = {}
            replies = []
            try:
                for index, result, exc in items:
                    cid, m, deferred = writes[index]
                    if exc is None:
                        try:
                            data = deferred.finish(result).SerializeToString()
                        except Exception as e:  # noqa: BLE001
                            exc = e
                        else:
                            replies.append((cid, data))
                            ok[m.stats_key] = ok.get(m.stats_key, 0) + 1
                            continue
                    self._fail_with(cid, m, exc)
                for key, n in ok.items():
                    stats.on_handled(key, "OK", n, n, calls=n)
                ok = {}
                if replies:
                    respond_many(replies)  # the GIL is released while they are written
            finally:
                for key, n in ok.items():  # only if answering failed midway
                    stats.on_handled(key, "OK", n, n, calls=n)
                self._end(len(items))

        return settled

    # -- require-leader (brain.api.require_leader) ----------------------------

    def _require_leader(self, kind: int, cid: int, mid: int, payload, cn) -> None:
        """A call or stream opened with ``hasleader: true`` (``kind``
        without the flag): refused without a leader; else served as a round
        of its own, in its place in the batch (a stream's messages later in
        the batch find its session), and a stream is watched by the monitor."""
        if not self.engine.has_leader:
            self._refuse_no_leader(kind, cid, self.methods[mid], payload)
            return
        T = _transport
        self._round([(kind, cid, mid, payload, cn)], T.EV_CALL, T.EV_OPEN, T.EV_MESSAGE, T.REQUIRE_LEADER)
        s = self._sessions.get(cid)
        if s is not None and self.leader_monitor is not None:
            s.unwatch = self.leader_monitor.watch(lambda: self._on_dispatch_thread(self._end_no_leader, cid))

    def _refuse_no_leader(self, kind: int, cid: int, m: Method, payload) -> None:
        """A call that requires a leader, on a server without one.  As in
        grpc-go under etcd's interceptors: a unary request is parsed first
        (a malformed one gets the parse error), a stream is refused before
        its first message is read."""
        self.stats.on_start(m.stats_key)
        if kind == _transport.EV_CALL and m.kind == _transport.KIND_UNARY:
            try:
                m.parse(payload)
            except DecodeError as e:
                self._fail(cid, m, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
                return
        self._fail(cid, m, _UNAVAILABLE, "Unavailable", ErrNoLeader.message)

    def _end_no_leader(self, cid: int) -> None:
        s = self._sessions.get(cid)
        if s is not None:
            s.unwatch = None  # the monitor has let go of it already
            self._finish(s, _UNAVAILABLE, "Unavailable", ErrNoLeader.message)

    # -- streams -------------------------------------------------------------

    def _open(self, cid: int, m: Method) -> None:
        if m.stream == "watch":
            s = _WatchSession(cid, m)
            s.watch = self.watch_service.open_stream(lambda: self._schedule(cid))
        elif m.stream == "keepalive":
            s = _KeepAliveSession(cid, m)
        else:  # pragma: no cover - a method table bug
            raise ValueError(f"unknown stream kind {m.stream!r}")
        self._sessions[cid] = s

    def _subscribe(self, cid: int, m: Method, payload: bytes) -> None:
        """A subscribed stream: its first message is sent now, the others
        by the service as they happen (transport.send takes any thread).
        Not counted in flight: like Watch, it must not hold up a shutdown."""
        try:
            request = m.parse(payload)
        except DecodeError as e:
            self._fail(cid, m, _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}")
            return
        s = self._sessions[cid] = _SubscribedStream(cid, m)
        send, encode = self.transport.send, m.encode

        def deliver(item) -> None:
            s.sent += 1
            send(cid, [encode(item)])  # tiny and rare: a full queue still keeps them

        s.received = 1
        s.cancel = m.subscribe(request, deliver)

    def _end_subscriptions(self, code: int, code_name: str, message: str) -> None:
        for s in list(self._sessions.values()):
            if type(s) is _SubscribedStream:
                self._finish(s, code, code_name, message)

    def _schedule(self, cid: int) -> None:
        """The hub has responses for stream ``cid`` (hub lock held, any
        thread): poll it on the dispatch thread."""
        self._ready.append(cid)
        if not self._wake_pending:
            self._wake_pending = True
            self.transport.wake()

    def _pump(self) -> None:
        """Poll every watch stream that has responses and may send."""
        ready = self._ready
        seen = set()
        send = self.transport.send
        # Only what is queued now: a stream scheduled again while this runs
        # (the hub routed more) stays queued for the next round, which its
        # wake() guarantees; dropping it as a duplicate would lose events.
        for _ in range(len(ready)):
            cid = ready.popleft()
            if cid in seen:
                continue
            seen.add(cid)
            s = self._sessions.get(cid)
            if type(s) is not _WatchSession or not s.writable:
                continue
            try:
                frames = s.watch.poll()
            except Exception as e:  # noqa: BLE001
                code, message = status_of(e, "Watch")
                self._finish(s, code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)
                continue
            if frames is None:  # closed by the server (shutdown)
                self._finish(s, _OK, "OK", "")
                continue
            if frames:
                s.sent += len(frames)
                if not send(cid, frames):
                    s.writable = False

    def _renew(self, renewals: list) -> None:
        """Every LeaseKeepAlive request of the round in one engine call."""
        revision = self.engine.committed_rev  # etcd reads the header before renewing
        try:
            self.engine.lease_keepalive_many(
                [lid for _, lid in renewals],
                lambda out: self._on_dispatch_thread(self._renewed, renewals, revision, out))
        except Exception as e:  # noqa: BLE001
            self._renewed(renewals, revision, [(lid, e) for _, lid in renewals])

    def _renewed(self, renewals: list, revision: int, outcomes) -> None:
        per: dict = {}
        failed: dict = {}
        for (s, _), (lid, outcome) in zip(renewals, outcomes):
            s.outstanding -= 1
            if isinstance(outcome, BaseException):
                failed.setdefault(s, outcome)
            elif s not in failed:
                per.setdefault(s, []).append((lid, outcome))
        for s, items in per.items():
            if s.done:
                continue
            frames = self.lease_service.keepalive_responses(revision, items)
            s.sent += len(frames)
            self.transport.send(s.sid, frames)  # a full queue stops the transport reading it
        for s, exc in failed.items():
            if not s.done:
                code, message = status_of(exc, "LeaseKeepAlive")
                self._finish(s, code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)
        for s, _ in renewals:
            if s.half_closed and not s.outstanding and not s.done:
                self._finish(s, _OK, "OK", "")

    def _finish(self, s: _Session, code: int, code_name: str, message: str) -> None:
        if isinstance(s, _KeepAliveSession):
            if s.done:
                return
            s.done = True
        self.transport.finish(s.sid, code, message)
        if self._sessions.pop(s.sid, None) is not None:
            self._closed(s, code_name)

    def _closed(self, s: _Session, code_name: str) -> None:
        if s.unwatch is not None:
            s.unwatch()
            s.unwatch = None
        if isinstance(s, _WatchSession):
            s.watch.close()
        elif isinstance(s, _SubscribedStream):
            if s.cancel is not None:
                s.cancel()
        elif isinstance(s, _KeepAliveSession):
            s.done = True
        elif isinstance(s, _PooledStream):
            s.context.cancelled = True
            s.ready.set()
            return  # counted by its pool thread
        self.stats.on_handled(s.method.stats_key, code_name, s.received, s.sent)

    # -- the pool: rare unary calls, Snapshot, HTTP -----------------------------

    def _run_pooled(self, cid: int, m: Method, payload: bytes) -> None:
        try:
            data = m.call(payload, _PoolContext()).SerializeToString()
            self.stats.on_handled(m.stats_key, "OK", 1, 1)
            self.transport.respond(cid, data)
        except _Abort as a:
            self._fail(cid, m, a.code.value[0], GO_CODE_NAMES.get(a.code, "Unknown"), a.details)
        except Exception as e:  # noqa: BLE001
            self._fail_with(cid, m, e)
        finally:
            self._end(1)

    def _run_server_stream(self, s: _PooledStream, payload: bytes) -> None:
        m = s.method
        code, code_name, message = _OK, "OK", ""
        gen = None
        try:
            request = m.parse(payload)
            gen = m.call(request, s.context)
            for resp in gen:
                if s.context.cancelled:
                    code_name = "Canceled"
                    break
                s.sent += 1
                if not self.transport.send(s.sid, [resp.SerializeToString()]):
                    s.writable = False
                    while not s.writable and not s.context.cancelled:
                        s.ready.wait(1.0)
                        s.ready.clear()
        except DecodeError as e:
            code, code_name, message = _INTERNAL, "Internal", f"grpc: error unmarshalling request: {e}"
        except _Abort as a:
            code, code_name, message = a.code.value[0], GO_CODE_NAMES.get(a.code, "Unknown"), a.details
        except Exception as e:  # noqa: BLE001
            c, message = status_of(e, m.name)
            code, code_name = c.value[0], GO_CODE_NAMES.get(c, "Unknown")
        finally:
            if gen is not None:
                gen.close()
            if not s.context.cancelled:
                self.transport.finish(s.sid, code, message)
            self._sessions.pop(s.sid, None)
            if s.unwatch is not None:
                s.unwatch()
            self.stats.on_handled(m.stats_key, code_name, 1, s.sent)
            self._end(1)

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

    # -- bookkeeping ---------------------------------------------------------

    def _begin(self, n: int = 1) -> None:
        with self._inflight_lock:
            self._inflight += n

    def _end(self, n: int) -> None:
        with self._idle:
            self._inflight -= n
            if not self._inflight:
                self._idle.notify_all()

    def _fail_with(self, cid: int, m: Method, exc: BaseException) -> None:
        code, message = status_of(exc, m.name)
        self._fail(cid, m, code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)

    def _fail(self, cid: int, m: Method, code: int, code_name: str, message: str) -> None:
        self.stats.on_handled(m.stats_key, code_name, 1, 0)
        self.transport.fail(cid, code, message)


def front_methods(tables: list[ServiceTable], recv_limit: int) -> list[Method]:
    """The front's methods for the services' tables: the hot unary calls as
    steps, Watch and LeaseKeepAlive as event-driven sessions, health Watch
    as a subscription, Snapshot and the rare unary calls in the pool."""
    return [_method(table.service, rpc, recv_limit) for table in tables for rpc in table.rpcs]


def _method(service: str, rpc: Rpc, recv_limit: int) -> Method:
    if rpc.step is not None:
        return Method(service, rpc.name, request_cls=rpc.request, step=rpc.step, read=rpc.read)
    if rpc.session is not None:
        return Method(service, rpc.name, stream=rpc.session)
    if rpc.subscribe is not None:
        return Method(service, rpc.name, request_cls=rpc.request, subscribe=rpc.subscribe, encode=rpc.encode)
    if rpc.shape == SERVER_STREAM:
        return Method(service, rpc.name, request_cls=rpc.request, call=rpc.call, server_stream=True)
    # the request class too: a require-leader call refused without a leader is parsed first
    return Method(service, rpc.name, request_cls=rpc.request, call=call_on_bytes(rpc.call, rpc.request, recv_limit))


__all__ = ["Method", "NativeFront", "available", "check_tls", "front_methods", "unavailable_message"]
