"""Who should lead: a key in a JetStream key-value bucket, and the
holder's heartbeats on a core NATS subject.

The key (``leader`` of bucket ``<name>_leader``, brain.cluster.leader_key)
holds the leader's member ID.  A candidate creates it (only possible when
it is absent) or replaces a dead holder's by a compare-and-set on the
revision it last saw; the holder renews it by compare-and-set every third
of the election timeout.  The
holder also publishes a heartbeat on ``<name>.heartbeat`` every heartbeat
interval, naming itself and the key revision it holds.  A follower that
has heard no heartbeat for the election timeout, and has known the key's
revision for at least as long, takes the key with a compare on that
revision (one JetStream round trip).  The key carries a per-message TTL of
twice the timeout (whole seconds), so it disappears even when no replica
is left to judge.  A holder that shuts down hands the key to a follower and
says so in a heartbeat, so the follower takes the lead at once.

The key is only a *liveness hint*: two replicas may briefly both believe
they lead (a paused holder that has not noticed its key was taken).
Safety does not rest on it: every append to the journal is fenced on the
record before it (brain.journal.jetstream), so the stale leader's next
append fails and it steps down.  The key decides who *tries*; the fence
decides who *writes*.

The read lease (``lease_valid``) rests on the key alone: a follower takes
the key only with a compare on a revision it has known for the election
timeout, counted from when it first saw it (in a heartbeat or an answer,
both later than the renewal that wrote it).  A heartbeat proves nothing to
its sender, so missed heartbeats only decide *when* a follower may try,
never that the holder's lease is over.

Timings (etcd's flag names): ``--election-timeout`` is how long a follower
waits without a heartbeat, ``--heartbeat-interval`` the heartbeat period.
A killed leader is replaced after its last heartbeat plus the timeout, one
check interval (a heartbeat interval), the compare-and-set, and the new
leader's promotion; docs/cluster.md adds it up.  A holder that has never
been heard beating (a replica of a version without heartbeats, during a
rolling upgrade) is judged by its key alone, unrenewed for
``KEY_ONLY_TIMEOUT``, that version's election timeout.

Every request about the key waits at most ``request_timeout`` for its
answer (brain.cluster.leader_key: the key in its bucket; brain.cluster.
heartbeat: the heartbeats' subject and message).

A leader whose renewals fail (no answer, or one still in flight) keeps
leading, its lease lapsing, until the key's TTL has passed since its last
renewal: then the key has expired anyway, and it stops leading and beating.
Followers do not wait for that (they judge by heartbeats), and a JetStream
that is only slow must not cost an election.  One exception: while the
journal still acknowledges this leader's appends (``journal_acknowledged``,
within the TTL), it leads on.  Its key's bucket cannot answer it, so it
cannot answer a candidate either (the bucket has no stream leader: the
nats-server that led it died), and followers still hear its heartbeats; the
fence, not the key, keeps it from writing after anyone else (a candidate
that did take the key writes an epoch record, and this leader's next append
fails).  Without it, the death of the nats-server leading the bucket cost a
step-down and a new election once the bucket had a leader again: NATS's
election of 4-9 s, on top.  When the bucket answers again the key has
expired; the leader creates it again (only possible while it is absent,
so a candidate that created it first wins).  Its read lease stays lapsed
until then: it rests on the key alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
from typing import Callable

from .. import clock as lease_clock
from ..journal.natsio import STARTUP_WAIT, when_answering
from . import heartbeat
from .leader_key import LeaderKey

log = logging.getLogger("brain.cluster.election")

POLL_INTERVAL = 0.2  # between reads of the key while no heartbeat arrives
MIN_REQUEST_TIMEOUT = 0.5  # the shortest wait for an answer about the key
LEASE_FRACTION = 0.8  # of the election timeout: how long a renewal lets the leader read alone
RENEWALS_PER_TIMEOUT = 3  # key renewals per election timeout: the lease never lapses between them
KEY_ONLY_TIMEOUT = 2.0  # a holder never heard beating: how long its key may stay unrenewed


class Election:
    """Campaigns for ``member_id`` and keeps the key while leading.

    ``on_elected()`` runs on a worker thread once the key is won and must
    return True once this replica leads (False: it could not; the key is
    given back).  ``on_lost()`` runs on a worker thread when the key is
    lost.  ``leader_id`` is the current holder's member ID (0: none)."""

    def __init__(self, conn, name: str, member_id: int, *, timeout: float = 0.5, heartbeat_interval: float = 0.1,
                 on_elected: Callable[[], bool], on_lost: Callable[[], None],
                 on_leader: Callable[[int], None] | None = None, replicas: int = 1,
                 journal_acknowledged: Callable[[], float] | None = None,
                 confirm_with_journal: Callable[[], None] | None = None,
                 engine_leads: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = lease_clock.now) -> None:
        # every time kept here is on this clock (brain.clock: it counts
        # through suspend), the journal's acknowledgement time too
        self._clock = clock
        self.conn = conn
        self.subject = heartbeat.subject(name)
        self.member_id = member_id
        self.timeout = timeout
        self.ttl = max(2, math.ceil(2 * self.timeout))  # the backstop: whole seconds for JetStream
        self.heartbeat_interval = max(0.01, min(heartbeat_interval, self.timeout / 2))
        self.renew_interval = max(self.heartbeat_interval, self.timeout / RENEWALS_PER_TIMEOUT)
        self.request_timeout = max(MIN_REQUEST_TIMEOUT, self.timeout)
        self.key = LeaderKey(conn, name, ttl=self.ttl, request_timeout=self.request_timeout, replicas=replicas)
        # What this follower knows of the key: its holder (0: absent) at the
        # highest revision seen, when that revision was first seen, and when
        # its holder's last heartbeat came.  Revisions only grow, so a lower
        # one (a deposed holder's heartbeat, a lagging answer) is ignored.
        self._holder = 0
        self._known_rev = 0
        self._seen_at = self._clock()
        self._beat_at = -math.inf
        self._beating: set[int] = set()  # members heard beating: judged by heartbeats
        self._asked = -math.inf  # the last read of the key
        self._observed = self._clock()  # the last answer or heartbeat (no key counts too)
        self._announced = 0  # the stale key revision a takeover was logged for
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.on_leader = on_leader
        # the time (brain.clock) the journal last acknowledged this replica's appends
        # as its writer (see the module docstring: leading on without the key)
        self.journal_acknowledged = journal_acknowledged
        # asks for such an acknowledgement now (an empty record when there is
        # nothing to append): called on each renewal that fails, so a leader
        # without writes can lead on too
        self.confirm_with_journal = confirm_with_journal
        # whether the engine leads the journal now: it may stop on its own
        # (an append fenced by another writer, an outcome it cannot know),
        # and a key holder that does not lead would keep everyone else from
        # trying (see abdicate)
        self.engine_leads = engine_leads
        self._unrenewed_since = 0.0  # leading on without renewals since (0: renewed)
        self.leader_id = 0
        self.leading = False
        self.elections = 0
        self._rev = 0
        self._renewed = 0.0
        self.lease_until = 0.0  # when the hold, and with it the read lease, ends (see holds_key)
        self._task = None
        self._beats = None
        self._sub = None
        self._stop = threading.Event()
        self._busy = False  # on_elected / on_lost running
        # held (on the connection's loop) around every publish that moves the
        # key on its revision: a hand-over must not race a renewal, or it
        # names a revision the renewal just replaced (10071, and MoveLeader fails)
        self._key_lock = asyncio.Lock()
        self._candidate = True

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        self.conn.run(when_answering(self.key.open, "election bucket"), STARTUP_WAIT + 20)
        self._sub = self.conn.subscribe(self.subject, self._on_heartbeat)
        self._task = self.conn.submit(self._loop())
        self._beats = self.conn.submit(self._beat_loop())

    def holds_key(self) -> bool:
        """True while no other replica can have taken the key from this one:
        this replica wrote the key (created, took or renewed it by a
        compare-and-set) at T, its clock read before the publish was sent,
        and a candidate takes it only with a compare on a revision it has
        known for the election timeout (first seen after T), so nobody else
        can hold it before T + timeout.  The hold ends earlier, at T + 0.8 x
        timeout (a margin for clocks that run at different rates), and at
        once when the key is lost or handed over.  Only the clocks' *rates*
        matter, never their readings; the clock is CLOCK_BOOTTIME
        (brain.clock), which counts through suspend.  The engine appends its
        epoch record only while this is true (Replication's promotion)."""
        return bool(self._rev) and self._clock() < self.lease_until

    def lease_valid(self) -> bool:
        """The read lease: this replica leads and holds the key
        (``holds_key``), so no other replica can have appended since its
        own last append, and it answers linearizable reads without asking
        the journal.  On only with ``--read-lease`` (docs/cluster.md)."""
        return self.leading and self.holds_key()

    @property
    def last_answer(self) -> float:
        """Monotonic time NATS last told this replica about the key: a
        holder's heartbeat, a poll's answer, or (while holding it) a
        renewal's acknowledgement, or (while leading) the journal's
        acknowledgement of its appends, which a renewal that failed for a
        while (its bucket without a leader) does not make stale."""
        latest = max(self._observed, self._renewed)
        if self.leading and self.journal_acknowledged is not None:
            latest = max(latest, self.journal_acknowledged())
        return latest

    def set_candidate(self, candidate: bool) -> None:
        """Stop (or resume) campaigning, e.g. while the replica cannot lead."""
        self._candidate = candidate

    @property
    def has_key(self) -> bool:
        """The key names this replica at a revision it knows (a hold that
        may have lapsed: ``holds_key`` says whether it is still valid)."""
        return bool(self._rev)

    def stop(self, resign: bool = True) -> None:
        """Stop campaigning; give the key back if held (``resign``)."""
        self._stop.set()
        for task in (self._task, self._beats):
            if task is not None:
                try:
                    task.result(5)
                except Exception:  # noqa: BLE001
                    pass
        if self._sub is not None:
            try:
                self.conn.unsubscribe(self._sub)
            except Exception as e:  # noqa: BLE001 - the connection closes next
                log.debug("heartbeat unsubscribe: %r", e)
            self._sub = None
        if resign and self._rev:
            try:
                self.conn.run(self.key.delete(self._rev), 3)
                log.info("resigned the lead")
            except Exception as e:  # noqa: BLE001 - it will expire anyway
                log.debug("resign: %r", e)
        self._rev = 0

    # -- heartbeats -------------------------------------------------------------

    async def _beat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._rev:
                    await self._beat()
            except Exception as e:  # noqa: BLE001 - the next one may pass
                log.debug("heartbeat: %r", e)
            await asyncio.sleep(self.heartbeat_interval)

    async def _beat(self) -> None:
        """Say that this replica holds the key at its revision (core NATS:
        no acknowledgement, nothing stored)."""
        rev = self._rev
        if rev:
            await self.conn.nc.publish(self.subject, heartbeat.encode(self.member_id, rev, self.member_id))

    async def _on_heartbeat(self, msg) -> None:
        """(on the loop) A holder's heartbeat, or a hand-over naming its target."""
        try:
            holder, rev, sender = heartbeat.decode(msg.data)
        except ValueError:
            log.debug("not a heartbeat: %r", msg.data[:64])
            return
        if sender == self.member_id:
            return  # this replica's own (the subject reaches every subscriber)
        now = self._clock()
        if self._learn(holder, rev, now):
            self._beat_at = now
            self._beating.add(holder)
            self._observed = now
            if holder != self.member_id:
                self._set_leader(holder)  # forwarders learn a new leader from its first heartbeat
            elif not self._rev and self._judge(now):
                await self._campaign()  # handed to this replica: take it now, not at the next check

    def _learn(self, holder: int, rev: int, now: float) -> bool:
        """Take in what a heartbeat or an answer says the key is; False if it
        is older than what is known."""
        if rev < self._known_rev:
            return False
        if rev > self._known_rev:
            self._known_rev, self._seen_at = rev, now
        self._holder = holder
        return True

    # -- the loop ---------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._rev:
                    await self._renew()
                    await asyncio.sleep(self.renew_interval)
                else:
                    await self._observe_or_campaign()
                    await asyncio.sleep(self.heartbeat_interval)
            except Exception as e:  # noqa: BLE001 - keep campaigning
                log.debug("election loop: %r", e)
                await asyncio.sleep(POLL_INTERVAL)

    async def _observe_or_campaign(self) -> None:
        """(a follower, every heartbeat interval) Read the key unless
        heartbeats say who holds it, then judge: take a dead holder's key,
        create an absent one."""
        now = self._clock()
        if now - self._beat_at > 2 * self.heartbeat_interval and now - self._asked >= POLL_INTERVAL:
            await self._read_key()
            now = self._clock()
        if self._judge(now):
            await self._campaign()

    async def _read_key(self) -> None:
        self._asked = self._clock()
        try:
            holder, rev = await self.key.read()
        except Exception:
            # NATS cannot say who holds the key (no quorum, no connection).
            # The holder cannot renew it either, so after an election timeout
            # without an answer or a heartbeat no leader is known
            # (etcd_server_has_leader 0, the health service NOT_SERVING), as
            # an etcd member's follower forgets its leader after an election
            # timeout without heartbeats.
            if self._clock() - self._observed > self.timeout:
                self._set_leader(0)
            raise
        # Read once the answer is here, not before asking: a revision first
        # seen in an answer that took long may have been written after the
        # question was sent, and the holder's lease counts from just before
        # that write.  Timing it from the question would let this replica
        # take over while the holder may still read alone (lease_valid).
        now = self._clock()
        self._observed = now
        if rev == 0:
            self._holder = 0  # absent (resigned or expired): its last revision stays the floor
        else:
            self._learn(holder, rev, now)

    def _judge(self, now: float) -> bool:
        """Who leads, as this follower sees it; True when it should campaign
        (the key is absent, or its holder is dead)."""
        holder, rev = self._holder, self._known_rev
        if holder == self.member_id and not self._rev and not self._busy and self._candidate:
            # The leader handed the lead to us (MoveLeader, shutdown): take
            # the key by a compare-and-set on the revision naming us, which
            # starts a hold of our own (the old leader's write of it says
            # nothing about when our hold may begin).
            if self._announced != rev:
                self._announced = rev
                log.info("the lead was handed to this replica (key revision %d); taking it", rev)
            return True
        bound = self.timeout if holder in self._beating else KEY_ONLY_TIMEOUT
        silent = now - max(self._beat_at, self._seen_at)
        stale = bool(holder) and now - self._beat_at >= self.timeout and now - self._seen_at >= bound
        self._set_leader(0 if stale else holder)
        if self._busy or not self._candidate or self._rev:
            return False
        if stale and self._announced != rev:  # once per stale key, not on every check while NATS refuses
            self._announced = rev
            log.info("no heartbeat from the leader %x for %.2fs; taking over its key (revision %d)",
                     holder, silent, rev)
        return stale or not holder

    async def _campaign(self) -> None:
        """Take the key: create it when absent, else replace the dead holder's
        revision (a compare-and-set: a renewal or another candidate that got
        there first makes it fail)."""
        from nats.js.errors import APIError, KeyWrongLastSequenceError

        sent = self._clock()  # before the key names us: the lease counts from here
        try:
            if self._holder:
                rev = await self.key.move(self.member_id, self._known_rev)
            else:
                rev = await self.key.create(self.member_id)
        except (KeyWrongLastSequenceError, APIError) as e:
            log.debug("campaign: %r", e)  # someone else got it (10071), or moved it: read it again
            self._asked = -math.inf
            return
        except Exception as e:  # noqa: BLE001 - no answer: it may have landed; the key says
            log.info("taking the key (revision %d) got no answer (%r); reading it", self._known_rev, e)
            self._asked = -math.inf
            return
        self._rev = rev
        self._renewed = sent
        self.lease_until = sent + self.timeout * LEASE_FRACTION
        self._learn(self.member_id, rev, sent)
        self.elections += 1
        self._set_leader(self.member_id)
        log.info("won the election (key revision %d); taking the lead", rev)
        self._busy = True
        await self._beat()  # at once: the other candidate stops trying, forwarders learn the leader
        threading.Thread(target=self._elected, name="brain-elected", daemon=True).start()

    def _elected(self) -> None:
        try:
            ok = self.on_elected()
        except Exception:  # noqa: BLE001
            log.exception("taking the lead failed")
            ok = False
        if ok and not self._rev:
            # the key was lost while taking the lead
            self.leading = True
            self._lose("the election key expired while taking the lead")
        elif ok:
            self.leading = True
            if self.engine_leads is not None and not self.engine_leads():
                # the engine stepped down between taking the lead and now
                self._lose("this replica stopped leading the journal while taking the lead")
        else:
            rev, self._rev = self._rev, 0
            if rev:
                try:
                    self.conn.run(self.key.delete(rev), 3)
                except Exception:  # noqa: BLE001
                    pass
            # let another replica try first
            time.sleep(random.uniform(0.5, 1.5))
        self._busy = False

    async def _renew(self) -> None:
        async with self._key_lock:
            await self._renew_locked()

    async def _renew_locked(self) -> None:
        from nats.js.errors import APIError

        if not self._rev:
            return  # handed over while this renewal waited for the lock
        now = self._clock()  # before the publish: the lease counts from here
        last_renewed = self._renewed
        rev = self._rev
        try:
            seq = await self.key.move(self.member_id, rev)
            if self._rev == rev:  # not handed over meanwhile
                self._renewed_at(seq, now)
            return
        except APIError as e:
            if getattr(e, "err_code", None) == 10071:  # wrong last sequence: the key moved on
                holder, current = await self.key.now()
                if current > rev and holder == self.member_id and self._rev == rev:
                    self._rev = current  # a renewal that timed out had landed: still ours
                    self._learn(self.member_id, current, now)
                elif holder == 0 and current >= 0 and self._rev == rev and await self._recreate(current):
                    pass  # it had expired (a bucket without a leader for longer than the TTL); ours again
                else:
                    self._lose("another replica holds the election key")
                return
            self._ask_journal()
            if now - last_renewed > self.ttl and not self._leads_on(now, last_renewed, str(e)):
                # 10164 included: a renewal that timed out is still in flight
                self._lose(f"could not renew the election key for {now - last_renewed:.1f}s ({e})")
        except Exception as e:  # noqa: BLE001
            self._ask_journal()
            if now - last_renewed > self.ttl and not self._leads_on(now, last_renewed, repr(e)):
                self._lose(f"could not renew the election key for {now - last_renewed:.1f}s ({e!r})")

    def _renewed_at(self, seq: int, sent: float) -> None:
        """The key names this replica at revision ``seq``, written by a
        publish sent at ``sent``: the lease counts from then."""
        self._rev = seq
        self._renewed = sent
        self.lease_until = sent + self.timeout * LEASE_FRACTION
        self._learn(self.member_id, seq, sent)
        if self._unrenewed_since:
            log.info("the election key is renewed again (revision %d), %.1fs after its last renewal",
                     seq, sent - self._unrenewed_since)
            self._unrenewed_since = 0.0

    def _ask_journal(self) -> None:
        if self.leading and self.confirm_with_journal is not None:
            try:
                self.confirm_with_journal()
            except Exception as e:  # noqa: BLE001 - then there is no acknowledgement to lead on
                log.debug("asking the journal to confirm: %r", e)

    def _leads_on(self, now: float, last_renewed: float, why: str) -> bool:
        """Whether this leader keeps the lead although its key went unrenewed
        for longer than its TTL: while the journal acknowledged its appends
        within the TTL (the module docstring says why that is safe)."""
        if not self.leading or self.journal_acknowledged is None:
            return False
        acked = self.journal_acknowledged()
        if now - acked > self.ttl:
            return False
        if not self._unrenewed_since:
            self._unrenewed_since = last_renewed
            log.warning("the election key has not been renewed for %.1fs (%s), but the journal acknowledged "
                        "this replica's appends %.1fs ago: leading on while the key's bucket cannot answer",
                        now - last_renewed, why, now - acked)
        return True

    async def _recreate(self, last: int) -> bool:
        """(holding the key lock) Write the key again after it expired while
        this replica led on, on the revision ``last`` of its absence (0: no
        message left; else the marker JetStream left when it expired): False
        if another replica wrote it first."""
        from nats.js.errors import APIError, KeyWrongLastSequenceError

        sent = self._clock()
        try:
            if last:
                seq = await self.key.move(self.member_id, last)
            else:
                seq = await self.key.create(self.member_id)
        except (KeyWrongLastSequenceError, APIError) as e:
            log.info("the expired election key was taken by another replica (%r)", e)
            return False
        except Exception as e:  # noqa: BLE001 - unknown: it may have landed; the next renewal compares
            log.info("creating the expired election key again got no answer (%r)", e)
            return False
        log.info("the election key had expired while leading on; created it again (revision %d)", seq)
        self._renewed_at(seq, sent)
        return True

    def hand_over(self, target: int, timeout: float = 5.0) -> None:
        """(not on the loop) Give the key to ``target`` (MoveLeader, a
        shutdown): a heartbeat naming it makes it take the key at once; this
        replica stops leading now."""
        self.conn.run(self._hand_over(target), timeout)
        log.info("handed the lead to %x", target)
        self._set_leader(target)
        if self.leading:
            self.leading = False
            self._busy = True
            self._lost()

    async def _hand_over(self, target: int) -> None:
        async with self._key_lock:  # after any renewal in flight: its revision is the one to name
            rev = self._rev
            if not rev:
                raise RuntimeError("this replica does not hold the election key")
            self.lease_until = 0.0  # before the key says anyone else's name
            self._rev = 0
            try:
                seq = await self.key.move(target, rev)
            except BaseException:
                self._rev = rev  # still ours
                raise
            self._learn(target, seq, self._clock())
            await self.conn.nc.publish(self.subject, heartbeat.encode(target, seq, self.member_id))

    def abdicate(self, why: str) -> None:
        """(any thread) The engine stopped leading the journal on its own
        (its append was fenced: another replica wrote after it; or the
        outcome of an append could not be known): stop holding the key as
        if it were lost.  Its renewals and heartbeats stop, so a follower
        takes the key after the election timeout, as after a crash, and
        this replica may be elected again.  Holding on would stall the
        cluster: followers hear the heartbeats and never try, while the
        holder forwards its own writes to nobody."""

        async def run() -> None:
            if self.leading:
                self._lose(why)

        self.conn.submit(run())

    def _lose(self, why: str) -> None:
        log.warning("lost the lead: %s", why)
        self.lease_until = 0.0
        self._rev = 0
        self._unrenewed_since = 0.0
        self._observed = self._clock()  # who leads next: the next answers say
        self._holder = 0  # not known now: read the key before judging again
        self._beat_at = self._asked = -math.inf
        self._set_leader(0)
        if self.leading:
            self.leading = False
            self._busy = True
            threading.Thread(target=self._lost, name="brain-lost", daemon=True).start()

    def _lost(self) -> None:
        try:
            self.on_lost()
        except Exception:  # noqa: BLE001
            log.exception("stepping down failed")
        self._busy = False

    def _set_leader(self, holder: int) -> None:
        if holder != self.leader_id:
            self.leader_id = holder
            if self.on_leader is not None:
                self.on_leader(holder)

