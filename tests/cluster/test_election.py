"""brain.cluster.election on a key-value bucket the test controls, with a
clock the test moves: when a candidate may take over a key, and how long
the holder's read lease lasts, what heartbeats change.  No NATS."""

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
    """The election key, as the bucket (``get``, ``create``) and its stream
    (``publish`` with an expected last sequence) show it; ``get`` takes
    ``get_takes`` seconds of the test's clock (a slow answer), during which
    ``during_get`` may change the key (the holder renewing while the
    question is on its way).  ``beats`` are the core NATS heartbeats
    published."""

    def __init__(self, clock: Clock, holder: int, revision: int) -> None:
        self.clock = clock
        self.entry = Entry(json.dumps({"member": f"{holder:x}"}).encode(), revision)
        self.get_takes = 0.0
        self.during_get = None
        self.gets = 0
        self.taken: list[tuple[float, int, str]] = []  # (when, the revision compared on, the new holder)
        self.beats: list[dict] = []

    async def get(self, key):
        self.gets += 1
        if self.during_get is not None:
            self.during_get()
            self.during_get = None
        self.clock.now += self.get_takes
        return self.entry

    async def publish(self, subject, value, headers=None, timeout=None):
        from nats.js.errors import APIError

        last = int(headers["Nats-Expected-Last-Subject-Sequence"])
        if last != self.entry.revision:
            raise APIError(code=400, err_code=10071, description=f"wrong last sequence: {self.entry.revision}")
        self.entry = Entry(value, last + 1)
        self.taken.append((self.clock.now, last, json.loads(value)["member"]))
        return type("Ack", (), {"seq": last + 1})()


class Conn:
    def __init__(self, bucket: Bucket) -> None:
        self.js = bucket
        self.nc = self

    async def publish(self, subject, data):
        self.js.beats.append(json.loads(data))

    def submit(self, coro):
        asyncio.run(coro)


class Msg:
    def __init__(self, holder: int, rev: int, sender: int | None = None) -> None:
        self.data = json.dumps({"member": f"{holder:x}", "rev": rev,
                                "from": f"{holder if sender is None else sender:x}"}).encode()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def no_threads(monkeypatch):
    """Promotion runs on a thread in the replica; here it is recorded."""
    started = []

    class Thread:
        def __init__(self, target, name, daemon):
            self.name = name

        def start(self):
            started.append(self.name)

    monkeypatch.setattr(election_mod.threading, "Thread", Thread)
    return started


def candidate(bucket: Bucket, timeout: float = 0.5) -> Election:
    e = Election(Conn(bucket), "t", member_id=0xB, timeout=timeout, heartbeat_interval=0.1,
                 on_elected=lambda: True, on_lost=lambda: None, clock=bucket.clock)
    e.key.kv = bucket
    return e


def poll(e: Election) -> None:
    asyncio.run(e._observe_or_campaign())


def beat(e: Election, holder: int, rev: int, sender: int | None = None) -> None:
    asyncio.run(e._on_heartbeat(Msg(holder, rev, sender)))


