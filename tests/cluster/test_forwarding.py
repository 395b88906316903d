"""brain.cluster.forwarding's wait for a leader's answer, on a real NATS
server: "leaders" here are plain subscribers that answer, or never do, as
a test says; the election's view is a value the test sets."""

from __future__ import annotations

import random
import threading
import time

import pytest

from brain.cluster import codec
from brain.cluster.forwarding import HANDOVER_GRACE, Forwarder, subject_of
from brain.journal.natsio import NatsConnection
from brain.mvcc import errors

OLD, NEW = 0xA1, 0xB2


class Leaders:
    """Subscribers on two members' forwarding subjects; ``answers[member]``
    is the delay before it replies "ok" (None: it never replies)."""

    def __init__(self, conn: NatsConnection, name: str, answers: dict) -> None:
        self.conn, self.answers, self.asked = conn, answers, []
        for member in answers:
            conn.run(conn.nc.subscribe(subject_of(name, member), cb=self._handler(member)), 5)
        conn.run(conn.nc.flush(), 5)

    def _handler(self, member: int):
        import asyncio

        async def on_msg(msg) -> None:
            self.asked.append(member)
            delay = self.answers[member]
            if delay is None:
                return  # a leader killed after it took the message
            await asyncio.sleep(delay)
            await msg.respond(codec.encode(["ok", f"from {member:x}"]))

        return on_msg


@pytest.fixture
def conn(nats1):
    c = NatsConnection(list(nats1.urls), name="fwd-test")
    yield c
    c.close()


def _outcome(send) -> tuple[object, float]:
    """What ``send(finish)`` finished with (a result or an EtcdError) and
    how long it took."""
    got = threading.Event()
    box: list = []
    t0 = time.monotonic()
    send(lambda outcome: (box.extend([outcome, time.monotonic() - t0]), got.set()))
    assert got.wait(15), "no outcome"
    return box[0], box[1]


def _write(f: Forwarder):
    return lambda finish: f.forward([b"w"], finish)


def _call(f: Forwarder, op: str):
    return lambda finish: f.call(op, [], lambda result, exc: finish(exc if exc is not None else result))


def test_a_write_in_flight_to_a_leader_found_dead_is_answered_at_once(conn):
    Leaders(conn, "fwd1", {OLD: None})
    view = [OLD]
    f = Forwarder(conn, "fwd1", lambda: OLD, elected=lambda: view[0])
    threading.Timer(0.3, lambda: view.__setitem__(0, 0)).start()  # silent for the election timeout
    outcome, took = _outcome(_write(f))
    assert outcome == errors.ErrTimeoutDueToLeaderFail, outcome
    assert took < 1.5, took  # not the 7 s request timeout
    assert f.abandoned == 1


def test_a_read_index_in_flight_to_a_dead_leader_asks_the_next_one(conn):
    leaders = Leaders(conn, "fwd2", {OLD: None, NEW: 0.0})
    view = [OLD]
    asked = [OLD]
    f = Forwarder(conn, "fwd2", lambda: asked[0], elected=lambda: view[0])

    def elect_new() -> None:
        view[0] = 0
        time.sleep(0.1)
        asked[0] = view[0] = NEW

    threading.Timer(0.3, elect_new).start()
    outcome, took = _outcome(_call(f, "ri"))
    assert outcome == f"from {NEW:x}", outcome
    assert leaders.asked[:1] == [OLD] and NEW in leaders.asked
    assert took < 2.0, took


def test_a_leader_that_handed_over_still_answers_what_it_took(conn):
    Leaders(conn, "fwd3", {OLD: HANDOVER_GRACE / 2, NEW: 0.0})
    view = [OLD]
    f = Forwarder(conn, "fwd3", lambda: OLD, elected=lambda: view[0])
    threading.Timer(0.05, lambda: view.__setitem__(0, NEW)).start()  # a hand-over, not a death
    outcome, _ = _outcome(_write(f))
    assert outcome == f"from {OLD:x}", outcome
    assert f.abandoned == 0


def test_without_the_election_view_a_silent_leader_times_out(conn):
    Leaders(conn, "fwd4", {OLD: None})
    f = Forwarder(conn, "fwd4", lambda: OLD, timeout=1.0)
    outcome, took = _outcome(_write(f))
    assert outcome == errors.ErrTimeout and took >= 0.9, (outcome, took)


