"""The Python side of the native front, fed a client's request bytes.

``FrontTarget`` runs the real front (brain.api.native_front.NativeFront:
its dispatch thread, sessions and pool) over a real engine in a temporary
data directory and every service brain serves (KV, Watch, Lease,
Maintenance, Cluster, grpc.health.v1), on a stand-in transport: events go
in as the Rust transport would hand them over, and what the front answers
is recorded instead of written to a socket.  ``run(data)`` is one input:

    data = [selector][payload...]

The selector's low bits pick the method (``methods`` below: every method
the front serves, by path); its top bit sends the call with etcd's
``hasleader`` metadata.  A unary or server-streaming call gets the payload
as its request message; a bidirectional stream (Watch, LeaseKeepAlive)
gets it as messages, each ``[u8 length][bytes]``, is half-closed, and
cancelled at the end.

What must hold, else ``Defect`` is raised (the fuzzer's crash):

* every call ends, within ``DEADLINE`` seconds: with a response that parses
  as the method's response message, or with a status etcd sends (etcd's
  codes and texts, grpc-go's for a request it cannot parse): never brain's
  UNKNOWN "internal error" that any other exception becomes;
* nothing is logged at ERROR (a failed dispatch round, a session's
  unexpected exception);
* once the input is over, no session, call or stream is left open.

tests/fuzz/atheris_api.py fuzzes ``run`` (coverage-guided, atheris);
tests/fuzz/test_api_fuzz.py replays the checked-in corpus through it.
"""

from __future__ import annotations

import importlib
import logging
import shutil
import tempfile
import threading
from collections import deque
from concurrent import futures

from brain.api import native_front
from brain.api.grpc_stats import GrpcStats
from brain.api.health import HealthService
from brain.api.kv import KVService
from brain.api.lease import LeaseService
from brain.api.maintenance import MaintenanceService
from brain.api.membership import ClusterService
from brain.api.watch import WatchService
from brain.engine import Engine, EngineConfig

# Where tests/fuzz/atheris_api.py's target keeps its engine: a directory its
# caller made and removes (the fuzzing process cannot remove its own).
ROOT_ENV = "BRAIN_FUZZ_ROOT"
DEADLINE = 20.0  # seconds a call may take before it counts as a hang
MAX_REQUEST_BYTES = 4096  # small, so that the request-size limit is within the fuzzer's reach
RECV_LIMIT = MAX_REQUEST_BYTES + 512 * 1024
INTERNAL_ERROR = "brain: internal error"
REQUIRE_LEADER_BIT = 0x80

T = importlib.import_module("brain._transport")  # the event kinds the front reads


class Defect(AssertionError):
    """What the front did with an input is a bug (the fuzzer's crash)."""


class _Ended:
    """How one call or stream ended, as the stand-in transport saw it."""

    __slots__ = ("messages", "status", "done", "moved")

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.status: tuple[int, str] | None = None  # None: answered OK (unary) / not finished (stream)
        self.done = threading.Event()  # answered, or the stream finished
        self.moved = threading.Event()  # anything at all: a message or the end