def test_a_revision_is_timed_from_when_its_answer_came_not_when_it_was_asked(clock, no_threads):
    """The holder (never heard beating: judged by its key alone, for
    KEY_ONLY_TIMEOUT) renews at 100.5 while the candidate's question of
    100.0 is on its way; the answer, one second late, shows that renewal.
    Timed from the question the candidate would take over at 102.05, inside
    the holder's lease (until 100.5 + 0.8 x 2); timed from the answer
    (101.0) it waits until after 103.0."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)

    def renewed() -> None:
        bucket.entry = Entry(bucket.entry.value, 8)

    bucket.get_takes = 1.0
    bucket.during_get = renewed
    poll(e)  # asked at 100.0, answered at 101.0 with revision 8
    assert clock.now == 101.0 and not bucket.taken
    bucket.get_takes = 0.0
    clock.now = 102.05
    poll(e)
    assert not bucket.taken, "took over inside the holder's lease"
    assert clock.now < 100.5 + election_mod.KEY_ONLY_TIMEOUT * election_mod.LEASE_FRACTION
    assert e.leader_id == 0xA
    clock.now = 103.05
    poll(e)
    assert bucket.taken == [(103.05, 8, "b")]  # stale: taken by a compare on its revision
    assert e._rev == 9 and e.leader_id == 0xB and no_threads == ["brain-elected"]
    assert bucket.beats == [{"member": "b", "rev": 9, "from": "b"}]  # said at once


def test_heartbeats_keep_a_holder_whose_key_revision_stands_still(clock, no_threads):
    """While heartbeats come, a key unrenewed for longer than the election
    timeout is no reason to take over, and the key is not even read."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)
    for _ in range(20):  # 2 s of heartbeats naming revision 7
        beat(e, 0xA, 7)
        clock.now += 0.1
        poll(e)
    assert not bucket.taken and bucket.gets == 0 and e.leader_id == 0xA


def test_a_missed_heartbeat_bound_takes_the_key_at_once(clock, no_threads):
    """The holder's heartbeats stop (kill -9 at 100.0): the candidate takes
    its key by a compare on the revision the last heartbeat named, an
    election timeout after it, not before."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)
    beat(e, 0xA, 7)
    for _ in range(4):
        clock.now += 0.1
        poll(e)
    assert not bucket.taken and e.leader_id == 0xA
    clock.now = 100.5
    poll(e)
    assert bucket.taken == [(100.5, 7, "b")]
    assert e.lease_until == pytest.approx(100.5 + 0.5 * election_mod.LEASE_FRACTION)


def test_a_heartbeat_older_than_the_key_known_proves_nothing(clock, no_threads):
    """A deposed holder's heartbeat (a revision below the one known) does not
    keep the known holder alive."""
    bucket = Bucket(clock, holder=0xC, revision=9)
    e = candidate(bucket)
    beat(e, 0xC, 9)
    for _ in range(5):
        clock.now += 0.1
        beat(e, 0xA, 7)
    assert e.leader_id == 0xC
    clock.now = 100.5
    poll(e)
    assert bucket.taken == [(100.5, 9, "b")]


def test_losing_a_race_for_the_key_reads_it_again(clock, no_threads):
    """Two candidates judge the same holder dead; the second's compare fails
    (the key moved): it does not lead, reads the key, and waits for the
    winner, whom it has not heard beating yet."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket)
    beat(e, 0xA, 7)
    clock.now = 100.35
    poll(e)  # silent for 3.5 heartbeat intervals: reads the key, still revision 7
    assert bucket.gets == 1 and e.leader_id == 0xA
    bucket.entry = Entry(json.dumps({"member": "c"}).encode(), 8)  # the other candidate wins at 100.45
    clock.now = 100.5
    poll(e)
    assert not bucket.taken and not e._rev
    clock.now += 0.1
    poll(e)
    assert bucket.gets == 2 and e.leader_id == 0xC and not bucket.taken


def test_a_hand_over_heartbeat_is_taken_at_once_by_a_compare_and_set(clock, no_threads):
    """The leader names this replica in the key and says so in a heartbeat:
    it takes the key on that heartbeat, without waiting for a check, by a
    compare-and-set on the revision naming it, so that its hold (and the
    epoch record its promotion may append while the hold lasts) counts from
    its own write of the key: the old leader's write says nothing of when
    this replica's hold may begin."""
    bucket = Bucket(clock, holder=0xB, revision=8)
    e = candidate(bucket)
    assert not e.holds_key()
    beat(e, 0xB, 8, sender=0xA)
    assert bucket.taken == [(100.0, 8, "b")]
    assert e._rev == 9 and e.leader_id == 0xB and no_threads == ["brain-elected"]
    assert e.holds_key() and e.lease_until == pytest.approx(100.0 + 0.5 * election_mod.LEASE_FRACTION)
    clock.now += 0.5 * election_mod.LEASE_FRACTION
    assert not e.holds_key()  # until renewed