def test_no_responders_is_asked_again_until_a_leader_listens(conn):
    """A message to a replica that is gone gets NATS's "no responders":
    nothing was applied, so it goes to whoever leads next."""
    Leaders(conn, "fwd5", {NEW: 0.0})
    asked = [OLD]  # nobody listens on OLD's subject
    f = Forwarder(conn, "fwd5", lambda: asked[0], elected=lambda: asked[0])
    threading.Timer(0.3, lambda: asked.__setitem__(0, NEW)).start()
    outcome, took = _outcome(_write(f))
    assert outcome == f"from {NEW:x}", outcome
    assert f.retried >= 1 and took >= 0.25, (f.retried, took)


def test_many_messages_in_flight_each_get_their_own_answer(conn):
    """Hundreds in flight at once, answered out of order: each caller is
    told once, with its own answer, and the watcher stops when none is left."""
    import asyncio

    async def answer(msg) -> None:
        await asyncio.sleep(random.uniform(0, 0.2))
        await msg.respond(codec.encode(["ok", codec.decode(msg.data)[1]]))

    async def on_msg(msg) -> None:  # (a subscription's callbacks run one at a time)
        asyncio.get_running_loop().create_task(answer(msg))

    conn.run(conn.nc.subscribe(subject_of("fwd6", NEW), cb=on_msg), 5)
    conn.run(conn.nc.flush(), 5)
    f = Forwarder(conn, "fwd6", lambda: NEW, elected=lambda: NEW)
    answers: dict[int, list] = {i: [] for i in range(300)}
    all_in = threading.Event()

    def finish(i):
        def done(outcome) -> None:
            answers[i].append(outcome)
            if all(answers.values()):
                all_in.set()
        return done

    for i in range(300):
        f.forward([i], finish(i))
    assert all_in.wait(15), [i for i, a in answers.items() if not a][:10]
    time.sleep(0.3)
    wrong = {i: a for i, a in answers.items() if a != [[i]]}
    assert not wrong, list(wrong.items())[:5]
    assert f.abandoned == 0


def test_a_write_in_flight_when_its_connection_drops_times_out_at_once(nats_cluster_factory):
    """No answer can come on a connection that dropped: the caller is told
    "request timed out" (it may have been applied) when the connection
    drops, not after the request timeout, and the leader is not counted
    as abandoned."""
    server = nats_cluster_factory(1)
    c = NatsConnection(list(server.urls), name="fwd-drop")
    try:
        Leaders(c, "fwd7", {OLD: None})
        f = Forwarder(c, "fwd7", lambda: OLD, elected=lambda: OLD, timeout=60.0)
        restart = threading.Timer(0.5, lambda: server.restart(server.nodes[0]))
        restart.start()
        outcome, took = _outcome(_write(f))
        restart.join(60)  # (the answer comes before the server is back)
        assert outcome == errors.ErrTimeout, outcome
        # the restart takes a while on a loaded machine; 60 s would be the timeout waited out
        assert took < 15.0, took
        assert f.abandoned == 0
    finally:
        c.close()


def test_a_request_that_fails_unexpectedly_is_told_it_timed_out(conn, caplog):
    """An error nobody planned for, after the message may have left: the
    caller gets etcd's answer to not knowing (request timed out), the error
    is logged, and the next message goes out as usual."""
    Leaders(conn, "fwd8", {NEW: 0.0})
    f = Forwarder(conn, "fwd8", lambda: NEW, elected=lambda: NEW)
    real = conn.start_request
    fail = [True]

    async def broken() -> None:
        raise RuntimeError("a bug below the forwarder")

    def start_request(subject, data, *, timeout):
        if fail[0]:
            fail[0] = False
            return conn.loop.create_task(broken()), conn.loop.create_future()  # (a connection that stays up)
        return real(subject, data, timeout=timeout)

    conn.start_request = start_request
    with caplog.at_level("ERROR", logger="brain.cluster.forwarding"):
        outcome, took = _outcome(_write(f))
    assert outcome == errors.ErrTimeout and took < 1.0, (outcome, took)
    assert any("a bug below the forwarder" in r.getMessage() for r in caplog.records), caplog.records
    outcome, _ = _outcome(_write(f))
    assert outcome == f"from {NEW:x}", outcome
