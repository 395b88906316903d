"""The journal as a NATS JetStream stream, shared by a brain cluster.

Layout: one stream ``<name>_journal`` with one subject ``<name>.journal``
(brain.journal.jetstream_stream: its settings, provisioning, the JetStream
API).  A record's index is the stream sequence of its (last) message.
Only the leader publishes (every message fenced, below): a replica's read
barrier is an empty record the leader appends (brain.engine.readindex),
never a message of its own, which would break the leader's fence.

Writing (the leader only).  Each append is one publish carrying

    Nats-Expected-Last-Sequence: S     the message must land right after S
    Nats-Msg-Id: <nonce>-<S+1>         a retry of it is de-duplicated
    Brain-Epoch: E                     the writer's epoch (its term)

so a writer that has been deposed (another replica appended meanwhile)
is refused (API error 10071) instead of interleaving with the new leader,
whatever the clocks say.  Appends are pipelined (several in flight while
``sync`` waits for earlier ones: brain.engine.pipeline), and the fence
alone is not enough then: when a record of ours is refused because the new
leader's epoch record took its place, our next record, already on its way,
expects exactly that place's sequence and lands after it.  Such a *stale*
message is never acknowledged to its writer (the refusal before it fails
the batch and every later one), and every reader takes it for an empty
record: readers keep the newest epoch they have seen (from the epoch the
caller's store is at) and read a message of an older epoch as nothing
(jetstream_reading.Epochs).  An expectation of the writer's previous
message ID (Nats-Expected-Last-Msg-Id) would refuse it instead, but
nats-server checks it again on every stream replica as it applies the
message, and a replica that caught up from a peer does not know the last
ID: it stopped applying (seen in tests/cluster with a NATS leader killed).
The stale message's cost is one election: the new leader's next append
expects the place it took, is fenced, and the leader after it catches up
past it.  The new leader's own pipeline then has the same case: its
record after the fenced one expects the stale message's place and lands
after it, in the newest epoch; readers take a record of the newest epoch
that follows a stale message for stale too (Epochs has the worked
example).  A record larger than the server's max_payload
is split into parts, each its own fenced message with a header
``Brain-Part: k/n``; readers assemble them and drop a record whose parts
were never all published (the writer died halfway; its clients were never
answered).  ``sync`` waits for the acknowledgements: JetStream acks a
message once a quorum of the stream's replicas stored it.

When an acknowledgement does not come (no quorum, connection lost), the
publish is retried with the same headers until the stream answers: either
it has the message (acknowledged again, flagged duplicate — or, where the
server checks the fence first, refused with 10071 while the message at
S+1 carries our Nats-Msg-Id), or another message is at S+1 and the writer
is fenced.  Meanwhile ``sync`` raises JournalUnavailableError.

Reading (brain.journal.jetstream_reading): ``records`` pulls batches
through an ephemeral pull consumer; ``follow`` tails the stream with an
ordered push consumer.  ``end_index`` asks the stream leader for its last
sequence (a new leader's catch-up; see its docstring for why reads never
use it).

Retention: ``release(upto)`` reports this replica's checkpoint through
``on_release`` (brain.cluster records it); the leader purges below the
lowest checkpoint of the live replicas with ``purge``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import secrets
import threading
import time
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as futures_wait
from typing import Callable, Iterator

from .. import clock as lease_clock
from .errors import (
    JournalError,
    JournalFencedError,
    JournalPurgedError,
    JournalUnavailableError,
)
from .jetstream_reading import EPOCH_HEADER, PART_HEADER, Epochs, follow, pull
from .jetstream_stream import StreamState, api_error, api_request, provision, stream_state
from .natsio import NatsConnection

log = logging.getLogger("brain.journal.jetstream")

ERR_WRONG_LAST_SEQUENCE = 10071
ERR_NO_MESSAGE_FOUND = 10037
# JetStream errors that say "not now" rather than "never": the cluster or the
# stream has no leader (10008 cluster not available, 10009 not the leader),
# or a retried publish whose first copy is still proposed and not committed
# (10158 duplicate message id is in process: a stream leader cut off from
# its peers answers the retry so while the first copy waits for a quorum).
# Out of space (10023) is not among them: like a full local disk, it stops
# writes until an operator acts.
TRANSIENT_ERRORS = {10008, 10009, 10158}
HEADER_ROOM = 512  # bytes of a message left for headers
ACK_TIMEOUT = 2.0
# Seconds without an answer before the same publish goes again, beside the
# first copy.  A stream leader that steps down (a NATS rolling restart)
# drops the proposals it had not committed, and their acks never come: the
# copy reaches the new leader and is stored (or acked as a duplicate when
# the first one landed), so the append waits about this long instead of
# ACK_TIMEOUT.  A copy that meets the first one still being stored is
# answered 10158 and ignored; the de-duplication makes either harmless.
HEDGE_AFTER = 0.25
ERR_DUPLICATE_IN_PROCESS = 10158


def _parse_headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


class _Publish:
    __slots__ = ("seq", "data", "headers", "future")

    def __init__(self, seq: int, data: bytes, headers: dict) -> None:
        self.seq = seq
        self.data = data
        self.headers = headers
        self.future = None


class JetStreamJournal:
    """A shared journal on a JetStream stream (see the module docstring).

    Pipelined: the writer may append while an earlier ``sync`` still waits
    (the committer decides and publishes the next batches while a syncing
    thread waits for the acknowledgements of the last ones); ``sync``
    waits for what was appended before it was called.  ``_lock`` guards
    the list of publishes not yet acknowledged between the two."""

    pipelined = True

    def __init__(self, conn: NatsConnection, stream: str, subject: str, *, ack_timeout: float = ACK_TIMEOUT) -> None:
        self.conn = conn
        self.stream = stream
        self.subject = subject
        self.ack_timeout = ack_timeout
        self._chunk = max(1024, conn.max_payload - HEADER_ROOM)
        self._writing = False
        self._last = 0  # writer: index of the last record appended
        self._nonce = ""
        self._unacked: list[_Publish] = []  # in append order, under _lock
        self._lock = threading.Lock()
        self._fenced = False  # a sync found another writer: appends are refused as fenced too
        self._epoch = 0  # the writer's, on each message (0: none, a test's writer)
        self._follower = None  # (subscription future, stop event)
        self._first = 1
        # brain.cluster sets this: ``on_release(index)`` records the
        # replica's checkpoint for retention.
        self.on_release: Callable[[int], None] | None = None
        self.appended = 0
        self.retries = 0
        # writer: the time (brain.clock) a quorum last acknowledged every append so
        # far, each fenced on the one before (so no other writer came
        # between): the election keeps a leader whose key cannot be renewed
        # on this (brain.cluster.election)
        self.acknowledged_at = -math.inf

    # ------------------------------------------------------------------
    # provisioning

    @classmethod
    def open(cls, conn: NatsConnection, name: str, *, replicas: int, create: bool = True,
             timeout: float = 10.0) -> "JetStreamJournal":
        """The journal of cluster ``name``: the stream is created with
        ``replicas`` replicas when missing, and refused when it exists
        with settings that would lose records."""
        stream, subject, info = provision(conn, name, replicas=replicas, create=create, timeout=timeout)
        journal = cls(conn, stream, subject)
        journal._first = max(1, int(info.get("state", {}).get("first_seq", 1) or 1))
        return journal

    def state(self, timeout: float = 5.0) -> StreamState:
        state = stream_state(self.conn.run(api_request(self.conn, f"$JS.API.STREAM.INFO.{self.stream}", b""),
                                           timeout))
        self._first = state.first_seq
        return state

    # ------------------------------------------------------------------
    # the Journal contract

    @property
    def first_index(self) -> int:
        return self._first

    @property
    def last_index(self) -> int:
        """The writer's last appended record, from before its first message
        is sent: a record stored but not yet acknowledged may already be
        applied by a follower, and the leader's read index (this) must not
        be below it."""
        return self._last

    def begin_writing(self, last_index: int, epoch: int = 0) -> None:
        with self._lock:
            self._writing = True
            self._fenced = False
            self._last = last_index
            self._epoch = epoch
            self._nonce = secrets.token_hex(8)
            self._unacked = []
        self.acknowledged_at = -math.inf  # an earlier term's acknowledgements say nothing of this one

    def stop_writing(self) -> None:
        with self._lock:
            self._writing = False
            self._unacked = []

    def _stop_fenced(self) -> None:
        """Another writer appended: nothing more of ours can land."""
        with self._lock:
            self._writing = False
            self._fenced = True
            self._unacked = []

    def append(self, payload: bytes) -> int:
        if not self._writing:
            if self._fenced:
                raise JournalFencedError(f"{self.stream}: another writer appended (found by an earlier sync)",
                                         self._last)
            raise JournalError(f"{self.stream}: not writing (only the leader appends)")
        chunk = self._chunk
        parts = [payload[i:i + chunk] for i in range(0, len(payload), chunk)] or [b""]
        n = len(parts)
        first = self._last + 1
        # Before anything is sent (see last_index): once a message is on
        # its way another thread may see it stored, in the stream or on a
        # follower, while this one has not yet moved on.
        self._last = first + n - 1
        with self._lock:
            for k, data in enumerate(parts, 1):
                seq = first + k - 1
                headers = {"Nats-Expected-Last-Sequence": str(seq - 1), "Nats-Msg-Id": f"{self._nonce}-{seq}"}
                if self._epoch:
                    headers[EPOCH_HEADER] = str(self._epoch)
                if n > 1:
                    headers[PART_HEADER] = f"{k}/{n}"
                pub = _Publish(seq, data, headers)
                self._send(pub)
                self._unacked.append(pub)
        self.appended += 1
        return self._last

    def _send(self, pub: _Publish) -> None:
        pub.future = self.conn.submit(_publish(self.conn, self.subject, pub, self.ack_timeout))

    def sync(self) -> None:
        """Wait for every publish appended before this call and not yet
        acknowledged (see the module docstring for the outcomes); appends
        made meanwhile wait for the next sync."""
        with self._lock:
            if self._fenced:  # an earlier sync found another writer: what was appended since cannot land
                raise JournalFencedError(f"{self.stream}: another writer appended (found by an earlier sync)",
                                         self._last)
            pending = list(self._unacked)
        retry = False
        for i, pub in enumerate(pending):
            ack = self._answer(pub)
            if ack is None:
                retry = True
                break
            err = api_error(ack)
            if err is None:
                if int(ack.get("seq", 0)) != pub.seq:
                    self._stop_fenced()
                    raise JournalFencedError(
                        f"{self.stream}: message stored at {ack.get('seq')}, expected {pub.seq}", int(ack["seq"]))
                continue
            if err[0] == ERR_WRONG_LAST_SEQUENCE:
                if self._landed(pub):
                    continue
                if self._stream_last() == pub.seq - 1:
                    # our previous message (acknowledged here or by an
                    # earlier sync: appends are pipelined) landed after this
                    # one was judged: this one is not stored, resend it
                    retry = True
                    break
                self._stop_fenced()
                raise JournalFencedError(f"{self.stream}: {err[1]} (another writer appended after index "
                                         f"{pub.seq - 1})", pub.seq - 1)
            if err[0] in TRANSIENT_ERRORS:
                # JetStream cannot store anything right now (no quorum, no
                # stream leader): not stored, retried like a lost answer
                retry = True
                break
            # any other API error: the stream refused it for good (too large,
            # sealed, out of space): the batch is not durable
            self.stop_writing()
            raise JournalError(f"{self.stream}: publish refused: {err[1]} (code {err[0]})")
        if retry:
            # resend the unresolved publishes (same ids and fences), in
            # order, the ones appended since too
            self.retries += 1
            with self._lock:
                if self._unacked[:len(pending)] == pending:  # (not cleared by stop_writing meanwhile)
                    del self._unacked[:i]
                rest = list(self._unacked)
                for pub in rest:
                    self._send(pub)
            raise JournalUnavailableError(f"{self.stream}: no acknowledgement for index {pending[i].seq} "
                                          f"within {self.ack_timeout:g}s; retrying")
        if pending:
            self.acknowledged_at = lease_clock.now()
        with self._lock:
            if self._unacked[:len(pending)] == pending:
                del self._unacked[:len(pending)]

    def _answer(self, pub: _Publish) -> dict | None:
        """The first answer to ``pub`` that decides something (an ack, an
        API error other than 10158), sending it again every HEDGE_AFTER
        without one; None when none came within ack_timeout."""
        start = time.monotonic()
        deadline = start + self.ack_timeout
        next_copy = start + HEDGE_AFTER
        waiting = [pub.future]
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if now >= next_copy:
                self._send(pub)
                waiting.append(pub.future)
                next_copy = now + HEDGE_AFTER
            if not waiting:  # every copy came back without an answer: the next goes at next_copy
                time.sleep(max(0.0, min(next_copy, deadline) - now))
                continue
            done, _ = futures_wait(waiting, timeout=max(0.0, min(next_copy, deadline) - now),
                                   return_when=FIRST_COMPLETED)
            for fut in done:
                waiting.remove(fut)
                try:
                    ack = fut.result()
                except Exception as e:  # noqa: BLE001 - an unknown outcome
                    log.debug("publish of index %d: %r", pub.seq, e)
                    continue
                if ack is None:
                    continue
                err = api_error(ack)
                if err is not None and err[0] == ERR_DUPLICATE_IN_PROCESS and waiting:
                    continue  # another copy is being stored: its answer decides
                return ack

    def _stream_last(self) -> int:
        try:
            info = self.conn.run(api_request(self.conn, f"$JS.API.STREAM.INFO.{self.stream}", b""), 5)
        except Exception as e:  # noqa: BLE001
            raise JournalUnavailableError(f"{self.stream}: cannot read the stream's state: {e!r}") from None
        return int((info.get("state") or {}).get("last_seq", -1))

    def _landed(self, pub: _Publish) -> bool:
        """After a refusal: is our message the one at its sequence?"""
        body = json.dumps({"seq": pub.seq}).encode()
        try:
            resp = self.conn.run(api_request(self.conn, f"$JS.API.STREAM.MSG.GET.{self.stream}", body), 5)
        except Exception as e:  # noqa: BLE001
            raise JournalUnavailableError(f"{self.stream}: cannot read message {pub.seq}: {e!r}") from None
        msg = resp.get("message")
        if not msg:
            return False
        headers = _parse_headers(base64.b64decode(msg.get("hdrs", "") or b""))
        return headers.get("Nats-Msg-Id") == pub.headers["Nats-Msg-Id"]

    def records(self, after_index: int = 0, epoch: int = 0) -> Iterator[tuple[int, bytes]]:
        """The records after ``after_index`` that exist now, in order; a
        stale message (jetstream_reading.Epochs, the newest epoch seen
        starting from ``epoch``) reads as an empty record."""
        st = self.state()
        if st.last_seq <= after_index:
            return
        if after_index + 1 < st.first_seq:
            raise JournalPurgedError(
                f"{self.stream}: records {after_index + 1}..{st.first_seq - 1} were purged; the stream "
                f"starts at {st.first_seq}", st.first_seq)
        yield from pull(self.conn, self.stream, self.subject, after_index + 1, st.last_seq, lambda: self._first,
                        Epochs(epoch))

    def release(self, upto_index: int) -> int:
        hook = self.on_release
        if hook is not None:
            hook(upto_index)
        return 0

    def purge(self, below: int) -> int:
        """Drop every message with a sequence below ``below`` (leader's
        retention); returns how many were purged."""
        body = json.dumps({"seq": below}).encode()
        resp = self.conn.run(api_request(self.conn, f"$JS.API.STREAM.PURGE.{self.stream}", body), 10)
        err = api_error(resp)
        if err:
            raise JournalError(f"{self.stream}: purge below {below}: {err[1]}")
        self._first = max(self._first, below)
        return int(resp.get("purged", 0))

    def close(self) -> None:
        self.stop_following()
        self._writing = False

    # ------------------------------------------------------------------
    # the SharedJournal extras

    def end_index(self, callback) -> None:
        """The stream leader's last sequence (STREAM.INFO).  It answers
        from its own copy without asking its peers, so a stream leader cut
        off from its quorum, until it notices (NATS's lost-quorum interval,
        10 s), reports an end a newer stream leader has already passed."""
        fut = self.conn.submit(api_request(self.conn, f"$JS.API.STREAM.INFO.{self.stream}", b"", timeout=self.ack_timeout))

        def done(f) -> None:
            try:
                info = f.result()
                err = api_error(info)
                if err:
                    raise JournalUnavailableError(f"stream info: {err[1]}")
                if int(info.get("config", {}).get("num_replicas", 1)) > 1 and not (info.get("cluster") or {}).get(
                        "leader"):
                    # a replica of a leaderless stream answers from its own
                    # copy, which may be behind the last quorum's
                    raise JournalUnavailableError(f"{self.stream} has no leader (no NATS quorum)")
                index = int(info["state"]["last_seq"])
            except Exception as e:  # noqa: BLE001 - handed to the caller
                callback(None, e)
                return
            callback(index, None)

        fut.add_done_callback(done)

    def follow(self, after_index: int, deliver, failed, epoch: int = 0) -> None:
        self.stop_following()
        try:
            first = self.state().first_seq
        except Exception as e:  # noqa: BLE001 - the ordered consumer will tell more
            log.debug("stream state before following: %r", e)
            first = 1
        if after_index + 1 < first:
            failed(JournalPurgedError(
                f"{self.stream}: records {after_index + 1}..{first - 1} were purged; the stream starts at {first}",
                first))
            return
        stop = threading.Event()
        fut = self.conn.submit(follow(self.conn, self.stream, self.subject, after_index, deliver, failed, stop,
                                      lambda: self._first, Epochs(epoch)))
        self._follower = (fut, stop)

    def stop_following(self) -> None:
        follower, self._follower = self._follower, None
        if follower is None:
            return
        fut, stop = follower
        stop.set()
        try:
            sub = fut.result(10)
        except Exception:  # noqa: BLE001 - nothing to stop
            return
        if sub is not None:
            try:
                self.conn.run(sub.unsubscribe(), 5)
            except Exception:  # noqa: BLE001
                pass


# ----------------------------------------------------------------------
# coroutines (run on the connection's loop)


async def _publish(conn: NatsConnection, subject: str, pub: _Publish, timeout: float) -> dict | None:
    """The ack (or API error) as a dict; None when no answer came."""
    import nats.errors

    try:
        msg = await conn.request(subject, pub.data, timeout=timeout, headers=pub.headers)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError, asyncio.TimeoutError):
        return None
    except nats.errors.Error as e:
        log.debug("publish error: %r", e)
        return None
    return json.loads(msg.data or b"{}")