def test_a_hand_over_that_another_replica_overtook_is_not_taken(clock, no_threads):
    """The key moved on after the hand-over named this replica (another
    candidate, or the old leader taking it back): the compare fails and
    this replica does not try to lead on a hold it does not have."""
    bucket = Bucket(clock, holder=0xB, revision=8)
    e = candidate(bucket)
    bucket.entry = Entry(json.dumps({"member": "c"}).encode(), 9)
    beat(e, 0xB, 8, sender=0xA)
    assert not e._rev and not e.holds_key() and no_threads == []


def test_the_lease_of_a_won_election_counts_from_before_the_key_was_created(clock, no_threads):
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
    assert e.lease_until == pytest.approx(100.7 + 0.5 * election_mod.LEASE_FRACTION)


def test_no_answer_about_the_key_for_an_election_timeout_means_no_leader(clock):
    """NATS without a quorum answers no question about the key: the
    follower that knew leader A forgets it once an election timeout has
    passed without an answer (not before), and learns the holder again from
    the next answer."""
    bucket = Bucket(clock, holder=0xA, revision=7)
    e = candidate(bucket, timeout=2.0)
    e.set_candidate(False)  # observe only
    poll(e)
    assert e.leader_id == 0xA

    class NoQuorum(Exception):
        pass

    async def refused(key):
        clock.now += 0.5
        raise NoQuorum

    bucket.get = refused
    clock.now += election_mod.POLL_INTERVAL  # the next read is due
    for _ in range(3):  # 0.5 s each: 1.7 s without an answer, under the 2 s timeout
        with pytest.raises(NoQuorum):
            poll(e)
    assert e.leader_id == 0xA
    with pytest.raises(NoQuorum):
        poll(e)  # 2.2 s
    with pytest.raises(NoQuorum):
        poll(e)  # 2.7 s
    assert e.leader_id == 0
    del bucket.get  # answers again
    bucket.entry = Entry(bucket.entry.value, 9)
    poll(e)
    assert e.leader_id == 0xA


def test_a_slow_renewal_costs_no_election(clock, no_threads):
    """A renewal whose answer timed out is still in flight (JetStream refuses
    the next one with 10164) or has landed (10071, and the key names this
    replica at a later revision): the leader keeps leading, adopting the
    landed revision, until the key's TTL has passed without a renewal."""
    from nats.js.errors import APIError

    bucket = Bucket(clock, holder=0xB, revision=7)
    e = candidate(bucket)
    e._rev, e._renewed, e.leading = 7, clock.now, True

    async def in_flight(subject, value, headers=None, timeout=None):
        raise APIError(code=400, err_code=10164, description="wrong last sequence")

    bucket.publish = in_flight
    clock.now += 1.5
    asyncio.run(e._renew())
    assert e.leading and e._rev == 7
    del bucket.publish  # it landed: revision 8 names this replica; the renewal naming 7 is refused
    bucket.entry = Entry(bucket.entry.value, 8)
    clock.now += 0.1
    asyncio.run(e._renew())
    assert e.leading and e._rev == 8
    asyncio.run(e._renew())
    assert e._rev == 9 and e.lease_until == pytest.approx(clock.now + 0.5 * election_mod.LEASE_FRACTION)
    bucket.publish = in_flight
    clock.now += e.ttl + 0.1
    asyncio.run(e._renew())
    assert not e.leading and not e._rev and e.leader_id == 0


def _leader_with_journal(bucket: Bucket, clock: Clock, acked: list, asked: list) -> Election:
    e = Election(Conn(bucket), "t", member_id=0xB, timeout=0.5, heartbeat_interval=0.1,
                 on_elected=lambda: True, on_lost=lambda: None,
                 journal_acknowledged=lambda: acked[0], confirm_with_journal=lambda: asked.append(clock.now),
                 clock=clock)
    e.key.kv = bucket
    e._rev, e._renewed, e.leading = 7, clock.now, True
    return e


