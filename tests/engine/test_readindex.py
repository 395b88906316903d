"""brain.engine.readindex: linearizable reads wait for one journal round
trip sent after they began, and for the replica to apply up to its
answer; failures and timeouts reach every waiting read."""

from __future__ import annotations

from brain.engine.readindex import ReadBarrier
from brain.mvcc import errors


class Journal:
    """Round trips the test answers by hand."""

    def __init__(self) -> None:
        self.asked: list = []

    def ask(self, callback) -> None:
        self.asked.append(callback)


def make(applied=0, **kw):
    j = Journal()
    state = {"applied": applied}
    b = ReadBarrier(j.ask, lambda: state["applied"], **kw)
    return j, state, b


def test_reads_that_arrive_during_a_round_trip_wait_for_the_next():
    j, state, b = make(applied=40)
    done = []
    b.request(lambda e: done.append(("r1", e)))
    b.request(lambda e: done.append(("r2", e)))  # r1's trip is in flight: r2 waits for the next
    assert len(j.asked) == 1
    j.asked[0](42, None)  # r1 must wait for index 42; r2's trip goes out
    assert done == [] and len(j.asked) == 2
    state["applied"] = 42
    b.applied(42)
    assert done == [("r1", None)]
    j.asked[1](42, None)  # already applied: r2 goes at once
    assert done == [("r1", None), ("r2", None)]


def test_a_round_trip_answered_below_the_applied_index_releases_at_once():
    j, state, b = make(applied=10)
    done = []
    b.request(done.append)
    j.asked[0](9, None)
    assert done == [None]


def test_a_failed_round_trip_fails_its_reads_with_an_etcd_error():
    j, _, b = make()
    done = []
    b.request(done.append)
    j.asked[0](None, RuntimeError("no quorum"))
    assert done == [errors.ErrTimeout]
    b.request(done.append)
    j.asked[1](None, errors.ErrNoLeader)
    assert done[-1] == errors.ErrNoLeader


def test_reads_that_wait_too_long_time_out():
    now = [0.0]
    j, _, b = make(timeout=5.0, clock=lambda: now[0])
    done = []
    b.request(done.append)
    j.asked[0](7, None)
    now[0] = 4.0
    b.expire()
    assert done == []
    now[0] = 5.5
    b.expire()
    assert done == [errors.ErrTimeout]


def test_an_index_past_this_replica_is_reported():
    ahead = []
    j, _, b = make(applied=3, ahead=ahead.append)
    b.request(lambda e: None)
    j.asked[0](9, None)
    assert ahead == [9]


def test_fail_all_answers_everyone():
    j, _, b = make()
    done = []
    b.request(done.append)
    b.request(done.append)
    j.asked[0](5, None)
    b.fail_all(errors.ErrStopped)
    assert sorted(map(repr, done)) == [repr(errors.ErrStopped)] * 2


def test_round_trips_overlap_up_to_the_limit():
    j, state, b = make(applied=5, max_in_flight=2)
    done = []
    b.request(lambda e: done.append(("r1", e)))
    b.request(lambda e: done.append(("r2", e)))  # a second round trip at once
    b.request(lambda e: done.append(("r3", e)))  # the limit: r3 waits
    assert len(j.asked) == 2
    j.asked[1](5, None)  # r2's answer first: r2 goes, r3's trip is sent
    assert done == [("r2", None)] and len(j.asked) == 3
    j.asked[0](5, None)
    j.asked[2](5, None)
    assert sorted(done) == [("r1", None), ("r2", None), ("r3", None)]
    assert b._in_flight == 0


def test_a_known_index_waits_only_until_applied():
    j, state, b = make(applied=7)
    done = []
    assert b.wait_index(7, done.append) is True and done == []
    assert b.wait_index(9, done.append) is False and j.asked == []  # no round trip
    state["applied"] = 9
    b.applied(9)
    assert done == [None]


def test_reads_whose_round_trip_never_answers_time_out_too():
    """A journal that does not answer (a stream leader cut from its peers):
    the reads of the round trip in flight, and those queued behind it, fail
    with etcd's timeout once they waited the request timeout; the round
    trip's late answer then answers no one and lets the next one go."""
    now = [0.0]
    j, state, b = make(applied=10, timeout=5.0, clock=lambda: now[0])
    done = []
    b.request(lambda e: done.append(("r1", e)))  # its round trip goes out and hangs
    now[0] = 2.0
    b.request(lambda e: done.append(("r2", e)))  # queued behind it
    now[0] = 4.9
    b.expire()
    assert done == [] and len(j.asked) == 1
    now[0] = 5.0
    b.expire()
    assert done == [("r1", errors.ErrTimeout)]
    now[0] = 7.0
    b.expire()
    assert done == [("r1", errors.ErrTimeout), ("r2", errors.ErrTimeout)]
    b.request(lambda e: done.append(("r3", e)))  # the slot is still taken: r3 waits
    assert len(j.asked) == 1
    j.asked[0](9, None)  # the late answer: no one of r1 and r2 again; r3's trip goes out
    assert len(done) == 2 and len(j.asked) == 2
    j.asked[1](10, None)
    assert done[-1] == ("r3", None)
