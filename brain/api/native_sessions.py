"""The native front's streams: one session per stream, keyed by the
transport's id, each kind handling its own events.

No thread per stream.  The dispatch thread (brain.api.native_front) hands a
session what the transport reports about its stream, and the session's kind
decides what it means:

* ``on_message``: a request message (Watch: a create, cancel or progress
  request; LeaseKeepAlive: a renewal, batched with the round's others);
* ``on_half_close``: the client sends no more (LeaseKeepAlive ends once its
  renewals are answered; every other stream goes on, as with etcd);
* ``on_writable``: the stream's send queue went back under its limit (a
  Watch is polled again; a pooled server stream's thread goes on);
* ``on_cancel``: the client went away;
* ``on_stop``: the server is stopping (a health Watch ends now: it never
  ends on its own and must not hold the grace period open).

Kinds: ``WatchSession`` (brain.api.watch's WatchStream, polled when the hub
says it has responses), ``KeepAliveSession``, ``Subscription`` (a health
Watch, fed by the health service from whichever thread has news) and, in
brain.api.native_pool, ``PooledStream`` (a server stream a pool thread runs).
Sessions are touched only on the dispatch thread, but for ``schedule``.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from google.protobuf.message import DecodeError

from brain.api.status import OK, Status, fail_call, unparsable


class Session:
    """A stream the front serves: its transport id and method, what it
    counts for the metrics, and ``unwatch``, which unregisters a
    require-leader stream from the leader monitor."""

    __slots__ = ("sessions", "sid", "method", "writable", "received", "sent", "unwatch")

    def __init__(self, sessions: Sessions, sid: int, method) -> None:
        self.sessions = sessions
        self.sid = sid
        self.method = method  # a brain.api.native_front.Method
        self.writable = True
        self.received = 0
        self.sent = 0
        self.unwatch: Callable[[], None] | None = None

    def on_message(self, payload: bytes) -> None:
        """A request message (counted already); a server stream gets none."""

    def on_half_close(self) -> None:
        """The client sends no more; the stream goes on."""

    def on_writable(self) -> None:
        self.writable = True

    def on_cancel(self) -> None:
        """The client went away (the session is out of the registry)."""
        self.ended("Canceled")

    def on_stop(self, status: Status) -> None:
        """The server is stopping; most streams end with the transport."""

    def finish(self, status: Status) -> None:
        """End the stream with ``status``, after what is queued on it."""
        sessions = self.sessions
        sessions.transport.finish(self.sid, status.code, status.message)
        if sessions.by_id.pop(self.sid, None) is not None:
            self.ended(status.name)

    def ended(self, code_name: str) -> None:
        """The stream is over (finished or cancelled): let go of what it
        holds and count it as handled with ``code_name``."""
        self.let_go()
        self.sessions.stats.on_handled(self.method.stats_key, code_name, self.received, self.sent)

    def let_go(self) -> None:
        """Leave the leader monitor; release what the kind holds."""
        if self.unwatch is not None:
            self.unwatch()
            self.unwatch = None
        self.release()

    def release(self) -> None:
        """What the kind lets go of when the stream ends (or the front closes)."""


class WatchSession(Session):
    """etcd's Watch: requests go to the engine's stream handle at once;
    responses are polled from it when the hub says it has some, as many as
    the transport's queue has room for, and not while the transport reports
    that queue full: the stream is paused in the hub meanwhile (its
    watchers are routed nothing, and catch up from history once it may
    send again)."""

    __slots__ = ("watch",)

    def __init__(self, sessions: Sessions, sid: int, method, watch) -> None:
        super().__init__(sessions, sid, method)
        self.watch = watch  # a brain.api.watch.WatchStream

    def on_message(self, payload: bytes) -> None:
        try:
            self.watch.on_message(payload)
        except DecodeError as e:
            self.finish(Status.of(*unparsable(e)))
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            self.finish(Status.of_error(e, "Watch"))

    def on_writable(self) -> None:
        self.writable = True
        self.watch.pause(False)
        self.sessions.ready.append(self.sid)

    def poll(self) -> None:
        """Send the responses ready now, as many as the send queue has room
        for, unless it is full."""
        if not self.writable:
            return
        transport = self.sessions.transport
        try:
            frames = self.watch.poll(transport.room(self.sid))
        except Exception as e:  # noqa: BLE001
            self.finish(Status.of_error(e, "Watch"))
            return
        if frames is None:  # closed by the server (shutdown)
            self.finish(OK)
            return
        if frames:
            self.sent += len(frames)
            if not transport.send(self.sid, frames):
                self.writable = False
                self.watch.pause(True)
            elif self.watch.pending():  # room was left after all: the rest in the next round
                self.sessions.schedule(self.sid)

    def release(self) -> None:
        self.watch.close()


class KeepAliveSession(Session):
    """etcd's LeaseKeepAlive: each request renews a lease, answered in
    order; the stream ends when the client half-closes and every renewal it
    asked for has been answered.  While auth is on each renewal is checked
    for the stream's caller (``who``) first; a refusal ends the stream."""

    __slots__ = ("outstanding", "half_closed", "done", "who")

    def __init__(self, sessions: Sessions, sid: int, method, who=None) -> None:
        super().__init__(sessions, sid, method)
        self.outstanding = 0
        self.half_closed = False
        self.done = False
        self.who = who

    def on_message(self, payload: bytes) -> None:
        try:
            lease_id = self.sessions.lease_service.parse_keepalive(payload)
        except DecodeError as e:
            self.finish(Status.of(*unparsable(e)))
            return
        gate = self.sessions.gate
        if gate is not None and gate.enabled:
            try:
                gate.check_renew(gate.caller_of(self.who), lease_id)
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                self.finish(Status.of_error(e, "LeaseKeepAlive"))
                return
        self.sessions.renewals.append((self, lease_id))
        # counted now: a half-close later in this batch must not end the
        # stream before this renewal is answered
        self.outstanding += 1

    def on_half_close(self) -> None:
        self.half_closed = True
        if not self.outstanding:
            self.finish(OK)

    def end_if_done(self) -> None:
        if self.half_closed and not self.outstanding and not self.done:
            self.finish(OK)

    def finish(self, status: Status) -> None:
        if self.done:
            return
        self.done = True
        super().finish(status)

    def release(self) -> None:
        self.done = True


