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
from brain.mvcc import errors
from brain.mvcc.requests import PutRequest, RangeRequest
from tests.support.memory_journal import WAIT, ClusterStub, MemoryJournal, Stream, key_held

STUBS: dict = {}  # each engine's cluster side


@pytest.fixture
def replicas(tmp_path):
    stream = Stream()
    opened: list[Engine] = []

    def open_replica(name: str) -> Engine:
        stub = ClusterStub()
        eng = Engine.open(EngineConfig(data_dir=str(tmp_path / name), backend="memory"),
                          journal=MemoryJournal(stream), cluster_id=1, cluster=stub.hooks())
        STUBS[eng] = stub
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
    assert lead.promote(key_held)
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
    assert lead.promote(key_held)
    lead.put(PutRequest(b"k", b"v"))
    before = len(stream.records)
    lead.wait_linearizable()  # no read lease: the journal's quorum confirms
    assert len(stream.records) == before + 1
    STUBS[lead].lease = True
    lead.wait_linearizable()
    assert len(stream.records) == before + 1


def test_a_follower_refuses_a_barrier_and_its_reads_wait_for_the_leaders(replicas):
    stream, open_replica = replicas
    lead, follower = open_replica("a"), open_replica("b")
    assert lead.promote(key_held)
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
    assert lead.promote(key_held)
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
    assert lead.promote(key_held)
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
