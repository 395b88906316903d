"""One connection to a NATS cluster, for threaded callers.

nats-py speaks asyncio; brain's engine is threads (a committer, reader
threads, the transport's dispatch thread).  ``NatsConnection`` runs one
event loop on a daemon thread, connects there, and lets any thread run a
coroutine on it (``run`` blocks for the result, ``submit`` returns a
concurrent.futures.Future).  Everything NATS-related in brain (the
replicated journal, the election, membership, forwarding) shares one
connection per process: one TCP session, one reconnect policy.

The client reconnects forever (to any server of the cluster it learned);
while it is disconnected requests fail fast, and callers decide (the
journal retries its appends, reads fail with a timeout).  A request in
flight when the connection drops fails at once (``request``): its answer
would have come on the dropped connection, so waiting out its timeout
only delays the retry.  A server entering lame duck mode (a planned
restart: ``nats-server --signal ldm``) tells its clients so; this
connection moves to another server right away instead of waiting for the
lame duck server to close it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Coroutine
from urllib.parse import urlsplit

log = logging.getLogger("brain.journal.nats")

CONNECT_TIMEOUT = 5.0



ERR_NO_SUITABLE_PEERS = 10005  # JetStream: a stream cannot be placed yet (a peer offline)
ERR_TEMPORARILY_UNAVAILABLE = 10008  # JetStream: the meta layer has no leader for the moment
RETRYABLE_API_ERRORS = frozenset({ERR_NO_SUITABLE_PEERS, ERR_TEMPORARILY_UNAVAILABLE})
STARTUP_WAIT = 30.0  # how long a starting replica waits for a just-formed NATS cluster's JetStream


async def when_answering(call, what: str, wait: float = STARTUP_WAIT, *, pause: float = 0.25) -> Any:
    """``await call()``, retried for up to ``wait`` seconds while JetStream
    gives no answer: a NATS cluster that has just formed (or whose links were
    just restored) may not have placed a stream, elected its leader or made
    its interest known to this server ("no responders", timeouts) for some
    seconds after it was created."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import APIError, NoStreamResponseError

    deadline = time.monotonic() + wait
    while True:
        try:
            return await call()
        except (NoStreamResponseError, NoRespondersError, NatsTimeout, APIError) as e:
            # 10005 "no suitable peers for placement, peer offline": a peer of
            # the just-formed cluster has not reported in yet; 10008 "JetStream
            # system temporarily unavailable": the servers are electing a meta
            # leader (a server stopped, a partition healing)
            # (getattr: nats-py's own errors such as KeyNotFoundError are
            # APIErrors built without the fields a server's answer has)
            if isinstance(e, APIError) and getattr(e, "err_code", None) not in RETRYABLE_API_ERRORS:
                raise
            if time.monotonic() >= deadline:
                raise
            log.info("%s: JetStream not answering yet (%r); retrying", what, e)
            await asyncio.sleep(pause)

class NatsUnavailable(RuntimeError):
    """No NATS server of the given URLs could be reached."""


class NatsClientMissing(RuntimeError):
    """nats-py, the NATS client, cannot be imported (a broken install)."""


def import_nats():
    """The nats package, or NatsClientMissing saying, on one line, how to
    get it: it is one of brain's dependencies, so only an install that
    skipped them (or a damaged one) lacks it."""
    try:
        import nats
    except ImportError as e:
        raise NatsClientMissing(
            f"--journal-url needs the NATS client nats-py, which cannot be imported ({e}); install it "
            f"into brain's environment with `pip install 'nats-py>=2.16,<3'`, or reinstall brain, "
            f"which depends on it") from None
    return nats


def parse_journal_url(url: str) -> tuple[list[str], str]:
    """``nats://h1:4222,h2:4222,h3:4222/name`` -> (server URLs, cluster name).

    The name (default ``brain``) prefixes every stream, bucket and subject
    brain creates, so several brain clusters can share one NATS cluster.
    Schemes: nats:// and tls:// (NATS's TLS)."""
    raw = url.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme not in ("nats", "tls"):
        raise ValueError(f"--journal-url must look like nats://host:4222[,host:4222...][/name], got {url!r}")
    hosts, _, path = rest.partition("/")
    name = path.strip("/") or "brain"
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--journal-url: the cluster name {name!r} may only hold letters, digits, '-' and '_'")
    servers = []
    for host in hosts.split(","):
        host = host.strip()
        if not host:
            continue
        parts = urlsplit(f"{scheme}://{host}")
        if not parts.hostname:
            raise ValueError(f"--journal-url: bad server address {host!r}")
        servers.append(f"{scheme}://{parts.hostname}:{parts.port or 4222}")
    if not servers:
        raise ValueError(f"--journal-url names no server: {url!r}")
    return servers, name


