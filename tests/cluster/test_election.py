"""brain.cluster.election on a key-value bucket the test controls, with a
clock the test moves: when a candidate may take over a key, and how long
the holder's read lease lasts.  No NATS."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest

from brain.cluster import election as election_mod
from brain.cluster.election import Election


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Entry:
    value: bytes
    revision: int


class Bucket:
    """The election key; ``get`` takes ``get_takes`` seconds of the test's
    clock (a slow answer), during which ``during_get`` may change the key
    (the holder renewing while the question is on its way)."""

    def __init__(self, clock: Clock, holder: int, revision: int) -> None:
        self.clock = clock
        self.entry = Entry(json.dumps({"member": f"{holder:x}"}).encode(), revision)
        self.get_takes = 0.0
        self.during_get = None
        self.deleted: list[tuple[float, int]] = []

    async def get(self, key):
        if self.during_get is not None:
            self.during_get()
            self.during_get = None
        self.clock.now += self.get_takes
        return self.entry

    async def delete(self, key, last=None):
        self.deleted.append((self.clock.now, last))
        raise RuntimeError("the test ends here")


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(election_mod.time, "monotonic", c)
    return c


def candidate(bucket: Bucket) -> Election:
    e = Election(None, "t", member_id=0xB, ttl=2.0, renew_interval=0.5,
                 on_elected=lambda: True, on_lost=lambda: None)
    e._kv = bucket
    return e


def poll(e: Election) -> None:
    asyncio.run(e._observe_or_campaign())


def test_a_revision_is_timed_from_when_its_answer_came_not_when_it_was_asked(clock):
    """The holder renews at 100.5 (its lease: until 100.5 + 0.8 x 2 = 102.1)
    while the candidate's question of 100.0 is on its way; the answer, one
    second late, shows that renewal.  Timed from the question the candidate
    would take over at 102.05, inside the holder's lease; timed from the
    answer (101.0) it waits until after 103.0."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)
    lease_end = 100.5 + 2.0 * election_mod.LEASE_FRACTION

    def renewed() -> None:
        bucket.entry = Entry(bucket.entry.value, 8)

    bucket.get_takes = 1.0
    bucket.during_get = renewed
    poll(e)  # asked at 100.0, answered at 101.0 with revision 8
    assert clock.now == 101.0 and not bucket.deleted
    bucket.get_takes = 0.0
    clock.now = 102.05
    poll(e)
    assert not bucket.deleted, "took over inside the holder's lease"
    assert clock.now < lease_end
    assert e.leader_id == 0xA
    clock.now = 103.05
    poll(e)
    assert bucket.deleted == [(103.05, 8)]  # stale: cleared on its revision, then taken


def test_the_lease_of_a_won_election_counts_from_before_the_key_was_created(clock):
    """The winner's lease starts when it sends the create (no revision of its
    key exists before), not when it began looking at the bucket."""
    from nats.js.errors import KeyNotFoundError

    class Empty(Bucket):
        async def get(self, key):
            self.clock.now += 0.7  # a slow answer: no key
            raise KeyNotFoundError

        async def create(self, key, value, msg_ttl=None):
            self.created_at = self.clock.now
            self.clock.now += 0.1
            return 3

    bucket = Empty(clock, holder=0, revision=0)
    e = candidate(bucket)
    poll(e)
    assert e._rev == 3 and bucket.created_at == 100.7
    assert e.lease_until == pytest.approx(100.7 + 2.0 * election_mod.LEASE_FRACTION)


def test_no_answer_about_the_key_for_an_election_timeout_means_no_leader(clock):
    """NATS without a quorum answers no question about the key: the
    follower that knew leader A forgets it once an election timeout has
    passed without an answer (not before), and learns the holder again from
    the next answer."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)
    e.set_candidate(False)  # observe only
    poll(e)
    assert e.leader_id == 0xA

    class NoQuorum(Exception):
        pass

    async def refused(key):
        clock.now += 0.5
        raise NoQuorum

    bucket.get = refused
    for _ in range(3):  # 0.5 s each: 1.5 s without an answer, under the 2 s timeout
        with pytest.raises(NoQuorum):
            poll(e)
    assert e.leader_id == 0xA
    with pytest.raises(NoQuorum):
        poll(e)  # 2.0 s
    with pytest.raises(NoQuorum):
        poll(e)  # 2.5 s
    assert e.leader_id == 0
    del bucket.get  # answers again
    bucket.entry = Entry(bucket.entry.value, 9)
    poll(e)
    assert e.leader_id == 0xA


def test_a_leader_that_loses_its_key_knows_no_leader(clock):
    e = candidate(Bucket(clock, holder=0xB, revision=7))
    e._set_leader(0xB)
    e._rev = 7
    e._lose("the test says so")
    assert e.leader_id == 0 and not e._rev and e.lease_until == 0.0


def test_a_hand_over_waits_for_a_renewal_in_flight():
    """MoveLeader while the leader's renewal is on its way: the key's
    revision moves when the renewal lands, so a hand-over naming the
    revision it saw before would be refused (10071: MoveLeader failed with
    an internal error in CI).  It waits for the renewal and names the new
    revision."""
    import threading

    from nats.js.errors import APIError

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    landed = asyncio.Event()
    release = threading.Event()

    class Stream:
        seq = 7

        async def publish(self, subject, value, headers=None, timeout=None):
            if int(headers["Nats-Expected-Last-Subject-Sequence"]) != self.seq:
                raise APIError(code=400, err_code=10071, description=f"wrong last sequence: {self.seq}")
            self.seq += 1
            self.last = json.loads(value)["member"]
            if self.last == "b":  # the renewal: stored, its ack still on the way
                landed.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait)
            return type("Ack", (), {"seq": self.seq})()

    class Conn:
        js = Stream()

        def run(self, coro, timeout=None):
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    e = Election(Conn(), "t", member_id=0xB, ttl=2.0, renew_interval=0.5,
                 on_elected=lambda: True, on_lost=lambda: None)
    e._rev = 7
    renewal = asyncio.run_coroutine_threadsafe(e._renew(), loop)
    asyncio.run_coroutine_threadsafe(landed.wait(), loop).result(5)
    handed = threading.Thread(target=e.hand_over, args=(0xA,))
    handed.start()
    time.sleep(0.2)  # the hand-over is waiting for the renewal
    release.set()
    renewal.result(5)
    handed.join(5)
    assert Conn.js.last == "a" and Conn.js.seq == 9 and e._rev == 0 and e.leader_id == 0xA
    loop.call_soon_threadsafe(loop.stop)
