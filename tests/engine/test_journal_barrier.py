"""Engine.journal_barrier on an in-memory shared journal: a read index is
the index of a record the journal acknowledged after the read began (an
empty one when nothing else is appended), a follower's read waits until it
applied that record, no quorum means no answer (never a stale one), and
barrier records replay as nothing."""

from __future__ import annotations

import threading
import time

import pytest

from brain.engine import Engine, EngineConfig
from brain.journal import JournalFencedError, JournalUnavailableError
from brain.mvcc import errors
from brain.mvcc.requests import PutRequest, RangeRequest

WAIT = 20.0


class Stream:
    """The replicated log the journals share.  ``quorum`` cleared: appends
    are not acknowledged (a stream leader cut off from its peers).
    ``delivering`` cleared: stored records wait before reaching followers."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.cv = threading.Condition()
        self.quorum = threading.Event()
        self.quorum.set()
        self.delivering = threading.Event()
        self.delivering.set()

    def wait_for(self, count: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.records) >= count, WAIT), len(self.records)


class MemoryJournal:
    """One replica's view of ``Stream`` (brain.journal.protocol.SharedJournal)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._last = 0
        self._unsynced: list[tuple[int, bytes]] = []
        self._writing = False
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    first_index = 1

    @property
    def last_index(self) -> int:
        return self._last

    def begin_writing(self, last_index: int) -> None:
        self._writing, self._last, self._unsynced = True, last_index, []

    def stop_writing(self) -> None:
        self._writing, self._unsynced = False, []

    def append(self, payload: bytes) -> int:
        assert self._writing
        self._last += 1
        self._unsynced.append((self._last, payload))
        return self._last

    def sync(self) -> None:
        s = self.stream
        if not s.quorum.is_set():
            raise JournalUnavailableError("no quorum")
        with s.cv:
            for index, payload in self._unsynced:
                if len(s.records) != index - 1:
                    self._unsynced = []
                    raise JournalFencedError("another writer appended", index - 1)
                s.records.append(payload)
            s.cv.notify_all()
        self._unsynced = []

    def records(self, after_index: int = 0):
        with self.stream.cv:
            held = list(self.stream.records)
        for i in range(after_index, len(held)):
            yield i + 1, held[i]

    def end_index(self, callback) -> None:
        with self.stream.cv:
            end = len(self.stream.records)
        callback(end, None)

    def follow(self, after_index: int, deliver, failed) -> None:
        self.stop_following()
        self._stop = stop = threading.Event()

        def run() -> None:
            s, sent = self.stream, after_index
            while not stop.is_set():
                with s.cv:
                    s.cv.wait_for(lambda: len(s.records) > sent or stop.is_set(), 0.1)
                    new = s.records[sent:]
                if not new or not s.delivering.wait(0.1):
                    continue
                for payload in new:
                    sent += 1
                    deliver(sent, payload)

        self._follower = threading.Thread(target=run, daemon=True)
        self._follower.start()

    def stop_following(self) -> None:
        self._stop.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(5)
        self._follower = None

    def release(self, upto_index: int) -> int:
        return 0

    def close(self) -> None:
        self.stop_following()


@pytest.fixture
def replicas(tmp_path):
    stream = Stream()
    opened: list[Engine] = []

    def open_replica(name: str) -> Engine:
        eng = Engine.open(EngineConfig(data_dir=str(tmp_path / name), backend="memory"),
                          journal=MemoryJournal(stream), cluster_id=1)
        opened.append(eng)
        return eng

    yield stream, open_replica
    for eng in opened:
        eng.close()


def barrier(eng: Engine) -> tuple[int | None, BaseException | None]:
    out: list = []
    done = threading.Event()
    eng.journal_barrier(lambda index, exc: (out.append((index, exc)), done.set()))
    assert done.wait(WAIT), "the barrier was not answered"
    return out[0]


def test_a_barrier_is_an_empty_record_acknowledged_after_it_was_asked(replicas):
    stream, open_replica = replicas
    lead = open_replica("a")
    assert lead.promote()
    put = lead.put(PutRequest(b"k", b"v"))
    before = len(stream.records)
    index, exc = barrier(lead)
    # the index read up to is the one before the barrier's record
    assert exc is None and index == before and len(stream.records) == before + 1
    assert stream.records[-1] == b""
    assert lead.committed_rev == put.revision  # a barrier holds no revision


def test_reads_on_a_leader_outside_its_lease_append_a_barrier_within_it_none(replicas):
    stream, open_replica = replicas
    lead = open_replica("a")
    assert lead.promote()
    lead.put(PutRequest(b"k", b"v"))
    before = len(stream.records)
    lead.wait_linearizable()  # no read lease: the journal's quorum confirms
    assert len(stream.records) == before + 1
    lead.read_lease = lambda: True
    lead.wait_linearizable()
    assert len(stream.records) == before + 1


def test_a_follower_refuses_a_barrier_and_its_reads_wait_for_the_leaders(replicas):
    stream, open_replica = replicas
    lead, follower = open_replica("a"), open_replica("b")
    assert lead.promote()
    assert barrier(follower) == (None, errors.ErrNotLeader)
    follower.use_read_index(lead.journal_barrier)  # what brain.cluster's asker reaches
    stream.delivering.clear()  # the follower falls behind
    put = lead.put(PutRequest(b"k", b"v"))
    read: list = []
    reader = threading.Thread(target=lambda: (follower.wait_linearizable(),
                                              read.append(follower.range(RangeRequest(b"k")))))
    reader.start()
    stream.wait_for(put.revision + 1)  # (the epoch record, the put,) the barrier record
    reader.join(0.3)
    assert reader.is_alive() and read == []  # it waits rather than answer without the put
    stream.delivering.set()
    reader.join(WAIT)
    assert read and read[0].kvs[0].value == b"v" and read[0].revision == put.revision


def test_without_a_quorum_a_barrier_waits_and_is_never_answered_stale(replicas):
    stream, open_replica = replicas
    lead = open_replica("a")
    assert lead.promote()
    lead.put(PutRequest(b"k", b"v"))
    stream.quorum.clear()
    out: list = []
    answered = threading.Event()
    lead.journal_barrier(lambda index, exc: (out.append((index, exc)), answered.set()))
    assert not answered.wait(0.5) and out == []
    stream.quorum.set()
    assert answered.wait(WAIT)
    assert out == [(len(stream.records) - 1, None)] and stream.records[-1] == b""


def test_a_replica_that_replays_barrier_records_ends_at_the_same_revision(replicas):
    stream, open_replica = replicas
    lead = open_replica("a")
    assert lead.promote()
    lead.put(PutRequest(b"k", b"1"))
    barrier(lead)
    last = lead.put(PutRequest(b"k", b"2"))
    barrier(lead)
    late = open_replica("c")  # recovers from the journal: every record, barriers too
    late.use_read_index(lead.journal_barrier)
    late.wait_linearizable()
    deadline = time.monotonic() + WAIT
    while late.applied_index < len(stream.records):  # the last barrier too
        assert time.monotonic() < deadline, late.applied_index
        time.sleep(0.01)
    res = late.range(RangeRequest(b"k"))
    assert res.revision == last.revision and res.kvs[0].value == b"2"
