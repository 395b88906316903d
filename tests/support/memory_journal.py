"""An in-memory shared journal for engine tests: the replicated log
several engines share (``Stream``) and each replica's view of it
(``MemoryJournal``, brain.journal.protocol.SharedJournal), with the faults a
test may set: no quorum, delivery held back."""

from __future__ import annotations

import threading

from brain.journal import JournalFencedError, JournalUnavailableError

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

    def begin_writing(self, last_index: int, epoch: int = 0) -> None:
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

    def records(self, after_index: int = 0, epoch: int = 0):
        with self.stream.cv:
            held = list(self.stream.records)
        for i in range(after_index, len(held)):
            yield i + 1, held[i]

    def end_index(self, callback) -> None:
        with self.stream.cv:
            end = len(self.stream.records)
        callback(end, None)

    def follow(self, after_index: int, deliver, failed, epoch: int = 0) -> None:
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


def key_held() -> bool:
    """What a replica's election answers while its hold on the key is
    valid (brain.cluster.election.Election.holds_key): tests that promote an
    engine directly say so."""
    return True


class ClusterStub:
    """The cluster side of an engine opened on a MemoryJournal
    (brain.engine.ClusterHooks): nobody to forward to, a leader always
    known, and a read lease the test turns on (``lease``)."""

    def __init__(self) -> None:
        self.lease = False
        self.epochs_everywhere = True  # every replica reads stale messages as empty (appends may be in flight)

    def hooks(self):
        from brain.engine import ClusterHooks

        return ClusterHooks(forwarder=lambda: None, leader_hint=lambda: 0, has_leader=lambda: True,
                            election_timeout=1.0, role_changed=lambda: None, read_lease=lambda: self.lease,
                            pipeline_allowed=lambda: self.epochs_everywhere)



class PipelinedMemoryJournal(MemoryJournal):
    """A MemoryJournal that takes appends while a sync waits, as JetStream
    does (brain.engine.pipeline): each record fenced on the one before,
    stored and acknowledged only while ``acks`` is set, so a test holds
    batches in flight."""

    pipelined = True

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream)
        self.acks = threading.Event()
        self.acks.set()
        self._lock = threading.Lock()
        self._fenced = False

    def begin_writing(self, last_index: int, epoch: int = 0) -> None:
        with self._lock:
            super().begin_writing(last_index, epoch)
            self._fenced = False

    def stop_writing(self) -> None:
        with self._lock:
            super().stop_writing()

    def append(self, payload: bytes) -> int:
        with self._lock:
            if self._fenced:
                raise JournalFencedError("another writer appended", self._last)
            return super().append(payload)

    def sync(self) -> None:
        with self._lock:
            if self._fenced:
                raise JournalFencedError("another writer appended", self._last)
            pending = list(self._unsynced)
        s = self.stream
        while not self.acks.wait(0.05):
            if not s.quorum.is_set():
                raise JournalUnavailableError("no quorum")
        if not s.quorum.is_set():
            raise JournalUnavailableError("no quorum")
        with s.cv:
            for index, payload in pending:
                if len(s.records) != index - 1:
                    with self._lock:
                        self._fenced, self._unsynced = True, []
                    raise JournalFencedError("another writer appended", index - 1)
                s.records.append(payload)
            s.cv.notify_all()
        with self._lock:
            if self._unsynced[:len(pending)] == pending:
                del self._unsynced[:len(pending)]
