"""Reading the journal's stream: the records it has now, through ephemeral
pull consumers (the reader's pace sets the flow), and following it, through
an ordered push consumer (lowest latency, re-created by the client on any
gap).  A record larger than a message comes in parts, each a message with
the header ``Brain-Part: k/n``; ``Assembler`` puts them back together and
drops a record whose parts were never all published (its writer died
halfway; its clients were never answered).  ``Epochs`` reads a message
that a deposed writer had on its way, which landed after the next writer's
epoch (``Brain-Epoch`` older than the newest seen), and a record of the
newest epoch that landed right after such a message (its writer was fenced
there), as an empty record: never acknowledged to its writer, it holds
nothing anyone saw."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterator

from .errors import JournalPurgedError, JournalUnavailableError
from .natsio import NatsConnection, when_answering

log = logging.getLogger("brain.journal.jetstream")

PART_HEADER = "Brain-Part"
EPOCH_HEADER = "Brain-Epoch"
FETCH_BATCH = 512
PULL_WAIT = 30.0  # seconds a read of records the stream has waits for the next of them


class Assembler:
    """Puts records back together from their messages, in stream order."""

    __slots__ = ("parts", "expect")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.expect = 0  # parts of the record being assembled

    def add(self, seq: int, data: bytes, part: str | None) -> bytes | None:
        """The record completed by this message, or None."""
        if part is None:
            if self.parts:
                log.warning("dropping a record whose %d of %d parts were published before message %d",
                            len(self.parts), self.expect, seq)
                self.parts = []
            return data
        k, _, n = part.partition("/")
        k, n = int(k), int(n)
        if k == 1:
            if self.parts:
                log.warning("dropping an incomplete record before message %d", seq)
            self.parts, self.expect = [data], n
        elif self.parts and k == len(self.parts) + 1 and n == self.expect:
            self.parts.append(data)
        else:
            if self.parts:
                log.warning("dropping an incomplete record at message %d", seq)
            self.parts = []
            return None
        if len(self.parts) == self.expect:
            record = b"".join(self.parts)
            self.parts = []
            return record
        return None


class Epochs:
    """The newest writer's epoch seen in the stream, from the reader's
    store's (``epoch``), and whether the message before was stale.  A
    message is stale when its epoch is older than the newest, or when it
    is of the newest epoch but follows a stale message: a writer's
    records chain on its own (each expects its previous one's sequence),
    so a record of the current epoch that landed right after a deposed
    writer's stale message expected that place for a record of its own
    that was refused: the current writer was fenced there, and this record
    of its pipeline, already on its way, is stale too (never acknowledged,
    like the refused one before it).

    Worked example (seen in CI under kill -9 of leaders): the new leader's
    epoch record lands at 5195; the old leader's last record on its way
    lands at 5196 (epoch 6: stale); the new leader's first record, which
    expected 5195 as the last, is refused, and its second, which expected
    5196, lands at 5197 in epoch 7: stale, since 5196 was.  Read as a
    record it would follow a revision nobody applied, and every replica
    would stop applying there.  The next writer's epoch record (a newer
    epoch) is never stale: it expects whatever end it read.

    Messages without the header (a test's writer, or a brain before epochs
    were written) are never stale: such writers had one record in flight.
    A reader that starts right after a stale message does not know it was
    one (its store's epoch is all it has)."""

    __slots__ = ("newest", "after_stale", "reason")

    def __init__(self, epoch: int) -> None:
        self.newest = epoch
        self.after_stale = False
        self.reason = ""  # why the last message ``stale`` judged was stale, for the log

    def stale(self, header: str | None) -> bool:
        if header is None:
            self.after_stale = False
            return False
        epoch = int(header)
        if epoch < self.newest:
            self.reason = f"written in epoch {epoch}, older than {self.newest}"
        elif epoch == self.newest and self.after_stale:
            self.reason = f"written in epoch {epoch} after a stale message: its writer was fenced before it"
        else:
            self.newest = epoch
            self.after_stale = False
            return False
        self.after_stale = True
        return True


def pull(conn: NatsConnection, stream: str, subject: str, start: int, stop: int,
         first_index: Callable[[], int], epochs: Epochs) -> Iterator[tuple[int, bytes]]:
    """Records from ``start`` to ``stop``, which the stream said it has.
    A fetch that brings nothing or fails (a consumer lost with its
    server, a NATS cluster still placing it) is retried on a new
    consumer from the next sequence; after PULL_WAIT seconds without a
    message, JournalUnavailableError."""
    assembler = Assembler()  # kept across consumers: a record may span them
    seq = start - 1
    deadline = time.monotonic() + PULL_WAIT
    while seq < stop:
        psub = conn.run(when_answering(
            lambda: _pull_subscribe(conn, stream, subject, seq + 1),
            f"{stream}: reading from {seq + 1}", PULL_WAIT), PULL_WAIT + 10)
        try:
            while seq < stop:
                msgs = conn.run(_fetch(psub, min(FETCH_BATCH, stop - seq)), 30)
                if not msgs:
                    break
                deadline = time.monotonic() + PULL_WAIT
                for m_seq, data, part, epoch in msgs:
                    if m_seq != seq + 1 and seq + 1 < first_index():
                        raise JournalPurgedError(f"{stream}: message {seq + 1} was purged", m_seq)
                    seq = m_seq
                    if epochs.stale(epoch):
                        log.warning("%s: message %d was %s: read as an empty record (never acknowledged)",
                                    stream, m_seq, epochs.reason)
                        yield m_seq, b""
                        continue
                    record = assembler.add(m_seq, data, part)
                    if record is not None:
                        yield m_seq, record
                    if seq >= stop:
                        break
        finally:
            try:
                conn.run(psub.unsubscribe(), 5)
            except Exception:  # noqa: BLE001 - the consumer expires on its own
                pass
        if seq < stop:
            if time.monotonic() >= deadline:
                raise JournalUnavailableError(
                    f"{stream}: no messages after {seq} (expected up to {stop}) for {PULL_WAIT:g}s")
            log.info("%s: reading after %d brought nothing; reading again on a new consumer", stream, seq)
            time.sleep(0.25)


async def _pull_subscribe(conn: NatsConnection, stream: str, subject: str, start: int):
    from nats.js import api

    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
        ack_policy=api.AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True, num_replicas=1)
    return await conn.js.pull_subscribe(subject, durable=None, stream=stream, config=config)