async def _no_bucket_leader(subject, value, headers=None, timeout=None):
    from nats.errors import NoRespondersError

    raise NoRespondersError


def test_a_leader_leads_on_through_a_bucket_without_a_leader_while_the_journal_acknowledges(clock, no_threads):
    """The nats-server leading the election bucket died: no renewal is
    answered for longer than the key's TTL, but the journal acknowledges
    the leader's appends (each failed renewal asks it for one), so it keeps
    the lead, without a read lease; when the bucket answers again the key
    has expired (JetStream's marker holds its subject) and the leader writes
    it again on the marker's revision."""
    bucket = Bucket(clock, holder=0xB, revision=7)
    acked, asked = [clock.now], []
    e = _leader_with_journal(bucket, clock, acked, asked)
    bucket.publish = _no_bucket_leader
    for _ in range(10):  # 5 s, past the TTL (2 s)
        clock.now += 0.5
        acked[0] = clock.now - 0.3  # the empty record asked for last time was acknowledged
        asyncio.run(e._renew())
        assert e.leading and e._rev == 7 and e.last_answer == acked[0]
    assert len(asked) == 10 and not e.lease_valid()
    del bucket.publish
    bucket.entry = Entry(b"", 12)  # the key expired: its marker
    asyncio.run(e._renew())
    assert e.leading and e._rev == 13 and e.lease_valid()
    assert bucket.taken[-1] == (clock.now, 12, "b")
    asyncio.run(e._renew())
    assert e._rev == 14 and len(asked) == 10


def test_a_leader_without_journal_acknowledgements_steps_down_after_the_ttl(clock, no_threads):
    """Its NATS lost its quorum (the journal cannot acknowledge either): the
    key's TTL after its last renewal it stops leading, as before."""
    bucket = Bucket(clock, holder=0xB, revision=7)
    acked, asked = [clock.now], []
    e = _leader_with_journal(bucket, clock, acked, asked)
    bucket.publish = _no_bucket_leader
    clock.now += 1.9
    asyncio.run(e._renew())
    assert e.leading
    clock.now += e.ttl
    asyncio.run(e._renew())
    assert not e.leading and not e._rev and e.leader_id == 0


def test_a_leader_that_led_on_loses_to_a_candidate_that_took_the_expired_key(clock, no_threads):
    bucket = Bucket(clock, holder=0xB, revision=7)
    acked, asked = [clock.now], []
    e = _leader_with_journal(bucket, clock, acked, asked)
    bucket.publish = _no_bucket_leader
    clock.now += 3.0
    acked[0] = clock.now
    asyncio.run(e._renew())
    assert e.leading
    del bucket.publish
    bucket.entry = Entry(json.dumps({"member": "c"}).encode(), 13)  # expired, then created by 0xC
    asyncio.run(e._renew())
    assert not e.leading and not e._rev


class Purged(Bucket):
    """The key with no message left at all (purged, or its marker gone too):
    ``get`` finds nothing, a publish on the old revision is refused with
    10071, and ``create`` writes revision ``created_rev`` unless
    ``taken_by`` created it first."""

    def __init__(self, clock: Clock, created_rev: int, taken_by: int = 0) -> None:
        super().__init__(clock, holder=0xB, revision=7)
        self.gone, self.created_rev, self.taken_by = True, created_rev, taken_by
        self.created: list[tuple[str, int | None]] = []

    async def get(self, key):
        from nats.js.errors import KeyNotFoundError

        if self.gone:
            raise KeyNotFoundError
        return await super().get(key)

    async def publish(self, subject, value, headers=None, timeout=None):
        from nats.js.errors import APIError

        if self.gone:
            raise APIError(code=400, err_code=10071, description="wrong last sequence: 0")
        return await super().publish(subject, value, headers, timeout)

    async def create(self, key, value, msg_ttl=None):
        from nats.js.errors import KeyWrongLastSequenceError

        if self.taken_by:
            self.gone = False
            self.entry = Entry(json.dumps({"member": f"{self.taken_by:x}"}).encode(), self.created_rev)
            raise KeyWrongLastSequenceError(description="wrong last sequence: %d" % self.created_rev)
        self.created.append((json.loads(value)["member"], msg_ttl))
        self.gone = False
        self.entry = Entry(value, self.created_rev)
        return self.created_rev


