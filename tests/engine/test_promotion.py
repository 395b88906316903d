"""Taking the lead on a shared journal (brain.engine.replication): the epoch
record is appended only while the replica's hold on the election key is
valid, asked after the journal's end was read.

The sequence these guard against (issue 23): X wins the key and stalls
before its epoch; Y takes the key after the election timeout, appends its
epoch and leads, answering linearizable reads from its read lease at its
own last append.  X resumes, reads the journal's end past Y's epoch and
appends its own: X then decides writes that Y's reads never see.  Here
``holds_key`` stands in for X's election, and the in-memory journal for
JetStream."""

from __future__ import annotations

import threading

import pytest

from brain.engine import Engine, EngineConfig
from brain.mvcc import errors
from brain.mvcc.requests import PutRequest, RangeRequest
from tests.support.memory_journal import ClusterStub, MemoryJournal, Stream, key_held

STUBS: dict = {}  # each engine's cluster side


class HookedJournal(MemoryJournal):
    """A replica's journal that runs ``on_end()`` while it reads the
    journal's end: what happens elsewhere while this replica waits for the
    answer (or is paused between asking and using it)."""

    on_end = None

    def end_index(self, callback) -> None:
        hook, self.on_end = self.on_end, None
        if hook is not None:
            hook()
        super().end_index(callback)


@pytest.fixture
def replicas(tmp_path):
    stream = Stream()
    opened: list[Engine] = []

    def open_replica(name: str) -> Engine:
        stub = ClusterStub()
        eng = Engine.open(EngineConfig(data_dir=str(tmp_path / name), backend="memory"),
                          journal=HookedJournal(stream), cluster_id=1, cluster=stub.hooks())
        STUBS[eng] = stub
        opened.append(eng)
        return eng

    yield stream, open_replica
    for eng in opened:
        eng.close()


def _linearizable_get(eng: Engine, key: bytes):
    eng.wait_linearizable()
    return eng.range(RangeRequest(key))


def test_a_replica_whose_hold_ended_appends_no_epoch_and_decides_no_write(replicas):
    """The engine-level reproduction: before the check, X's late promotion
    succeeded, X acknowledged a put at revision 3, and Y (leading within its
    lease) answered a linearizable get at revision 2."""
    stream, open_replica = replicas
    x, y = open_replica("x"), open_replica("y")
    assert y.promote(key_held)
    STUBS[y].lease = True  # Y renews its key: its lease holds throughout
    first = y.put(PutRequest(b"k", b"y"))
    end = len(stream.records)

    assert not x.promote(lambda: False)  # X's hold ended while it stalled
    assert len(stream.records) == end and not x.is_leader
    with pytest.raises(errors.EtcdError):
        x.put(PutRequest(b"k", b"x"))  # a follower with no leader to forward to
    got = _linearizable_get(y, b"k")
    assert got.revision == first.revision and got.kvs[0].value == b"y"
    assert len(stream.records) == end


def test_the_hold_is_asked_after_the_journal_end_is_read(replicas):
    """X's hold is still valid when it starts promoting; while it reads the
    journal's end, Y takes the key and appends its epoch, and X's hold ends.
    X must see that it ended (a check before reading the end would pass)."""
    stream, open_replica = replicas
    x, y = open_replica("x"), open_replica("y")
    held = [True]

    def meanwhile() -> None:
        held[0] = False
        assert y.promote(key_held)

    x.journal.on_end = meanwhile
    assert not x.promote(lambda: held[0])
    assert y.is_leader and not x.is_leader
    records = len(stream.records)
    put = y.put(PutRequest(b"k", b"after"))  # Y's append is not fenced: no epoch of X's came after Y's
    assert put.revision == 2 and len(stream.records) == records + 1


def _another_writers_record(stream: Stream) -> None:
    """A record that lands between a promoting replica's read of the end
    and its epoch (a deposed leader's last batch): an empty record, which
    every replica applies as nothing."""
    with stream.cv:
        stream.records.append(b"")
        stream.cv.notify_all()


def test_a_fenced_promotion_tries_again_while_the_key_is_held(replicas):
    """A hand-over: the old leader's last batch lands after the new key
    holder read the end.  Its epoch is fenced; it catches up and appends
    after that record, its hold still valid."""
    stream, open_replica = replicas
    x = open_replica("x")
    asked: list[int] = []

    def holds() -> bool:
        asked.append(len(stream.records))
        if len(asked) == 1:
            _another_writers_record(stream)  # lands after the end was read
        return True

    assert x.promote(holds)
    assert x.is_leader and len(asked) == 2
    assert len(stream.records) == 2  # the other writer's record, then X's epoch
    assert x.put(PutRequest(b"k", b"v")).revision == 2


def test_a_fenced_promotion_gives_up_once_the_hold_ended(replicas):
    stream, open_replica = replicas
    x = open_replica("x")
    asked: list[int] = []

    def holds() -> bool:
        asked.append(len(stream.records))
        if len(asked) == 1:
            _another_writers_record(stream)
            return True
        return False  # stalled past the hold while catching up

    assert not x.promote(holds)
    assert not x.is_leader and len(asked) == 2 and len(stream.records) == 1


def test_a_promotion_that_gave_up_follows_the_journal_again(replicas):
    stream, open_replica = replicas
    x, y = open_replica("x"), open_replica("y")
    assert not x.promote(lambda: False)
    assert y.promote(key_held)
    put = y.put(PutRequest(b"k", b"v"))
    done = threading.Event()

    def applied() -> None:
        while x.committed_rev < put.revision:
            if done.wait(0.01):
                return

    t = threading.Thread(target=applied, daemon=True)
    t.start()
    t.join(20)
    done.set()
    assert x.committed_rev == put.revision
    assert x.range(RangeRequest(b"k", serializable=True)).kvs[0].value == b"v"