class NatsConnection:
    """A NATS connection driven by an event loop on its own thread."""

    def __init__(self, servers: list[str], *, name: str = "brain", connect_timeout: float = CONNECT_TIMEOUT,
                 tls=None) -> None:
        self.servers = list(servers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="brain-nats", daemon=True)
        self._thread.start()
        self.nc = None
        self.js = None
        self._closed = False
        self.disconnects = 0
        self.reconnects = 0
        # resolved when the current connection drops, then replaced (on the
        # loop): what a request in flight waits on beside its answer
        self._dropped: asyncio.Future | None = None
        try:
            self.run(self._connect(name, connect_timeout, tls), timeout=connect_timeout + 5)
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self, name: str, connect_timeout: float, tls) -> None:
        nats = import_nats()

        async def disconnected() -> None:
            self.disconnects += 1
            self._drop_in_flight()
            log.warning("disconnected from NATS")

        async def lame_duck() -> None:
            server = self.nc.connected_url.netloc if self.nc.connected_url else "?"
            log.info("NATS server %s entered lame duck mode; moving to another server", server)
            await self.nc.force_reconnect()

        async def reconnected() -> None:
            self.reconnects += 1
            log.info("reconnected to NATS at %s", self.nc.connected_url.netloc if self.nc.connected_url else "?")

        async def error(e: Exception) -> None:
            log.debug("NATS client error: %r", e)

        try:
            self.nc = await nats.connect(
                servers=self.servers, name=name, connect_timeout=connect_timeout,
                allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                ping_interval=5, max_outstanding_pings=2, tls=tls,
                disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error,
                lame_duck_mode_cb=lame_duck,
                pending_size=64 * 1024 * 1024,
            )
        except Exception as e:  # noqa: BLE001 - one clear message for every way it fails
            raise NatsUnavailable(f"cannot connect to NATS at {', '.join(self.servers)}: {e!r}") from None
        self.js = self.nc.jetstream(timeout=connect_timeout)
        self._dropped = self._loop.create_future()

    def _drop_in_flight(self) -> None:
        """(on the loop) The connection dropped: fail the requests waiting."""
        if self._dropped is not None and not self._dropped.done():
            self._dropped.set_result(None)
        self._dropped = self._loop.create_future()

    async def request(self, subject: str, data: bytes, *, timeout: float, headers: dict | None = None):
        """(on the loop) ``nc.request``, except that when the connection it
        was sent on drops it raises ``nats.errors.TimeoutError`` at once,
        instead of after waiting ``timeout`` for an answer that cannot come
        (callers handle it as the timeout it would have become)."""
        from nats.errors import TimeoutError as NatsTimeout

        dropped = self._dropped
        answer = asyncio.ensure_future(self.nc.request(subject, data, timeout=timeout, headers=headers))
        await asyncio.wait((answer, dropped), return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        answer.cancel()
        raise NatsTimeout

    def start_request(self, subject: str, data: bytes, *, timeout: float) -> tuple[asyncio.Task, asyncio.Future]:
        """(on the loop) ``nc.request`` started as a task, and the future
        that completes when the connection it was sent on drops: a caller
        that keeps many requests in flight watches them all at once instead
        of awaiting each (``request`` does both for one)."""
        return self._loop.create_task(self.nc.request(subject, data, timeout=timeout)), self._dropped

    @classmethod
    def connect_retrying(cls, servers: list[str], *, name: str = "brain", wait: float = 60.0,
                         stop: threading.Event | None = None) -> "NatsConnection":
        """Connect, retrying for up to ``wait`` seconds (a replica may start
        before its NATS servers)."""
        deadline = time.monotonic() + wait
        delay = 0.2
        while True:
            try:
                return cls(servers, name=name)
            except NatsUnavailable as e:
                if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    raise
                log.warning("%s; retrying", e)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- running coroutines ---------------------------------------------

    def submit(self, coro: Coroutine) -> Future:
        """Run ``coro`` on the connection's loop; a Future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """Run ``coro`` on the connection's loop and wait for its result."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise

    def subscribe(self, subject: str, cb, *, queue: str = "", timeout: float = 10.0):
        """A subscription whose ``cb(msg)`` coroutine runs on the loop; no
        pending limit (a listener that falls behind queues, it never drops)."""

        async def sub():
            return await self.nc.subscribe(subject, queue=queue, cb=cb, pending_msgs_limit=-1,
                                           pending_bytes_limit=-1)

        return self.run(sub(), timeout)

    def unsubscribe(self, sub, timeout: float = 5.0) -> None:
        """End a subscription (quietly: the connection may be gone)."""
        if sub is None:
            return
        try:
            self.run(sub.unsubscribe(), timeout)
        except Exception:  # noqa: BLE001
            pass

    def call_soon(self, fn, *args) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload if self.nc is not None else 1 << 20

    @property
    def is_connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def discovered_servers(self) -> list[str]:
        """Client URLs of every server of the NATS cluster this connection
        learned of (the configured ones and those the servers announced)."""
        if self.nc is None:
            return list(self.servers)
        return sorted({f"{s.uri.hostname}:{s.uri.port}" for s in self.nc._server_pool})

    # -- closing ------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.nc is not None:
            try:
                self.run(self.nc.close(), timeout=5)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
