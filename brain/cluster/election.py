"""Who should lead: a key in a JetStream key-value bucket with a TTL.

The key ``leader`` of bucket ``<name>_leader`` holds the leader's member ID.
A candidate creates it (only possible when it is absent); the holder
renews it every ``renew_interval`` by a compare-and-set on its revision.
The other replicas poll it: when its revision has not moved for
``timeout`` (by their own monotonic clock: the holder was killed,
partitioned or paused), one of them deletes it with a compare-and-set on
that revision and creates it for itself.  The key also carries a
per-message TTL of twice the timeout, so it disappears even when no
replica is left to judge.  A holder that resigns deletes it, so a graceful
handover takes one poll interval.

The key is only a *liveness hint*: two replicas may briefly both believe
they lead (a paused holder that has not noticed its key expired).  Safety
does not rest on it: every append to the journal is fenced on the record
before it (brain.journal.jetstream), so the stale leader's next append
fails and it steps down.  The key decides who *tries*; the fence decides
who *writes*.

Timings (etcd's flag names): ``--election-timeout`` is how long a key may
stay unrenewed, ``--heartbeat-interval`` the renewal period.  A killed
leader is replaced after the timeout plus one poll interval, plus the new
leader's catch-up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
import time
from typing import Callable

log = logging.getLogger("brain.cluster.election")

KEY = "leader"
POLL_INTERVAL = 0.2
LEASE_FRACTION = 0.8  # of the election timeout: how long a renewal lets the leader read alone


def bucket_name(name: str) -> str:
    return f"{name}_leader"


class Election:
    """Campaigns for ``member_id`` and keeps the key while leading.

    ``on_elected()`` runs on a worker thread once the key is won and must
    return True once this replica leads (False: it could not; the key is
    given back).  ``on_lost()`` runs on a worker thread when the key is
    lost.  ``leader_id`` is the current holder's member ID (0: none)."""

    def __init__(self, conn, name: str, member_id: int, *, ttl: float = 2.0, renew_interval: float = 0.5,
                 on_elected: Callable[[], bool], on_lost: Callable[[], None],
                 on_leader: Callable[[int], None] | None = None, replicas: int = 1) -> None:
        self.conn = conn
        self.bucket = bucket_name(name)
        self.member_id = member_id
        self.timeout = max(1.0, ttl)
        self.ttl = max(2, math.ceil(2 * self.timeout))  # the backstop: whole seconds for JetStream
        self.renew_interval = max(0.05, min(renew_interval, self.timeout / 2))
        self._seen = (0, 0.0)  # (key revision, when it was first seen)
        self._observed = time.monotonic()  # the last answer about the key (None counts too)
        self._announced = 0  # the stale key revision a takeover was logged for
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.on_leader = on_leader
        self.replicas = replicas
        self.leader_id = 0
        self.leading = False
        self.elections = 0
        self._rev = 0
        self._renewed = 0.0
        self.lease_until = 0.0  # monotonic time the read lease ends (see lease_valid)
        self._kv = None
        self._task = None
        self._stop = threading.Event()
        self._busy = False  # on_elected / on_lost running
        # held (on the connection's loop) around every publish that moves the
        # key on its revision: a hand-over must not race a renewal, or it
        # names a revision the renewal just replaced (10071, and MoveLeader fails)
        self._key_lock = asyncio.Lock()
        self._candidate = True

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        self._kv = self.conn.run(self._open_bucket(), 15)
        self._task = self.conn.submit(self._loop())

    async def _open_bucket(self):
        from nats.js.errors import BucketNotFoundError

        try:
            return await self.conn.js.key_value(self.bucket)
        except BucketNotFoundError:
            return await self.conn.js.create_key_value(
                bucket=self.bucket, history=1, replicas=self.replicas, limit_marker_ttl=1)

    def lease_valid(self) -> bool:
        """True while no other replica can have taken the lead: the key was
        renewed at T (this replica's clock, read before the renewal was
        sent), and a candidate takes over only after seeing that renewal's
        revision unchanged for the election timeout, so nobody else can
        write before T + timeout.  The lease ends earlier, at T + 0.8 x
        timeout (a margin for clocks that run at different rates), and at
        once when the key is lost or handed over.  Only the clocks' *rates*
        matter, never their readings.  While it holds, this replica, if it
        leads, answers linearizable reads without asking the journal."""
        return self.leading and bool(self._rev) and time.monotonic() < self.lease_until

    def set_candidate(self, candidate: bool) -> None:
        """Stop (or resume) campaigning, e.g. while the replica cannot lead."""
        self._candidate = candidate

    def stop(self, resign: bool = True) -> None:
        """Stop campaigning; give the key back if held (``resign``)."""
        self._stop.set()
        if self._task is not None:
            try:
                self._task.result(5)
            except Exception:  # noqa: BLE001
                pass
        if resign and self._rev:
            try:
                self.conn.run(self._kv.delete(KEY, last=self._rev), 3)
                log.info("resigned the lead")
            except Exception as e:  # noqa: BLE001 - it will expire anyway
                log.debug("resign: %r", e)
        self._rev = 0

    # -- the loop ---------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._rev:
                    await self._renew()
                    await asyncio.sleep(self.renew_interval)
                else:
                    await self._observe_or_campaign()
                    await asyncio.sleep(POLL_INTERVAL)
            except Exception as e:  # noqa: BLE001 - keep campaigning
                log.debug("election loop: %r", e)
                await asyncio.sleep(POLL_INTERVAL)

    async def _observe_or_campaign(self) -> None:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        try:
            entry = await self._kv.get(KEY)
            holder, rev = _holder(entry.value), entry.revision
        except KeyNotFoundError:
            holder, rev = 0, 0
        except Exception:
            # NATS cannot say who holds the key (no quorum, no connection).
            # The holder cannot renew it either, so after an election timeout
            # without an answer no leader is known (etcd_server_has_leader 0,
            # the health service NOT_SERVING), as an etcd member's follower
            # forgets its leader after an election timeout without heartbeats.
            if time.monotonic() - self._observed > self.timeout:
                self._set_leader(0)
            raise
        self._observed = time.monotonic()
        # Read once the answer is here, not before asking: a revision first
        # seen in an answer that took long may have been written after the
        # question was sent, and the holder's lease counts from just before
        # that write.  Timing it from the question would let this replica
        # take over while the holder may still read alone (lease_valid).
        now = time.monotonic()
        if holder == self.member_id and not self._rev and not self._busy and self._candidate:
            # the leader handed the lead to us (MoveLeader): take the key as it
            # is (no lease until it is renewed: the old leader's may run on)
            self._rev = rev
            self._renewed = now
            self.elections += 1
            self._set_leader(self.member_id)
            log.info("the lead was handed to this replica (key revision %d); taking it", rev)
            self._busy = True
            threading.Thread(target=self._elected, name="brain-elected", daemon=True).start()
            return
        if holder and rev != self._seen[0]:
            self._seen = (rev, now)
        stale = holder and now - self._seen[1] > self.timeout
        self._set_leader(0 if stale else holder)
        if self._busy or not self._candidate:
            return
        if stale:
            if self._announced != rev:  # once per stale key, not on every poll while NATS refuses
                self._announced = rev
                log.info("the leader %x has not renewed its key for %.1fs; taking over", holder,
                         now - self._seen[1])
            try:
                await self._kv.delete(KEY, last=rev)
            except Exception as e:  # noqa: BLE001 - someone moved first
                log.debug("clearing a stale key: %r", e)
                return
        elif holder:
            return
        sent = time.monotonic()  # before the key exists: the lease counts from here
        try:
            rev = await self._kv.create(KEY, json.dumps({"member": f"{self.member_id:x}"}).encode(),
                                        msg_ttl=self.ttl)
        except KeyWrongLastSequenceError:
            return  # someone else got it
        except Exception as e:  # noqa: BLE001
            log.debug("campaign: %r", e)
            return
        self._rev = rev
        self._renewed = sent
        self.lease_until = sent + self.timeout * LEASE_FRACTION
        self.elections += 1
        self._set_leader(self.member_id)
        log.info("won the election (key revision %d); taking the lead", rev)
        self._busy = True
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
        else:
            rev, self._rev = self._rev, 0
            if rev:
                try:
                    self.conn.run(self._kv.delete(KEY, last=rev), 3)
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
        now = time.monotonic()  # before the publish: the lease counts from here
        last_renewed = self._renewed
        rev = self._rev
        try:
            headers = {"Nats-Expected-Last-Subject-Sequence": str(rev), "Nats-TTL": f"{self.ttl}s"}
            ack = await self.conn.js.publish(f"$KV.{self.bucket}.{KEY}",
                                             json.dumps({"member": f"{self.member_id:x}"}).encode(),
                                             headers=headers, timeout=max(0.2, self.renew_interval))
            if self._rev == rev:  # not handed over meanwhile
                self._rev = ack.seq
                self._renewed = now
                self.lease_until = now + self.timeout * LEASE_FRACTION
            return
        except APIError as e:
            if e.err_code == 10071:  # wrong last sequence: the key moved on
                self._lose("another replica holds the election key")
            elif now - last_renewed > self.timeout:
                self._lose(f"could not renew the election key for {now - last_renewed:.1f}s ({e})")
        except Exception as e:  # noqa: BLE001
            if now - last_renewed > self.timeout:
                self._lose(f"could not renew the election key for {now - last_renewed:.1f}s ({e!r})")

    def hand_over(self, target: int, timeout: float = 5.0) -> None:
        """(not on the loop) Give the key to ``target`` (MoveLeader): it
        takes it at its next poll; this replica stops leading now."""
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
            value = json.dumps({"member": f"{target:x}"}).encode()
            headers = {"Nats-Expected-Last-Subject-Sequence": str(rev), "Nats-TTL": f"{self.ttl}s"}
            try:
                await self.conn.js.publish(f"$KV.{self.bucket}.{KEY}", value, headers=headers)
            except BaseException:
                self._rev = rev  # still ours
                raise

    def _lose(self, why: str) -> None:
        log.warning("lost the lead: %s", why)
        self.lease_until = 0.0
        self._rev = 0
        self._observed = time.monotonic()  # who leads next: the next answers say
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


def _holder(value: bytes | None) -> int:
    if not value:
        return 0
    try:
        return int(json.loads(value)["member"], 16)
    except (ValueError, KeyError, TypeError):
        return 0
