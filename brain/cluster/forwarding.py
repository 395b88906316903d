"""Writes and lease calls from followers to the leader, over NATS.

Every replica listens on ``<name>.fwd.<its member ID>``; a follower sends
to the subject of the replica it believes leads (the election's view).
Only a replica that *is* the leader acts on a message; any other answers
"not leader", and a message to a replica that is gone gets NATS's "no
responders".  In both cases nothing was applied, so the follower retries
with whoever leads next, until the request timeout.  A message that gets no
answer at all may or may not have been applied: the client is told the
request timed out (etcd's answer to the same uncertainty).

A message in flight to a leader the election then finds dead (no
heartbeat for the election timeout) or replaced (after a short grace for
a leader that handed over and still answers) gets no answer either: a
write's caller is told at once, "request timed out, possibly due to
previous leader failure", rather than after the whole request timeout (the
write pause after a leader's kill -9 was 7 s when a write was in flight to
it); a lease call or read index, which can be asked again, goes to the next
leader.

Messages (brain.cluster.codec):

    request: [op, args]   op "w": args = [write requests]  (one commit batch's worth)
                          op "wb": the same, a plain Txn as the TxnRequest
                          bytes its client sent (read on the leader by the
                          native decoder: cheaper on both sides than this
                          codec; sent only while every member reads them)
                          op "keepalive": [lease IDs]; "ttl": [id, keys]; "leases": []
    reply:   ["ok", result] | ["err", EtcdError] | ["notleader"]

The leader hands a "w" batch to its engine in one submit_batch (marked
``local``: if it stops leading before deciding them, they are answered
"not leader" rather than forwarded again) and replies once every write of
it is durable.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..engine.timeouts import REQUEST_TIMEOUT
from ..mvcc import errors
from . import codec

log = logging.getLogger("brain.cluster.forwarding")

RETRY_WAIT = 0.05
WATCH_INTERVAL = 0.02  # how often a message in flight checks the election's view of its leader
HANDOVER_GRACE = 0.5  # a replaced (not dead) leader's time to answer what it had already taken


def subject_of(name: str, member_id: int) -> str:
    return f"{name}.fwd.{member_id:x}"


class Forwarder:
    """The follower side: sends to the leader, retries what is safe."""

    def __init__(self, conn, name: str, leader_id: Callable[[], int], *, timeout: float = REQUEST_TIMEOUT,
                 elected: Callable[[], int] | None = None, notleader_ends: bool = False,
                 bytes_allowed: Callable[[], bool] | None = None) -> None:
        """``leader_id``: whom to ask.  ``elected``: the election's own view
        of the leader (0 once it is silent for the election timeout), which
        ends the wait for a leader that will not answer (module docstring).
        ``notleader_ends``: a "notleader" answer ends the call with
        ErrNotLeader instead of being asked again (the caller asks someone
        else).  ``bytes_allowed``: whether every member reads a Txn as its
        client's bytes (op "wb"); never, without it."""
        self.conn = conn
        self.name = name
        self.leader_id = leader_id
        self.elected = elected
        self.notleader_ends = notleader_ends
        self.bytes_allowed = bytes_allowed
        self.timeout = timeout
        self.forwarded = 0
        self.forwarded_as_bytes = 0
        self.retried = 0
        self.abandoned = 0  # messages in flight to a leader that died or was replaced
        self._flights: set[_Flight] = set()  # (the loop's) messages awaiting an answer
        self._watching = False  # (the loop's) _watch is scheduled

    def forward(self, requests: list, done: Callable, wires: list | None = None) -> None:
        self.forwarded += len(requests)
        message = ["w", requests]
        if wires is not None and self.bytes_allowed is not None and any(wires) and self.bytes_allowed():
            message = ["wb", [r if w is None else w for r, w in zip(requests, wires)]]
            self.forwarded_as_bytes += sum(w is not None for w in wires)
        self._send(message, False, lambda result, exc: done(exc if exc is not None else result))

    def call(self, op: str, args: list, done: Callable) -> None:
        """A lease call or a read index: safe to ask the next leader again."""
        self._send([op, args], True, done)

    def _send(self, message: list, repeatable: bool, done: Callable) -> None:
        flight = _Flight(codec.encode(message), time.monotonic() + self.timeout, repeatable, done)
        self.conn.call_soon(self._ask, flight)

    # Every message in flight is a _Flight, its request a task on the
    # connection's loop; one watcher (_watch) looks at all of them every
    # WATCH_INTERVAL for a dead or replaced leader and a dropped connection,
    # instead of a coroutine, an asyncio.wait and its timer per message
    # (they were a fifth of a follower's interpreter time under the
    # node-capacity load).  Everything below runs on the loop.

    def _ask(self, f: "_Flight") -> None:
        """Send ``f`` to the leader the election names, or wait for one."""
        left = f.deadline - time.monotonic()
        if left <= 0:
            f.done(None, errors.ErrNoLeader if f.attempt == 0 else errors.ErrTimeout)
            return
        leader = self.leader_id()
        if not leader or (leader == f.abandoned and self.elected() != leader):
            self._again(RETRY_WAIT, f)  # until the election names a leader to ask
            return
        f.attempt += 1
        f.leader = leader
        # not the leader the election knows: nothing to watch
        f.watched = self.elected is not None and self.elected() == leader
        f.replaced_at = None
        f.gave_up = GaveUp.NO
        try:
            f.task, f.dropped = self.conn.start_request(subject_of(self.name, leader), f.data, timeout=left)
        except Exception as e:  # noqa: BLE001 - no connection yet: as a refused send, safe to retry
            log.debug("forward: %r", e)
            self._again(RETRY_WAIT * 4, f)
            return
        f.task.add_done_callback(lambda task, f=f: self._answered(f, task))
        self._flights.add(f)
        if not self._watching:
            self._watching = True
            self.conn.loop.call_later(WATCH_INTERVAL, self._watch)

    def _again(self, delay: float, f: "_Flight") -> None:
        self.conn.loop.call_later(delay, self._ask, f)

    def _watch(self) -> None:
        """Give up on the messages whose leader the election found dead, or
        replaced for longer than HANDOVER_GRACE, and on those sent on a
        connection that dropped (their answers cannot come)."""
        now = time.monotonic()
        now_leader = self.elected() if self.elected is not None else 0
        for f in self._flights:
            if f.gave_up is not GaveUp.NO:
                continue
            if f.dropped is not None and f.dropped.done():
                f.gave_up = GaveUp.DROPPED
                f.task.cancel()
                continue
            if not f.watched:
                continue
            if now_leader == f.leader:
                f.replaced_at = None
            elif now_leader == 0 or (f.replaced_at is not None and now - f.replaced_at >= HANDOVER_GRACE):
                f.gave_up = GaveUp.ABANDONED
                self.abandoned += 1
                f.task.cancel()
            elif f.replaced_at is None:
                f.replaced_at = now
        if self._flights:
            self.conn.loop.call_later(WATCH_INTERVAL, self._watch)
        else:
            self._watching = False

    def _answered(self, f: "_Flight", task) -> None:
        import nats.errors

        self._flights.discard(f)
        if task.cancelled():
            if f.gave_up is GaveUp.DROPPED:
                f.done(None, errors.ErrTimeout)  # the timeout it would have become
            elif f.gave_up is GaveUp.ABANDONED:
                if f.repeatable:
                    f.abandoned = f.leader
                    self._ask(f)
                else:
                    f.done(None, errors.ErrTimeoutDueToLeaderFail)
            return  # else the loop is stopping
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, nats.errors.NoRespondersError):
                self.retried += 1
                self._again(RETRY_WAIT * random.uniform(1, 2), f)
            elif isinstance(exc, (nats.errors.TimeoutError, TimeoutError)):
                f.done(None, errors.ErrTimeout)
            elif isinstance(exc, nats.errors.Error):
                # not sent (the client refuses while reconnecting): safe to retry
                log.debug("forward: %r", exc)
                self._again(RETRY_WAIT * 4, f)
            else:
                log.error("forwarding failed: %r", exc)
                f.done(None, errors.ErrTimeout)  # it may have been sent: etcd's answer to not knowing
            return
        try:
            reply = codec.decode(task.result().data)
            kind = reply[0]
        except (codec.CodecError, IndexError, TypeError) as e:
            log.error("bad reply from the leader: %s", e)
            f.done(None, errors.ErrStopped)
            return
        if kind == "ok":
            f.done(reply[1], None)
        elif kind == "err":
            f.done(None, reply[1])
        elif self.notleader_ends:
            f.done(None, errors.ErrNotLeader)
        else:
            # "notleader": it was not applied; wait for the election to move on
            self.retried += 1
            self._again(RETRY_WAIT * random.uniform(1, 2), f)


