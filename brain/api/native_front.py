"""The native front: every etcd RPC and etcd's HTTP endpoints, on brain's
own transport (brain._transport, Rust), for every listener kind.

Why it exists: a grpcio server spends about 190 us of CPU per call on
dispatch alone, three times what etcd spends on a whole durable Put, and
its TLS path costs more still (benchmarks/README.md).  The transport runs
sockets, TLS, HTTP/2 and gRPC framing on Rust threads outside the GIL and
hands everything to Python as events, in batches.  One dispatch thread
here takes a batch (a *round*) and

* answers serializable reads at once, at the committed revision;
* answers linearizable reads (Range, read-only Txn, LeaseTimeToLive,
  LeaseLeases) behind ONE ``engine.read_barrier`` per round: at once when
  it says so, else when its callback fires (a clustered replica);
* hands every write of the round to the engine in ONE ``submit_batch``, so
  they share one journal append and one fdatasync; the committer hands the
  outcomes back and this thread answers each call (``Deferred.finish``);
* hands stream events to their sessions (brain.api.native_sessions: Watch,
  LeaseKeepAlive with the round's renewals in ONE ``lease_keepalive_many``,
  the health Watch subscribed to the health service);
* passes rare calls (Maintenance, Cluster), generator-driven server streams
  (Snapshot, RangeStream) and HTTP requests (/health, /version, /metrics,
  ...) to a small thread pool (brain.api.native_pool);
* refuses a call or stream that carries etcd's ``hasleader`` metadata when
  there is no leader, and has the leader monitor end such a stream later.

Each unary call is a step (brain.api.unary) from its service's table
(brain.api.rpc_table), found by the transport's method id.  Failures end
with etcd's codes and texts (brain.api.status).
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

from brain.api.authz import PUBLIC
from brain.api.grpc_stats import BIDI_STREAM, SERVER_STREAM, UNARY, GrpcStats
from brain.api.inflight import InFlight
from brain.api.native_listeners import TlsFiles, reuse_port_socket
from brain.api.native_pool import Pool
from brain.api.native_sessions import Sessions
from brain.api.rpc_table import LINEARIZABLE, Rpc, ServiceTable
from brain.api.status import Status, fail_call, too_large, unparsable
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

SHUTTING_DOWN_STATUS = Status.of(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
NO_LEADER_STATUS = Status.of(grpc.StatusCode.UNAVAILABLE, ErrNoLeader.message)


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


def check_crl(data: bytes) -> int:
    """The serials a DER CRL revokes, counted as the transport reads it;
    ValueError for a CRL it cannot parse (brain.cli.preflight)."""
    return _transport.crl_revoked_count(data)


def check_tls(tls: TlsFiles) -> None:
    """Load the TLS files as a listener would; ValueError says what is wrong."""
    _transport.check_tls(tls.args)


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
                 "stats_key", "guard", "decode")

    def __init__(self, service: str, name: str, *, request_cls=None, step=None, call=None, stream=None,
                 server_stream=False, read=None, subscribe=None, encode=None, guard=None, decode=None) -> None:
        self.path = f"/{service}/{name}"
        self.name = name
        self.parse = request_cls.FromString if request_cls is not None else None
        self.step = step
        self.call = call
        self.stream = stream
        self.read = read
        self.subscribe = subscribe  # with encode(item) -> bytes for what it sends
        self.encode = encode
        self.guard = guard  # a step's auth check (brain.api.rpc_table)
        self.decode = decode  # the step's native reader of its request (Rpc.decode)
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


class _Round:
    """What one batch of events gathers before it is answered: replies for
    one respond_many, writes for one submit_batch, linearizable reads for
    one read barrier, and the calls started and answered per method."""

    __slots__ = ("replies", "writes", "reads", "started", "answered")

    def __init__(self) -> None:
        self.replies: list = []  # (id, response bytes)
        self.writes: list = []  # (id, Method, Deferred)
        self.reads: list = []  # (id, Method, request, who: the event's caller item)
        self.started: dict = {}
        self.answered: dict = {}


class NativeFront:
    """Serves ``methods`` (and, when ``http`` is given, etcd's HTTP
    endpoints) on any number of listeners through one transport."""

    def __init__(self, engine, methods: list[Method], *, recv_limit: int, stats: GrpcStats,
                 pool: futures.Executor, http=None, watch_service=None, lease_service=None, leader_monitor=None,
                 keepalive_time_ms: int, keepalive_timeout_ms: int, keepalive_min_time_ms: int = 5000,
                 send_queue_bytes: int = 4 << 20, max_concurrent_streams: int = 2**32 - 1,
                 max_connections: int | None = None, max_connection_bytes: int | None = None,
                 transport=None, gate=None) -> None:
        if _transport is None:
            raise RuntimeError(unavailable_message())
        self.engine = engine
        self.gate = gate  # brain.api.authz.Gate: who calls, while auth is on
        self.methods = methods
        self.recv_limit = recv_limit
        self.stats = stats
        self.leader_monitor = leader_monitor  # brain.api.require_leader.LeaderMonitor
        # ``transport``: a stand-in with brain._transport.Transport's face
        # (events out, answers in) serves the front without sockets
        # (tests/fuzz drives it so); by default a new Transport.
        if transport is None:
            transport = _transport.Transport(
                [(m.path, m.kind) for m in methods], io_threads=io_threads(),
                # over the limit the transport passes the length, not the body
                max_recv_bytes=recv_limit, send_queue_bytes=send_queue_bytes,
                keepalive_interval_ms=keepalive_time_ms, keepalive_timeout_ms=keepalive_timeout_ms,
                keepalive_min_time_ms=keepalive_min_time_ms, max_concurrent_streams=max_concurrent_streams,
                # None: no limit (a raw front in tests); brain serve passes its flags'
                max_connections=max_connections if max_connections is not None else 2**63 - 1,
                max_connection_bytes=max_connection_bytes if max_connection_bytes is not None else 2**60)
        self.transport = transport
        self.inflight = InFlight()
        self.sessions = Sessions(self.transport, stats, engine=engine, watch_service=watch_service,
                                 lease_service=lease_service, on_dispatch_thread=self._on_dispatch_thread, gate=gate)
        self.pool = Pool(pool, self.transport, stats, self.sessions, self.inflight, http)
        self._later: deque = deque()  # engine callbacks to finish on the dispatch thread
        self._dispatch_ident = 0
        self._thread: threading.Thread | None = None
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
        # The grace is for calls that end on their own: streams that never
        # do (health Watch) end now, on the dispatch thread, which owns the
        # sessions (they were told NOT_SERVING already).
        self._run_on_dispatch(self.sessions.stop, SHUTTING_DOWN_STATUS)
        self.inflight.wait(grace)
        if grace:
            time.sleep(0.05)  # let the I/O thread write the last answers
        self.transport.close()
        if self._thread is not None:
            self._thread.join(5)
        self.sessions.release_all()

    def transport_stats(self) -> dict:
        return self.transport.stats()

    # -- the dispatch thread -------------------------------------------------

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
        sessions = self.sessions
        while (events := t.recv_batch(BATCH_EVENTS)) is not None:
            try:
                if events:
                    self._round(events)
                sessions.wake_pending = False
                while self._later:
                    fn, args = self._later.popleft()
                    fn(*args)
                sessions.pump()
            except Exception:  # noqa: BLE001 - the dispatch thread must survive a bug
                log.exception("front dispatch round failed")

    def _round(self, events) -> None:
        T = _transport
        EV_CALL, EV_OPEN, EV_MESSAGE = T.EV_CALL, T.EV_OPEN, T.EV_MESSAGE
        FLAGGED = T.REQUIRE_LEADER | T.AUTH_TOKEN
        methods = self.methods
        sessions = self.sessions.by_id
        r = _Round()
        for kind, cid, mid, payload, last in events:
            if kind == EV_CALL:
                self._call(r, cid, methods[mid], payload, last)
            elif kind == EV_MESSAGE:
                s = sessions.get(cid)
                if s is not None:
                    s.received += 1
                    s.on_message(payload)
            elif kind == EV_OPEN:
                self._open(cid, methods[mid], last)
            elif kind & FLAGGED:  # after the common kinds: calls without flags pay nothing
                self._flagged(r, kind, cid, methods[mid], payload, last)
            else:
                self._other(kind, cid, mid, payload, last)
        self._answer(r)

    def _flagged(self, r: _Round, kind: int, cid: int, m: Method, payload, who) -> None:
        """A call or stream with require-leader metadata or an auth token
        (``who`` is then (common name, token))."""
        T = _transport
        base = kind & ~(T.REQUIRE_LEADER | T.AUTH_TOKEN)
        if kind & T.REQUIRE_LEADER:
            self._require_leader(r, base, cid, m, payload, who)
        elif base == T.EV_CALL:
            self._call(r, cid, m, payload, who)
        else:
            self._open(cid, m, who)

    def _run_step(self, m: Method, request, who):
        """The step's outcome: checked for the caller while auth is on
        (brain.api.authz), else as it is."""
        gate = self.gate
        if gate is not None and gate.enabled and m.guard is not PUBLIC:
            return gate.step(m.step, m.guard, request, gate.caller_of(who))
        return m.step(request)

    def _call(self, r: _Round, cid: int, m: Method, payload: bytes, who=None) -> None:
        """A call: a step's answer, write or linearizable read joins the
        round; anything else starts here.  ``who``: the event's caller item
        (the client certificate's common name, or it and an auth token)."""
        r.started[m.stats_key] = r.started.get(m.stats_key, 0) + 1
        if self._stopping:
            self._fail(cid, m, SHUTTING_DOWN_STATUS)
        elif m.subscribe is not None:
            self.sessions.subscribe(cid, m, payload)
        elif m.step is None:
            if m.kind == _transport.KIND_SERVER_STREAM:
                self.pool.server_stream(cid, m, payload, who)
            else:
                self.pool.unary(cid, m, payload, who)
        else:
            try:
                request = m.decode(payload) if m.decode is not None else None
                if request is None:
                    request = m.parse(payload)
            except DecodeError as e:
                self._fail(cid, m, Status.of(*unparsable(e)))
                return
            try:
                if m.read is not None and m.read(request) == LINEARIZABLE:
                    r.reads.append((cid, m, request, who))
                    return
                out = self._run_step(m, request, who)
                if type(out) is Deferred:
                    r.writes.append((cid, m, out))
                    return
                r.replies.append((cid, out.SerializeToString()))
                r.answered[m.stats_key] = r.answered.get(m.stats_key, 0) + 1
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                self._fail(cid, m, Status.of_error(e, m.name))

    def _answer(self, r: _Round) -> None:
        """The round's calls, answered or handed on, once every event is in."""
        stats = self.stats
        # Counted before anything is answered: a client that has its answer
        # sees its call in the metrics.
        for key, n in r.started.items():
            stats.on_start(key, n)
        if r.writes:
            self._submit(r.writes)
        if r.reads:
            self._read_barrier(r.reads, r.replies)
        for key, n in r.answered.items():
            stats.on_handled(key, "OK", n, n, calls=n)
        if r.replies:
            self.transport.respond_many(r.replies)
        if self.sessions.renewals:
            self.sessions.renew()

    def _open(self, cid: int, m: Method, who=None) -> None:
        self.stats.on_start(m.stats_key)
        if self._stopping:
            self.transport.finish(cid, SHUTTING_DOWN_STATUS.code, SHUTTING_DOWN)
            self.stats.on_handled(m.stats_key, SHUTTING_DOWN_STATUS.name)
            return
        self.sessions.open(cid, m, who)

    def _other(self, kind, cid, mid, payload, last) -> None:
        T = _transport
        if kind == T.EV_WRITABLE:
            s = self.sessions.get(cid)
            if s is not None:
                s.on_writable()
        elif kind == T.EV_HALF_CLOSED:
            s = self.sessions.get(cid)
            if s is not None:
                s.on_half_close()
        elif kind == T.EV_CANCELLED:
            s = self.sessions.pop(cid)
            if s is not None:
                s.on_cancel()
        elif kind == T.EV_OVERSIZED:
            m = self.methods[mid]
            status = Status.of(*too_large(payload, self.recv_limit))
            s = self.sessions.get(cid)
            if s is not None:
                s.finish(status)
            else:
                self.stats.on_start(m.stats_key)
                self._fail(cid, m, status)
        elif kind == T.EV_HTTP:
            self.pool.http_request(cid, mid, payload)
        elif kind == T.EV_REJECTED:
            # etcd's line for a refused connection (its embed/config_logging.go): a
            # warning, or debug for a peer that closed or never spoke (cid 1); the
            # client certificate's names when it was read and then refused
            error, ips, dns = last
            fields = {"remote-addr": mid, "server-name": payload}
            if ips is not None:
                fields.update({"ip-addresses": ips, "dns-names": dns})
            fields["error"] = error
            log.log(logging.DEBUG if cid else logging.WARNING, "rejected connection on client endpoint",
                    extra={"fields": fields})

    # -- require-leader (brain.api.require_leader) ----------------------------

    def _require_leader(self, r: _Round, kind: int, cid: int, m: Method, payload, who=None) -> None:
        """A call or stream opened with ``hasleader: true`` (``kind``
        without the flag): refused without a leader; else served in its
        place in the round (a stream's messages later in the batch find its
        session), and a stream is watched by the monitor."""
        if not self.engine.has_leader:
            self._refuse_no_leader(kind, cid, m, payload)
            return
        if kind == _transport.EV_CALL:
            self._call(r, cid, m, payload, who)
        else:
            self._open(cid, m, who)
        s = self.sessions.get(cid)
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
                self._fail(cid, m, Status.of(*unparsable(e)))
                return
        self._fail(cid, m, NO_LEADER_STATUS)

    def _end_no_leader(self, cid: int) -> None:
        s = self.sessions.get(cid)
        if s is not None:
            s.unwatch = None  # the monitor has let go of it already
            s.finish(NO_LEADER_STATUS)

    # -- reads -------------------------------------------------------------

    def _read_barrier(self, reads: list, replies: list) -> None:
        """One barrier for every linearizable read of the round; answers
        go to ``replies`` when it passes at once."""
        self.inflight.begin(len(reads))
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
            for cid, m, request, who in reads:
                if exc is not None:
                    self._fail(cid, m, Status.of_error(exc, m.name))
                    continue
                try:
                    out.append((cid, self._run_step(m, request, who).SerializeToString()))
                    ok[m.stats_key] = ok.get(m.stats_key, 0) + 1
                except Exception as e:  # noqa: BLE001
                    self._fail(cid, m, Status.of_error(e, m.name))
            for key, n in ok.items():
                self.stats.on_handled(key, "OK", n, n, calls=n)
            if replies is None and out:
                self.transport.respond_many(out)
        finally:
            if waited:
                self.inflight.end(len(reads))

    # -- writes ------------------------------------------------------------

    def _submit(self, writes: list) -> None:
        self.inflight.begin(len(writes))
        try:
            # a replica's follower forwards its clients' bytes; one node never does
            wires = [w[2].wire for w in writes] if self.engine.cluster is not None else None
            self.engine.submit_batch([w[2].request for w in writes], self._completer(writes), wires=wires)
        except Exception as e:  # noqa: BLE001
            for cid, m, _ in writes:
                self._fail(cid, m, Status.of_error(e, m.name))
            self.inflight.end(len(writes))

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
                    self._fail(cid, m, Status.of_error(exc, m.name))
                for key, n in ok.items():
                    stats.on_handled(key, "OK", n, n, calls=n)
                ok = {}
                if replies:
                    respond_many(replies)  # the GIL is released while they are written
            finally:
                for key, n in ok.items():  # only if answering failed midway
                    stats.on_handled(key, "OK", n, n, calls=n)
                self.inflight.end(len(items))

        return settled

    def _fail(self, cid: int, m: Method, status: Status) -> None:
        fail_call(self.transport, self.stats, cid, m.stats_key, status)


def front_methods(tables: list[ServiceTable], recv_limit: int) -> list[Method]:
    """The front's methods for the services' tables: the hot unary calls as
    steps, Watch and LeaseKeepAlive as event-driven sessions, health Watch
    as a subscription, Snapshot and the rare unary calls in the pool."""
    return [_method(table.service, rpc, recv_limit) for table in tables for rpc in table.rpcs]


def _method(service: str, rpc: Rpc, recv_limit: int) -> Method:
    if rpc.step is not None:
        return Method(service, rpc.name, request_cls=rpc.request, step=rpc.step, read=rpc.read, guard=rpc.guard,
                      decode=rpc.decode)
    if rpc.session is not None:
        return Method(service, rpc.name, stream=rpc.session)
    if rpc.subscribe is not None:
        return Method(service, rpc.name, request_cls=rpc.request, subscribe=rpc.subscribe, encode=rpc.encode)
    if rpc.shape == SERVER_STREAM:
        return Method(service, rpc.name, request_cls=rpc.request, call=rpc.call, server_stream=True)
    # the request class too: a require-leader call refused without a leader is parsed first
    return Method(service, rpc.name, request_cls=rpc.request, call=call_on_bytes(rpc.call, rpc.request, recv_limit))


__all__ = ["Method", "NativeFront", "available", "check_tls", "front_methods", "unavailable_message"]