async def _fetch(psub, want: int) -> list[tuple[int, bytes, str | None, str | None]]:
    import nats.errors

    try:
        msgs = await psub.fetch(batch=want, timeout=5)
    except (nats.errors.Error, asyncio.TimeoutError) as e:
        # nothing within the wait, no responders, the consumer gone with its
        # server (nats.js.errors.APIError is a nats.errors.Error): the caller
        # reads again on a new consumer
        log.debug("fetch: %r", e)
        return []
    out = []
    for m in msgs:
        headers = m.headers or {}
        out.append((m.metadata.sequence.stream, m.data, headers.get(PART_HEADER), headers.get(EPOCH_HEADER)))
    return out


async def follow(conn: NatsConnection, stream: str, subject: str, after_index: int, deliver, failed,
                 stop: threading.Event, first_index: Callable[[], int], epochs: Epochs):
    """(on the connection's loop) Records after ``after_index`` handed to
    ``deliver(index, record)`` as the stream gets them, through an ordered
    push consumer; ``failed(exc)`` when it cannot go on.  The subscription,
    or None when it could not be made."""
    from nats.js import api

    assembler = Assembler()
    expected = [after_index + 1]

    async def on_msg(m) -> None:
        if stop.is_set():
            return
        seq = m.metadata.sequence.stream
        if seq < expected[0]:
            return  # redelivered after a consumer reset
        if seq > expected[0] and expected[0] < first_index():
            stop.set()
            failed(JournalPurgedError(f"{stream}: message {expected[0]} was purged before this "
                                      f"replica read it", seq))
            return
        expected[0] = seq + 1
        headers = m.headers or {}
        if epochs.stale(headers.get(EPOCH_HEADER)):
            log.warning("%s: message %d was %s: read as an empty record (never acknowledged)",
                        stream, seq, epochs.reason)
            deliver(seq, b"")
            return
        record = assembler.add(seq, m.data, headers.get(PART_HEADER))
        if record is not None:
            deliver(seq, record)

    config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_index + 1)
    try:
        return await conn.js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True, config=config,
                                       idle_heartbeat=1.0, pending_msgs_limit=-1, pending_bytes_limit=-1)
    except Exception as e:  # noqa: BLE001 - reported to the engine
        failed(JournalUnavailableError(f"{stream}: cannot follow from {after_index + 1}: {e!r}"))
        return None
