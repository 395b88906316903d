"""Writes and lease calls from followers to the leader, over NATS.

Every replica listens on ``<name>.fwd.<its member ID>``; a follower sends
to the subject of the replica it believes leads (the election's view).
Only a replica that *is* the leader acts on a message; any other answers
"not leader", and a message to a replica that is gone gets NATS's "no
responders".  In both cases nothing was applied, so the follower retries
with whoever leads next, until the request timeout.  A message that gets no
answer at all may or may not have been applied: the client is told the
request timed out (etcd's answer to the same uncertainty).

Messages (brain.cluster.codec):

    request: [op, args]   op "w": args = [write requests]  (one commit batch's worth)
                          op "keepalive": [lease IDs]; "ttl": [id, keys]; "leases": []
    reply:   ["ok", result] | ["err", EtcdError] | ["notleader"]

The leader hands a "w" batch to its engine in one submit_batch (marked
``local``: if it stops leading before deciding them, they are answered
"not leader" rather than forwarded again) and replies once every write of
it is durable.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..mvcc import errors
from . import codec

log = logging.getLogger("brain.cluster.forwarding")

REQUEST_TIMEOUT = 7.0  # etcd's request timeout
RETRY_WAIT = 0.05


def subject_of(name: str, member_id: int) -> str:
    return f"{name}.fwd.{member_id:x}"


class Forwarder:
    """The follower side: sends to the leader, retries what is safe."""

    def __init__(self, conn, name: str, leader_id: Callable[[], int], *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.conn = conn
        self.name = name
        self.leader_id = leader_id
        self.timeout = timeout
        self.forwarded = 0
        self.retried = 0

    def forward(self, requests: list, done: Callable) -> None:
        self.forwarded += len(requests)
        self._send(["w", requests], lambda result, exc: done(exc if exc is not None else result))

    def call(self, op: str, args: list, done: Callable) -> None:
        self._send([op, args], done)

    def _send(self, message: list, done: Callable) -> None:
        data = codec.encode(message)
        deadline = time.monotonic() + self.timeout
        self.conn.submit(self._exchange(data, deadline, done))

    async def _exchange(self, data: bytes, deadline: float, done: Callable) -> None:
        import asyncio

        import nats.errors

        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                done(None, errors.ErrNoLeader if attempt == 0 else errors.ErrTimeout)
                return
            leader = self.leader_id()
            if not leader:
                await asyncio.sleep(RETRY_WAIT)
                continue
            attempt += 1
            try:
                msg = await self.conn.nc.request(subject_of(self.name, leader), data, timeout=left)
            except nats.errors.NoRespondersError:
                self.retried += 1
                await asyncio.sleep(RETRY_WAIT * random.uniform(1, 2))
                continue
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                done(None, errors.ErrTimeout)
                return
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                    nats.errors.Error) as e:
                # not sent (the client refuses while reconnecting): safe to retry
                log.debug("forward: %r", e)
                await asyncio.sleep(RETRY_WAIT * 4)
                continue
            try:
                reply = codec.decode(msg.data)
                kind = reply[0]
            except (codec.CodecError, IndexError, TypeError) as e:
                log.error("bad reply from the leader: %s", e)
                done(None, errors.ErrStopped)
                return
            if kind == "ok":
                done(reply[1], None)
                return
            if kind == "err":
                done(None, reply[1])
                return
            # "notleader": it was not applied; wait for the election to move on
            self.retried += 1
            await asyncio.sleep(RETRY_WAIT * random.uniform(1, 2))


class ReadIndexAsker:
    """A follower's read index: asks the leader (one core NATS round trip,
    answered from the leader's memory while it holds its lease) and falls
    back to the journal's own answer (a JetStream API call, several times
    dearer) when the leader cannot vouch for it."""

    def __init__(self, conn, name: str, leader_id: Callable[[], int], member_id: int, journal,
                 timeout: float = 0.5, ask_leader: bool = True) -> None:
        self.conn = conn
        self.ask_leader = ask_leader  # False: no read lease, the journal always answers
        self.name = name
        self.leader_id = leader_id
        self.member_id = member_id
        self.journal = journal
        self.timeout = timeout
        self.from_leader = 0
        self.from_journal = 0
        self._request = codec.encode(["ri", []])

    def __call__(self, callback) -> None:
        leader = self.leader_id() if self.ask_leader else 0
        if not leader or leader == self.member_id:
            self.from_journal += 1
            self.journal.read_index(callback)
            return
        self.conn.submit(self._ask(leader, callback))

    async def _ask(self, leader: int, callback) -> None:
        try:
            msg = await self.conn.nc.request(subject_of(self.name, leader), self._request, timeout=self.timeout)
            reply = codec.decode(msg.data)
        except Exception:  # noqa: BLE001 - no answer: the journal decides
            reply = None
        if reply and reply[0] == "ok" and type(reply[1]) is int:
            self.from_leader += 1
            callback(reply[1], None)
            return
        self.from_journal += 1
        self.journal.read_index(callback)


class ForwardingServer:
    """The leader side: every replica listens, the leader answers."""

    def __init__(self, conn, name: str, engine) -> None:
        self.conn = conn
        self.name = name
        self.engine = engine
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
            # a follower's read index: while no other leader can exist (the
            # lease), nothing is in the journal past this leader's last
            # append (acknowledged or not: a record stored but not yet
            # acknowledged may already be visible on another follower);
            # otherwise the follower asks the journal
            lease = eng.read_lease
            if lease is not None and lease():
                await msg.respond(codec.encode(["ok", eng.journal.last_index]))
            else:
                await msg.respond(codec.encode(["notleader"]))
            return
        if op == "w":
            self._submit(msg, args)
            return
        # lease calls need the leader's clocks; they are quick
        self._pool.submit(self._lease_call, msg, op, args)

    def _submit(self, msg, requests: list) -> None:
        n = len(requests)
        results: list = [None] * n
        left = [n]
        lock = threading.Lock()

        def settled(items) -> None:  # on the committer, once per commit batch
            with lock:
                for index, result, exc in items:
                    results[index] = exc if exc is not None else result
                left[0] -= len(items)
                finished = left[0] == 0
            if finished:
                if all(r == errors.ErrNotLeader for r in results):
                    self._reply(msg, ["notleader"])
                else:
                    # a write answered ErrNotLeader was not applied: the
                    # sender forwards it again
                    self._reply(msg, ["ok", results])

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