def test_a_leader_that_led_on_creates_its_key_again_when_no_message_of_it_is_left(clock, no_threads):
    """No marker to compare on: the key is created as a new one (with the
    key's TTL), and renewals go on from the created revision."""
    bucket = Purged(clock, created_rev=20)
    acked, asked = [clock.now], []
    e = _leader_with_journal(bucket, clock, acked, asked)
    clock.now += 0.5
    asyncio.run(e._renew())
    assert e.leading and e._rev == 20 and e.lease_valid()
    assert bucket.created == [("b", e.ttl)]
    asyncio.run(e._renew())
    assert e._rev == 21 and bucket.taken[-1][1:] == (20, "b")


def test_a_leader_loses_when_another_replica_created_the_vanished_key_first(clock, no_threads):
    bucket = Purged(clock, created_rev=20, taken_by=0xC)
    acked, asked = [clock.now], []
    e = _leader_with_journal(bucket, clock, acked, asked)
    clock.now += 0.5
    asyncio.run(e._renew())
    assert not e.leading and not e._rev and bucket.created == []


def test_a_leader_that_loses_its_key_knows_no_leader(clock):
    e = candidate(Bucket(clock, holder=0xB, revision=7))
    e._set_leader(0xB)
    e._rev = 7
    e._lose("the test says so")
    assert e.leader_id == 0 and not e._rev and e.lease_until == 0.0


def test_a_holder_whose_engine_stopped_leading_gives_the_key_up(clock, no_threads):
    """The engine steps down on its own (its append was fenced by another
    writer): the election stops holding the key, so its heartbeats stop and
    a follower takes the key after the timeout.  Holding on stalled a
    cluster in CI: the followers heard the heartbeats and never tried, and
    nobody led for the 90 s the test waited."""
    bucket = Bucket(clock, holder=0, revision=0)
    leads = [True]
    e = Election(Conn(bucket), "t", member_id=0xB, timeout=0.5, heartbeat_interval=0.1,
                 on_elected=lambda: True, on_lost=lambda: None, engine_leads=lambda: leads[0], clock=clock)
    e.key.kv = bucket
    e._rev, e.leader_id = 7, 0xB
    e._elected()
    assert e.leading
    leads[0] = False
    e.abdicate("fenced")
    assert not e.leading and not e._rev and e.leader_id == 0
    beats = len(bucket.beats)
    asyncio.run(e._beat())
    assert len(bucket.beats) == beats  # no heartbeat names it any more
    assert no_threads == ["brain-lost"]  # on_lost runs (a no-op for an engine already following)


def test_an_engine_that_stopped_leading_while_taking_the_lead_loses_the_key(clock, no_threads):
    bucket = Bucket(clock, holder=0, revision=0)
    e = Election(Conn(bucket), "t", member_id=0xB, timeout=0.5, heartbeat_interval=0.1,
                 on_elected=lambda: True, on_lost=lambda: None, engine_leads=lambda: False, clock=clock)
    e.key.kv = bucket
    e._rev, e.leader_id = 7, 0xB
    e._elected()
    assert not e.leading and not e._rev


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

    class Core:
        beats: list = []

        async def publish(self, subject, data):
            self.beats.append(json.loads(data))

    class Conn:
        js = Stream()
        nc = Core()

        def run(self, coro, timeout=None):
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    e = Election(Conn(), "t", member_id=0xB, timeout=2.0, heartbeat_interval=0.5,
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
    assert Conn.nc.beats == [{"member": "a", "rev": 9, "from": "b"}]  # the target takes it on this
    loop.call_soon_threadsafe(loop.stop)