class GaveUp(enum.Enum):
    """Why the watcher cancelled a message's request."""

    NO = 0  # it did not: the loop is stopping (or the request is still on)
    DROPPED = 1  # its connection dropped: no answer can come
    ABANDONED = 2  # its leader was found dead, or replaced past HANDOVER_GRACE


class _Flight:
    """One message to the leader, from its first send to its answer."""

    __slots__ = ("data", "deadline", "repeatable", "done", "attempt", "abandoned", "leader", "watched",
                 "replaced_at", "gave_up", "task", "dropped")

    def __init__(self, data: bytes, deadline: float, repeatable: bool, done: Callable) -> None:
        self.data = data
        self.deadline = deadline
        self.repeatable = repeatable
        self.done = done  # done(result, exc)
        self.attempt = 0
        self.abandoned = 0  # a leader this message gave up on: asked again only once elected again
        self.leader = 0
        self.watched = False
        self.replaced_at: float | None = None
        self.gave_up = GaveUp.NO
        self.task = None
        self.dropped = None


class ReadIndexAsker:
    """A replica's read index, vouched for by the leader (the engine's
    ``use_read_index``).  Within its read lease the leader answers its last
    append from memory; otherwise it appends a barrier record and answers
    its index once JetStream acknowledged it (Engine.journal_barrier).  The
    leader's own reads ask its engine directly.  Asking the stream for its
    last sequence instead would be cheaper and is not safe: a stream leader
    cut off from its quorum answers it from its own copy.

    Whom to ask: the journal's writer (``forwarder``: the replica the last
    epoch record names).  When that writer no longer leads (it wrote its
    epoch, then found it had lost the key, and stepped down), the elected
    leader is asked (``elected``) for a barrier, never its lease: the
    stepped-down writer's epoch record fenced it, so its lease vouches for
    nothing, and only an append shows it.  A fenced barrier deposes it
    (it abdicates, brain.cluster.replica), the election moves on and the
    next leader's epoch names whom to ask.  Without this the read waited
    for a leader that no write would ever make (CI: reads timing out on
    every replica after a NATS quorum came back, with nobody writing).

    No leader known, or an answer "not leader": asked again (the
    Forwarder's retries) until the request timeout, as etcd's ReadIndex
    waits for a leader; then ``etcdserver: no leader`` or ``request timed
    out``."""

    def __init__(self, forwarder: Forwarder, engine, elected: Forwarder) -> None:
        self.forwarder = forwarder
        self.elected = elected
        self.engine = engine
        self.leased = 0  # answers from the leader's lease
        self.confirmed = 0  # answers confirmed by a barrier record

    def __call__(self, callback) -> None:
        if self.forwarder.leader_id() == self.engine.member_id:
            self.engine.journal_barrier(lambda index, exc: self._own_answer(index, exc, callback))
        else:
            self._ask(self.forwarder, [], callback)

    def _own_answer(self, index: int | None, exc, callback) -> None:
        if exc == errors.ErrNotLeader or exc == errors.ErrLeaderChanged:
            self._ask_elected(callback)  # the lead moved on meanwhile
            return
        if exc is None:
            self.confirmed += 1
        callback(index, exc)

    def _ask_elected(self, callback) -> None:
        self._ask(self.elected, [True], callback)  # [True]: a barrier, not the lease

    def _ask(self, forwarder: Forwarder, args: list, callback) -> None:
        def answered(result, exc) -> None:
            if exc == errors.ErrNotLeader and forwarder is not self.elected:
                self._ask_elected(callback)  # the journal's writer stepped down
                return
            if exc is not None:
                callback(None, exc)
                return
            index, by_barrier = result
            if by_barrier:
                self.confirmed += 1
            else:
                self.leased += 1
            callback(index, None)

        forwarder.call("ri", args, answered)