class Subscription(Session):
    """A server stream fed by a subscription (the health Watch): the
    service sends each message itself, from whichever thread has news
    (the transport's send takes any thread)."""

    __slots__ = ("cancel",)

    def __init__(self, sessions: Sessions, sid: int, method) -> None:
        super().__init__(sessions, sid, method)
        self.cancel: Callable[[], None] | None = None

    def on_stop(self, status: Status) -> None:
        self.finish(status)

    def release(self) -> None:
        if self.cancel is not None:
            self.cancel()


class Sessions:
    """The open streams of one front, by the transport's id, and what their
    kinds share: the watch streams to poll, the round's renewals."""

    def __init__(self, transport, stats, *, engine=None, watch_service=None, lease_service=None,
                 on_dispatch_thread: Callable | None = None, gate=None) -> None:
        self.transport = transport
        self.gate = gate  # brain.api.authz.Gate: keep-alives checked while auth is on
        self.stats = stats
        self.engine = engine
        self.watch_service = watch_service
        self.lease_service = lease_service
        self.on_dispatch_thread = on_dispatch_thread  # runs an engine callback's answer on that thread
        self.by_id: dict[int, Session] = {}
        self.ready: deque[int] = deque()  # watch streams with responses to poll
        self.wake_pending = False
        self.renewals: list[tuple[KeepAliveSession, int]] = []  # this round's, in order

    def get(self, sid: int) -> Session | None:
        return self.by_id.get(sid)

    def pop(self, sid: int) -> Session | None:
        return self.by_id.pop(sid, None)

    def add(self, s: Session) -> Session:
        self.by_id[s.sid] = s
        return s

    def open(self, sid: int, method, who=None) -> None:
        """A bidirectional stream began: a session of its kind (``who``: its
        caller item, for the auth checks of what it asks)."""
        if method.stream == "watch":
            self.add(WatchSession(self, sid, method,
                                  self.watch_service.open_stream(lambda: self.schedule(sid), who)))
        elif method.stream == "keepalive":
            self.add(KeepAliveSession(self, sid, method, who))
        else:  # pragma: no cover - a method table bug
            raise ValueError(f"unknown stream kind {method.stream!r}")

    def subscribe(self, sid: int, method, payload: bytes) -> None:
        """A subscribed stream: its first message is sent now, the others
        by the service as they happen.  Not counted in flight: like Watch,
        it must not hold up a shutdown."""
        try:
            request = method.parse(payload)
        except DecodeError as e:
            fail_call(self.transport, self.stats, sid, method.stats_key, Status.of(*unparsable(e)))
            return
        s = self.add(Subscription(self, sid, method))
        send, encode = self.transport.send, method.encode

        def deliver(item) -> None:
            s.sent += 1
            send(sid, [encode(item)])  # tiny and rare: a full queue still keeps them

        s.received = 1
        s.cancel = method.subscribe(request, deliver)

    def stop(self, status: Status) -> None:
        """The server is stopping: streams that would hold the grace open end now."""
        for s in list(self.by_id.values()):
            s.on_stop(status)

    def release_all(self) -> None:
        """The transport is closed: let go of every stream, uncounted."""
        for s in list(self.by_id.values()):
            s.release()
        self.by_id.clear()

    # -- watch streams: polled when the hub has responses --------------------

    def schedule(self, sid: int) -> None:
        """The hub has responses for stream ``sid`` (hub lock held, any
        thread): poll it on the dispatch thread."""
        self.ready.append(sid)
        if not self.wake_pending:
            self.wake_pending = True
            self.transport.wake()

    def pump(self) -> None:
        """Poll every watch stream that has responses and may send."""
        ready = self.ready
        seen = set()
        # Only what is queued now: a stream scheduled again while this runs
        # (the hub routed more) stays queued for the next round, which its
        # wake() guarantees; dropping it as a duplicate would lose events.
        for _ in range(len(ready)):
            sid = ready.popleft()
            if sid in seen:
                continue
            seen.add(sid)
            s = self.by_id.get(sid)
            if s is not None:
                s.poll()

    # -- LeaseKeepAlive: every renewal of a round in one engine call ---------

    def renew(self) -> None:
        """Renew the leases the round's LeaseKeepAlive messages asked for."""
        renewals, self.renewals = self.renewals, []
        engine = self.engine
        revision = engine.committed_rev  # etcd reads the header before renewing
        try:
            engine.lease_keepalive_many(
                [lease_id for _, lease_id in renewals],
                lambda out: self.on_dispatch_thread(self.renewed, renewals, revision, out))
        except Exception as e:  # noqa: BLE001
            self.renewed(renewals, revision, [(lease_id, e) for _, lease_id in renewals])

    def renewed(self, renewals: list, revision: int, outcomes) -> None:
        per: dict = {}
        failed: dict = {}
        for (s, _), (lease_id, outcome) in zip(renewals, outcomes):
            s.outstanding -= 1
            if isinstance(outcome, BaseException):
                failed.setdefault(s, outcome)
            elif s not in failed:
                per.setdefault(s, []).append((lease_id, outcome))
        for s, items in per.items():
            if s.done:
                continue
            frames = self.lease_service.keepalive_responses(revision, items)
            s.sent += len(frames)
            self.transport.send(s.sid, frames)  # a full queue stops the transport reading it
        for s, exc in failed.items():
            if not s.done:
                s.finish(Status.of_error(exc, "LeaseKeepAlive"))
        for s, _ in renewals:
            s.end_if_done()


__all__ = ["KeepAliveSession", "Session", "Sessions", "Subscription", "WatchSession"]