class StandInTransport:
    """brain._transport.Transport's face, without sockets: ``push`` hands
    the front a batch of events; answers are recorded by call id."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.batches: deque = deque()
        self.idle = False  # the dispatch thread waits for a batch, and none is queued
        self.ended: dict[int, _Ended] = {}

    def track(self, cid: int) -> _Ended:
        with self.cv:
            e = self.ended[cid] = _Ended()
            return e

    def push(self, events: list | None) -> None:
        with self.cv:
            self.batches.append(events)
            self.idle = False
            self.cv.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until the dispatch thread has handled every batch pushed (False: it did not in time)."""
        with self.cv:
            return self.cv.wait_for(lambda: self.idle, timeout)

    # -- what the front calls --------------------------------------------------

    def start(self) -> None:
        pass

    def recv_batch(self, max_events: int):
        with self.cv:
            while not self.batches:
                self.idle = True
                self.cv.notify_all()
                self.cv.wait()
            return self.batches.popleft()  # None: closed

    def wake(self) -> None:
        self.push([])

    def close(self) -> None:
        self.push(None)

    def stats(self) -> dict:
        return {}

    def _get(self, cid: int) -> _Ended:
        with self.cv:
            e = self.ended.get(cid)
        if e is None:
            raise Defect(f"the front answered call {cid}, which it was never given")
        return e

    def respond(self, cid: int, data: bytes) -> None:
        e = self._get(cid)
        e.messages.append(bytes(data))
        e.done.set()
        e.moved.set()

    def respond_many(self, items) -> None:
        for cid, data in items:
            self.respond(cid, data)

    def fail(self, cid: int, code: int, message: str) -> None:
        self.finish(cid, code, message)

    def finish(self, cid: int, code: int, message: str) -> None:
        e = self._get(cid)
        e.status = (code, message)
        e.done.set()
        e.moved.set()

    def send(self, sid: int, frames) -> bool:
        e = self._get(sid)
        e.messages.extend(bytes(f) for f in frames)
        e.moved.set()
        return True

    def room(self, sid: int) -> int:
        """What a stream may be sent before ``send`` reports it full: this
        stand-in keeps everything, so always room."""
        return 1 << 30

    def http_respond(self, rid, status, headers, body) -> None:  # pragma: no cover - no HTTP here
        raise Defect("an HTTP answer to a gRPC input")