# A forwarded Txn's bytes the leader could not read: that write alone fails.
UNREADABLE = errors.EtcdError("INTERNAL", "brain: the leader could not read a forwarded request")


class ForwardingServer:
    """The leader side: every replica listens, the leader answers."""

    def __init__(self, conn, name: str, engine, *, read_txn: Callable[[bytes], object] | None = None) -> None:
        """``read_txn``: a TxnRequest's bytes to brain's request (raising
        ValueError), for op "wb"; without it that op is refused."""
        self.conn = conn
        self.name = name
        self.engine = engine
        self.read_txn = read_txn
        self._sub = None
        self.handled = 0
        # lease calls may wait (a keep-alive on an expired lease waits for
        # its revoke): never on the connection's loop
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="brain-fwd")

    def start(self) -> None:
        self._sub = self.conn.subscribe(subject_of(self.name, self.engine.member_id), self._on_msg)

    def stop(self) -> None:
        sub, self._sub = self._sub, None
        self.conn.unsubscribe(sub)
        self._pool.shutdown(wait=False)

    def _reply(self, msg, value: list) -> None:
        data = codec.encode(value)
        self.conn.call_soon(lambda: self.conn.loop.create_task(msg.respond(data)))

    async def _on_msg(self, msg) -> None:
        if not msg.reply:
            return
        eng = self.engine
        try:
            op, args = codec.decode(msg.data)
        except (codec.CodecError, ValueError, TypeError) as e:
            log.warning("bad forwarded message: %s", e)
            await msg.respond(codec.encode(["err", errors.ErrStopped]))
            return
        if not eng.is_leader:
            await msg.respond(codec.encode(["notleader"]))
            return
        self.handled += 1
        if op == "ri":
            self._read_index(msg, barrier=bool(args and args[0]))
            return
        if op == "w":
            self._submit(msg, args)
            return
        if op == "wb" and self.read_txn is not None:
            self._submit(msg, *self._read_bytes(args))
            return
        # lease calls need the leader's clocks; they are quick
        self._pool.submit(self._lease_call, msg, op, args)

    def _read_index(self, msg, *, barrier: bool = False) -> None:
        """A follower's read index: [index, confirmed by a barrier record].
        Within the lease no other leader can exist, so nothing is in the
        journal past this leader's last append (acknowledged or not: a
        record stored but not yet acknowledged may already be visible on
        another follower); otherwise, or when the follower asks for one
        (``barrier``: the journal names another writer), a barrier record
        vouches for it."""
        eng = self.engine
        lease = eng.read_lease
        if not barrier and lease is not None and lease():
            self._reply(msg, ["ok", [eng.journal.last_index, False]])
            return

        def confirmed(index, exc) -> None:  # on the committer
            if exc is None:
                self._reply(msg, ["ok", [index, True]])
            elif exc == errors.ErrNotLeader or exc == errors.ErrLeaderChanged:
                # not confirmed: the barrier was fenced (another replica wrote)
                # and this replica stepped down; the follower asks the next one
                self._reply(msg, ["notleader"])
            else:
                self._reply(msg, ["err", exc])

        eng.journal_barrier(confirmed)

    def _read_bytes(self, items: list) -> tuple[list, dict]:
        """Op "wb"'s writes as requests, and the places of those whose
        bytes are not a TxnRequest (each fails alone)."""
        read, requests, unreadable = self.read_txn, [], {}
        for i, item in enumerate(items):
            if type(item) is bytes:
                try:
                    item = read(item)
                except ValueError as e:
                    log.warning("a forwarded Txn could not be read: %s", e)
                    unreadable[i] = UNREADABLE
                    continue
            requests.append(item)
        return requests, unreadable

    def _submit(self, msg, requests: list, refused: dict | None = None) -> None:
        """Decide ``requests`` and reply with every result in the order the
        follower sent them; ``refused``: places (among those sent) already
        answered with an error, which ``requests`` leaves out."""
        n = len(requests) + len(refused or ())
        results: list = [None] * n
        slots = list(range(n))
        if refused:
            for i, err in refused.items():
                results[i] = err
            slots = [i for i in slots if i not in refused]
        left = [len(slots)]
        lock = threading.Lock()

        def settled(items) -> None:  # on the committer, once per commit batch
            with lock:
                for index, result, exc in items:
                    results[slots[index]] = exc if exc is not None else result
                left[0] -= len(items)
                finished = left[0] == 0
            if finished:
                if all(r == errors.ErrNotLeader for r in results):
                    self._reply(msg, ["notleader"])
                else:
                    # a write answered ErrNotLeader was not applied: the
                    # sender forwards it again
                    self._reply(msg, ["ok", results])

        if not requests:
            self._reply(msg, ["ok", results])
            return
        try:
            self.engine.submit_batch(requests, settled, local=True)
        except Exception as e:  # noqa: BLE001
            log.exception("forwarded writes failed")
            self._reply(msg, ["err", e if isinstance(e, errors.EtcdError) else errors.ErrStopped])

    def _lease_call(self, msg, op: str, args: list) -> None:
        eng = self.engine
        try:
            if op == "keepalive":
                result = eng.renew_leases(args)
            elif op == "ttl":
                result = eng.lease_time_to_live(args[0], bool(args[1]))
            elif op == "leases":
                result = eng.lease_leases()
            else:
                raise errors.EtcdError("INVALID_ARGUMENT", f"brain: unknown forwarded call {op!r}")
        except errors.EtcdError as e:
            if e == errors.ErrNotLeader:
                self._reply(msg, ["notleader"])
            else:
                self._reply(msg, ["err", e])
            return
        except Exception:  # noqa: BLE001
            log.exception("forwarded %s failed", op)
            self._reply(msg, ["err", errors.ErrStopped])
            return
        self._reply(msg, ["ok", result])
