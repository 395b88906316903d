"""One contract, every journal (brain.journal.protocol): the local segment
files and the JetStream stream pass the same tests.

  append/sync/records   what was synced comes back, in order, exactly
  records(after)        from any position; a released position is refused
  large records         larger than a segment / than NATS's max_payload
  torn records          a record never made durable in full is never read
  release               a checkpointed prefix may go; the rest stays
  fencing (shared)      a second writer's append is refused, never interleaved
  follow (shared)       records arrive in order, each once
  end index (shared)    the newest index, for a writer's catch-up
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import pytest

from brain.journal import (
    Journal,
    JournalError,
    JournalFencedError,
    JournalPurgedError,
    SegmentJournal,
    SharedJournal,
)

_names = itertools.count()


class Local:
    shared = False

    def __init__(self, tmp_path):
        self.dir = tmp_path / "journal"
        self.j = SegmentJournal.open(self.dir, segment_bytes=64 * 1024)

    def writer(self):
        return self.j

    def reopen(self):
        self.j.close()
        self.j = SegmentJournal.open(self.dir, segment_bytes=64 * 1024)
        return self.j

    def tear(self, payload: bytes) -> None:
        """Write a record's frame halfway, as a crash during append would."""
        j = self.j
        j.append(payload)
        j.sync()
        # cut the last frame short: the file ends in the middle of it
        seg = sorted(p for p in os.listdir(self.dir) if p.endswith(".journal"))[-1]
        path = os.path.join(self.dir, seg)
        end = j._offset
        with open(path, "r+b") as f:
            f.seek(end - len(payload) // 2)
            f.write(b"\0" * (len(payload) // 2))
        self.reopen()

    def release_then_read(self, upto):
        self.j.release(upto)
        return self.j

    def close(self):
        self.j.close()


class Stream:
    shared = True

    def __init__(self, nats_url):
        from brain.journal.jetstream import JetStreamJournal
        from brain.journal.natsio import NatsConnection

        self.conn = NatsConnection([nats_url])
        self.name = f"contract{next(_names)}x{os.getpid()}"
        self.j = JetStreamJournal.open(self.conn, self.name, replicas=1)
        self.j.begin_writing(self.j.state().last_seq)
        self.others = []

    def writer(self):
        return self.j

    def another(self):
        from brain.journal.jetstream import JetStreamJournal

        j = JetStreamJournal.open(self.conn, self.name, replicas=1)
        self.others.append(j)
        return j

    def reopen(self):
        return self.another()

    def tear(self, payload: bytes) -> None:
        """Publish the first part of a two-part record and nothing more, as
        a leader that died halfway would."""
        j = self.j
        last = j.last_index
        headers = {"Nats-Expected-Last-Sequence": str(last), "Nats-Msg-Id": f"torn-{last + 1}",
                   "Brain-Part": "1/2"}
        self.conn.run(self.conn.nc.request(j.subject, payload[: len(payload) // 2], headers=headers, timeout=5))
        j.begin_writing(last + 1)  # the next writer goes on after the lone first part

    def release_then_read(self, upto):
        self.j.purge(upto + 1)
        return self.another()

    def close(self):
        for j in [self.j, *self.others]:
            j.close()
        self.conn.close()


@pytest.fixture(scope="module")
def nats():
    from tests.support import binaries
    from tests.support.nats_cluster import NatsCluster

    c = NatsCluster(1, binary=binaries.require(binaries.nats_server_binary), lifetime=600.0)
    c.start()
    yield c
    c.cleanup()


@pytest.fixture(params=["local", "jetstream"])
def impl(request, tmp_path):
    if request.param == "local":
        made = Local(tmp_path)
    else:
        made = Stream(request.getfixturevalue("nats").urls[0])
    yield made
    made.close()


@pytest.fixture
def shared(nats):
    """The shared journals only (fencing, following and the read index
    have no meaning for a journal with one writer and one reader)."""
    made = Stream(nats.urls[0])
    yield made
    made.close()


def payload(i: int, size: int = 100) -> bytes:
    return (b"%08d" % i) * (size // 8 + 1)


def test_it_is_a_journal(impl):
    assert isinstance(impl.writer(), Journal)
    assert isinstance(impl.writer(), SharedJournal) == impl.shared


def test_synced_records_come_back_in_order_from_any_position(impl):
    j = impl.writer()
    start = j.last_index
    indexes = []
    for i in range(30):
        indexes.append(j.append(payload(i, 10 + i * 7)))
        if i % 4 == 3:
            j.sync()
    j.sync()
    assert indexes == sorted(indexes) and len(set(indexes)) == 30 and indexes[0] > start
    assert j.last_index == indexes[-1]
    reader = impl.reopen()
    got = list(reader.records(after_index=start))
    assert got == [(idx, payload(i, 10 + i * 7)) for i, idx in enumerate(indexes)]
    mid = indexes[17]
    assert [i for i, _ in reader.records(after_index=mid)] == indexes[18:]
    assert list(reader.records(after_index=indexes[-1])) == []


def test_records_larger_than_a_segment_or_a_message(impl):
    j = impl.writer()
    start = j.last_index
    big = os.urandom(3 * 1024 * 1024 + 17)  # over a 64 KiB segment and NATS's 1 MiB max_payload
    small = b"after"
    j.append(big)
    j.append(small)
    j.sync()
    got = list(impl.reopen().records(after_index=start))
    assert [p for _, p in got] == [big, small]


def test_a_record_never_made_durable_in_full_is_never_read(impl):
    j = impl.writer()
    start = j.last_index
    j.append(b"whole-1")
    j.sync()
    impl.tear(b"T" * 4000)
    j = impl.writer() if impl.shared else impl.j
    j.append(b"whole-2")
    j.sync()
    got = [p for _, p in impl.reopen().records(after_index=start)]
    assert got == [b"whole-1", b"whole-2"]


def test_released_records_may_go_and_later_ones_stay(impl):
    j = impl.writer()
    start = j.last_index
    indexes = []
    for i in range(40):
        indexes.append(j.append(payload(i, 4000)))  # 40 x 4 KiB: several 64 KiB segments
        j.sync()
    cut = indexes[24]
    reader = impl.release_then_read(cut)
    assert [i for i, _ in reader.records(after_index=cut)] == indexes[25:]
    if reader.first_index > start + 1:
        with pytest.raises(JournalError):
            list(reader.records(after_index=start))


def test_a_second_writer_is_fenced_not_interleaved(shared):
    impl = shared
    a = impl.writer()
    a.append(b"a1")
    a.sync()
    b = impl.another()
    b.begin_writing(a.last_index)
    b.append(b"b1")
    b.sync()
    a.append(b"a2")  # a still thinks it is the writer
    with pytest.raises(JournalFencedError):
        a.sync()
    b.append(b"b2")
    b.sync()
    tail = [p for _, p in b.records(after_index=0)][-3:]
    assert tail == [b"a1", b"b1", b"b2"]
    # a retry of the same append after an unknown outcome is not duplicated
    n = b.last_index
    b.append(b"once")
    b._send(b._unacked[0])  # the publish goes out twice, same id and fence
    b.sync()
    assert [p for i, p in b.records(after_index=n)] == [b"once"]


def test_follow_delivers_each_record_once_in_order(shared):
    impl = shared
    w = impl.writer()
    start = w.last_index
    for i in range(5):
        w.append(payload(i))
    w.sync()
    reader = impl.another()
    got = []
    done = threading.Event()

    def deliver(index, data):
        got.append((index, data))
        if len(got) == 25:
            done.set()

    reader.follow(start, deliver, lambda e: got.append(("failed", e)))
    for i in range(5, 25):
        w.append(payload(i, 20_000 if i == 10 else 100))
        if i % 3 == 0:
            w.sync()
    w.sync()
    assert done.wait(15), got[-3:]
    time.sleep(0.2)
    reader.stop_following()
    assert [d for _, d in got] == [payload(i, 20_000 if i == 10 else 100) for i in range(25)]
    assert [i for i, _ in got] == sorted(i for i, _ in got)
    # following from a purged position is refused, not silently skipped
    w.purge(w.last_index)
    failed = []
    impl.another().follow(start, lambda i, d: None, failed.append)
    assert failed and isinstance(failed[0], JournalPurgedError)


def test_end_index_is_the_newest_index(shared):
    impl = shared
    w = impl.writer()
    w.append(b"x")
    w.sync()
    out = []
    done = threading.Event()
    impl.another().end_index(lambda index, exc: (out.append((index, exc)), done.set()))
    assert done.wait(5)
    assert out == [(w.last_index, None)]


# -- pipelined appends (a journal that says ``pipelined``: JetStream) ----------


def test_appends_made_while_a_sync_waits_land_in_order(shared):
    """The leader appends while its syncing thread waits for earlier
    acknowledgements (brain.engine.pipeline): every record lands once, in
    append order, and each sync covers what was appended before it."""
    import threading

    j = shared.writer()
    assert getattr(j, "pipelined", False)
    start = j.last_index
    payloads = [b"p%03d" % i for i in range(60)]
    stop = threading.Event()
    errors_seen: list = []

    def syncing() -> None:
        while not stop.is_set():
            try:
                j.sync()
            except Exception as e:  # noqa: BLE001
                errors_seen.append(e)
                return

    t = threading.Thread(target=syncing)
    t.start()
    try:
        for p in payloads:
            j.append(p)
    finally:
        stop.set()
        t.join(30)
    j.sync()
    assert errors_seen == []
    assert [p for _, p in shared.another().records(after_index=start)] == payloads


def test_a_fence_found_by_one_sync_fails_every_later_append_and_sync(shared):
    """A refusal (another writer appended) fails that record and every one
    appended after it, and no later sync may report them durable: the
    committer takes a quiet sync for an acknowledgement.  The records that
    were already on their way land after the other writer's (each expects
    the place before it, and the other writer's record is there): every
    reader, reading or following, takes them for empty records, written in
    an older epoch than the newest it has seen."""
    from brain.journal import JournalFencedError

    j = shared.writer()
    end = j.last_index
    j.begin_writing(end, 5)
    other = shared.another()
    other.begin_writing(end, 6)
    other.append(b"theirs")
    other.sync()
    for p in (b"a", b"b", b"c"):
        j.append(p)
    with pytest.raises(JournalFencedError):
        j.sync()
    with pytest.raises(JournalFencedError):
        j.sync()
    with pytest.raises(JournalFencedError):
        j.append(b"d")
    reader = shared.another()
    deadline = time.monotonic() + 10
    while reader.state().last_seq < end + 3 and time.monotonic() < deadline:  # b and c land, after theirs
        time.sleep(0.05)
    got = [p for _, p in reader.records(after_index=end, epoch=5)]
    assert got == [b"theirs", b"", b""], got
    assert _followed(shared, end, 3, epoch=5) == [b"theirs", b"", b""]


def _followed(shared, after: int, n: int, epoch: int) -> list[bytes]:
    """The first ``n`` records a follower from ``after`` is handed, its
    store at ``epoch``."""
    import threading

    followed: list = []
    done = threading.Event()

    def deliver(index, payload) -> None:
        followed.append(payload)
        if len(followed) == n:
            done.set()

    follower = shared.another()
    follower.follow(after, deliver, lambda exc: done.set(), epoch=epoch)
    try:
        assert done.wait(10)
    finally:
        follower.stop_following()
    return followed


# The new writer's appends after the old writer's stale message: the first
# message is refused (the stale one took its place), the rest land after it
# in the newest epoch.  Three records, or one record of four parts (over
# NATS's 1 MiB max_payload): a stale run may end inside a record.
AFTER_STALE = {"records": ([b"n1", b"n2", b"n3"], 2), "parts": ([b"p" * (3 * 1024 * 1024 + 17)], 3)}


@pytest.mark.parametrize("appends", sorted(AFTER_STALE))
def test_a_fenced_new_writers_records_after_a_stale_message_are_stale_too(shared, appends):
    """The case CI met under kill -9 of leaders (jetstream_reading.Epochs):
    the old writer's record on its way lands right after the new writer's
    first; the new writer's next message, which expected that place, is
    refused, and the ones after it, which expected the stale message's
    place and the next, land after it in the newest epoch.  Every reader
    takes those for empty records (read as records they would follow
    revisions nobody applied, and every replica would stop there; parts of
    a record never complete), and the next writer's records for what they
    are."""
    from brain.journal import JournalFencedError

    payloads, landed = AFTER_STALE[appends]
    old = shared.writer()
    end = old.last_index
    old.begin_writing(end, 5)
    new = shared.another()
    new.begin_writing(end, 6)
    new.append(b"epoch 6")
    new.sync()
    for p in (b"a", b"b"):  # a is refused; b expected a's place and lands after "epoch 6"
        old.append(p)
    with pytest.raises(JournalFencedError):
        old.sync()
    reader = shared.another()
    deadline = time.monotonic() + 10
    while reader.state().last_seq < end + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader.state().last_seq == end + 2
    for p in payloads:
        new.append(p)
    with pytest.raises(JournalFencedError):
        new.sync()
    while reader.state().last_seq < end + 2 + landed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader.state().last_seq == end + 2 + landed
    nxt = shared.another()
    nxt.begin_writing(end + 2 + landed, 7)
    nxt.append(b"epoch 7")
    nxt.append(b"x")
    nxt.sync()
    expected = [b"epoch 6", b""] + [b""] * landed + [b"epoch 7", b"x"]
    assert [p for _, p in reader.records(after_index=end, epoch=5)] == expected
    assert _followed(shared, end, len(expected), epoch=5) == expected