class _Errors(logging.Handler):
    """Every record at ERROR or above logged under ``brain``."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class FrontTarget:
    """A front over a real engine, fed inputs by ``run``; ``close`` when done."""

    def __init__(self, root: str | None = None) -> None:
        self._own_root = root is None
        self.root = make_root() if root is None else root
        self.engine = Engine.open(EngineConfig(f"{self.root}/data", shards=1, shard_boundaries=[]))
        self.transport = StandInTransport()
        self.errors = _Errors()
        logging.getLogger("brain").addHandler(self.errors)
        self.pool = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fuzz-pool")
        engine = self.engine
        kv = KVService(engine, max_request_bytes=MAX_REQUEST_BYTES)
        lease = LeaseService(engine)
        watch = WatchService(engine, max_request_bytes=MAX_REQUEST_BYTES)
        self.health = HealthService(None)
        tables = [kv.rpc_table(), MaintenanceService(engine, None).rpc_table(),
                  ClusterService(engine, "default", lambda: ["http://127.0.0.1:2379"], None).rpc_table(),
                  lease.rpc_table(), watch.rpc_table(), self.health.rpc_table()]
        self.responses = {f"/{t.service}/{r.name}": r.response for t in tables for r in t.rpcs}
        methods = native_front.front_methods(tables, RECV_LIMIT)
        self.front = native_front.NativeFront(
            engine, methods, recv_limit=RECV_LIMIT, stats=GrpcStats(), pool=self.pool,
            watch_service=watch, lease_service=lease, keepalive_time_ms=7_200_000, keepalive_timeout_ms=20_000,
            transport=self.transport)
        self.ids = {m.path: i for i, m in enumerate(methods)}
        # the fuzzer's choice of method: by path, so the corpus does not depend on the tables' order
        self.methods = [(path, self.ids[path], methods[self.ids[path]]) for path in sorted(self.ids)]
        self.front.start()
        self.next_id = 1

    def close(self) -> None:
        logging.getLogger("brain").removeHandler(self.errors)
        self.health.shutdown()
        self.front.stop(1.0)
        self.pool.shutdown(wait=True)
        self.health.close()
        self.engine.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> FrontTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one input -------------------------------------------------------------------

    def _id(self) -> int:
        cid = self.next_id
        self.next_id += 1
        return cid

    def settle(self) -> None:
        """Wait until the dispatch thread has handled everything pushed so far."""
        if not self.transport.settle(DEADLINE):
            raise Defect(f"the dispatch thread did not come round within {DEADLINE} s")

    def run(self, data: bytes) -> None:
        if not data:
            return
        path, mid, m = self.methods[(data[0] & ~REQUIRE_LEADER_BIT) % len(self.methods)]
        payload = data[1:]
        flag = T.REQUIRE_LEADER if data[0] & REQUIRE_LEADER_BIT else 0
        cid = self._id()
        ended = self.transport.track(cid)
        if m.stream is None:
            self.transport.push([(T.EV_CALL | flag, cid, mid, payload, None)])
            # a subscription (health Watch) never ends by itself: its first message will do
            waited = ended.moved if m.subscribe is not None else ended.done
            if not waited.wait(DEADLINE):
                raise Defect(f"{path}: no answer within {DEADLINE} s to {payload!r}")
            if not ended.done.is_set():
                self.transport.push([(T.EV_CANCELLED, cid, mid, None, None)])
        else:
            events = [(T.EV_OPEN | flag, cid, mid, None, None)]
            events += [(T.EV_MESSAGE, cid, mid, msg, None) for msg in split_messages(payload)]
            events.append((T.EV_HALF_CLOSED, cid, mid, None, None))
            self.transport.push(events)
            self.settle()
            # a half-closed LeaseKeepAlive ends once its renewals are answered
            if m.stream == "keepalive" and not ended.done.wait(DEADLINE):
                raise Defect(f"{path}: the half-closed stream did not end within {DEADLINE} s for {payload!r}")
            self.transport.push([(T.EV_CANCELLED, cid, mid, None, None)])
        self.settle()
        self.check(path, payload, ended)

    def check(self, path: str, payload: bytes, ended: _Ended) -> None:
        if self.errors.records:
            rec = self.errors.records[0]
            self.errors.records.clear()
            detail = logging.Formatter().format(rec)
            raise Defect(f"{path}: logged at {rec.levelname} for {payload!r}: {detail}")
        if ended.status is not None:
            code, message = ended.status
            if message.startswith(INTERNAL_ERROR):
                raise Defect(f"{path}: {message} (code {code}) for {payload!r}")
        response = self.responses[path]
        if response is not None:
            for msg in ended.messages:
                try:
                    response.FromString(msg)
                except Exception as e:  # noqa: BLE001
                    raise Defect(f"{path}: answered bytes that are no {response.__name__}: {e}") from None
        # a pool thread answers first, then lets go of its session and counts its call out
        self.front.inflight.wait(DEADLINE)
        if self.front.inflight.count:
            raise Defect(f"{path}: {self.front.inflight.count} calls left in flight for {payload!r}")
        left = self.front.sessions.by_id
        if left:
            raise Defect(f"{path}: sessions left open after the input: {sorted(left)} for {payload!r}")


def split_messages(payload: bytes) -> list[bytes]:
    """A stream's messages from ``[u8 length][bytes]...`` (the last one cut short if need be)."""
    out = []
    i = 0
    while i < len(payload):
        n = payload[i]
        out.append(payload[i + 1:i + 1 + n])
        i += 1 + n
    return out


def join_messages(messages: list[bytes]) -> bytes:
    """The inverse of split_messages, for seeds (each message under 256 bytes)."""
    return b"".join(bytes([len(m)]) + m for m in messages)


def make_root() -> str:
    """A new directory for a FrontTarget's engine (in memory when it can)."""
    return tempfile.mkdtemp(prefix="brain-fuzz-", dir=_memory_dir())


def _memory_dir() -> str | None:
    """/dev/shm when there is one: fdatasync there costs nothing."""
    try:
        probe = tempfile.mkdtemp(dir="/dev/shm")
    except OSError:
        return None
    shutil.rmtree(probe, ignore_errors=True)
    return "/dev/shm"

