"""A replica of a brain cluster: what ``brain serve --journal-url`` adds.

    conn        one NATS connection (brain.journal.natsio)
    journal     the shared JetStream journal, created by the first replica
    membership  the members bucket: cluster ID, client URLs, checkpoints
    engine      opened on the shared journal: it recovers from its own
                checkpoint plus the journal, then follows it
    forwarding  followers send writes to the leader; every replica listens
    election    the leader key; winning promotes the engine, losing it
                makes the engine step down
    retention   the leader purges journal records every live replica has
                checkpointed

Start-up order matters: the engine is caught up and the forwarding
listener is up before the replica campaigns, and it campaigns only once
its clients can reach it (``start``, after the API server listens).
Shutdown: hand the key to the most caught-up live follower
(``successor``: it takes the lead at once instead of an election timeout
later) while still leading, so the key's round trips are no write pause;
stop leading as soon as the key names the follower (in-flight writes finish
or are refused; one that lands after the follower's epoch record is fenced),
then close the engine (a final checkpoint) and NATS.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .. import clock as lease_clock
from ..engine import JOURNAL_SHORT_FOR, ClusterHooks, Engine, EngineConfig
from ..journal import JournalError, JournalPurgedError, JournalUnavailableError
from ..journal.jetstream import JetStreamJournal
from ..journal.jetstream_stream import stream_names
from ..journal.natsio import NatsConnection, parse_journal_url
from . import bootstrap, placement
from .election import POLL_INTERVAL, Election
from .forwarding import Forwarder, ForwardingServer, ReadIndexAsker
from .leader_key import bucket_name as election_bucket
from .membership import FEATURES, HEARTBEAT_SECONDS, PIPELINE_FEATURE, TXN_BYTES_FEATURE, Member, Membership
from .membership import bucket_name as members_bucket

log = logging.getLogger("brain.cluster")

RETENTION_INTERVAL = 30.0
# a member whose entry was refreshed this recently is taken for alive (its
# membership heartbeat is every HEARTBEAT_SECONDS)
SUCCESSOR_FRESH_SECONDS = 3 * HEARTBEAT_SECONDS


@dataclass
class ClusterOptions:
    journal_url: str
    name: str = "default"  # this replica's member name (--name)
    client_urls: tuple[str, ...] = ()  # what MemberList advertises
    election_timeout_ms: int = 500
    heartbeat_interval_ms: int = 100
    journal_replicas: int = 0  # 0: 3 when the NATS cluster has 3 servers or more, else 1
    connect_wait: float = 60.0
    # False (the default, etcd's ReadIndex): every read index is a barrier
    # record the journal acknowledged (one JetStream publish by the leader
    # per batch of reads), which rests on no clock.  True: the leader
    # answers read indexes from memory while it holds the election key
    # (brain.cluster.election.Election.lease_valid), which rests on a bound
    # on clock rates and on clocks that see every pause (docs/cluster.md).
    read_lease: bool = False
    # A TxnRequest's bytes to brain's request (brain.api.convert.
    # forwarded_txn_reader, handed down by brain.cli): with it this replica
    # reads Txns forwarded as their clients' bytes, and forwards its own so
    # once every member does.
    read_txn: Callable[[bytes], object] | None = None


class EngineSide:
    """What a replica's engine asks of its cluster (brain.engine.ClusterHooks),
    answered for the Replica once it exists: the engine opens first (the
    member ID the election and forwarding need is in its data directory),
    so until ``bind`` there is no leader and no forwarder."""

    def __init__(self, options: ClusterOptions) -> None:
        self._options = options
        self._replica: "Replica | None" = None

    def bind(self, replica: "Replica") -> None:
        self._replica = replica
        # An engine that failed while opening (replaying a record it cannot
        # apply) called the hook with no replica to tell: read its reason
        # now.  The committer sets the reason before it calls the hook, so
        # a failure racing this bind reaches the replica one way or both
        # (Replica.engine_failed is idempotent).
        reason = replica.engine.statistics().failed
        if reason is not None:
            replica.engine_failed(reason)

    def hooks(self) -> ClusterHooks:
        return ClusterHooks(
            forwarder=lambda: self._replica.forwarder if self._replica is not None else None,
            leader_hint=lambda: self._replica.election.leader_id if self._replica is not None else 0,
            has_leader=lambda: self._replica is not None and self._replica.has_leader(),
            election_timeout=self._options.election_timeout_ms / 1000.0,
            role_changed=self._role_changed,
            read_lease=self._lease_valid if self._options.read_lease else None,
            pipeline_allowed=self._pipeline_allowed,
            engine_failed=self._engine_failed)

    def _engine_failed(self, reason: str) -> None:
        if self._replica is not None:
            self._replica.engine_failed(reason)

    def _pipeline_allowed(self) -> bool:
        """Appends in flight only while every member reads a deposed
        writer's stale messages as empty (a replica of an older brain would
        apply them: rolling upgrades)."""
        r = self._replica
        return r is not None and all(PIPELINE_FEATURE in m.features for m in r.membership.members())

    def _lease_valid(self) -> bool:
        return self._replica is not None and self._replica.election.lease_valid()

    def _role_changed(self) -> None:
        if self._replica is not None:
            self._replica.role_changed()


class Replica:
    def __init__(self, options: ClusterOptions, conn: NatsConnection, cluster_name: str, journal: JetStreamJournal,
                 membership: Membership, engine: Engine, side: EngineSide) -> None:
        self.options = options
        self.conn = conn
        self.cluster_name = cluster_name
        self.journal = journal
        self.membership = membership
        self.engine = engine
        self.forwarding = ForwardingServer(conn, cluster_name, engine, read_txn=options.read_txn)
        self.snapshots = bootstrap.SnapshotServer(conn, cluster_name, engine, journal_replicas_of(journal))
        self.election = Election(
            conn, cluster_name, engine.member_id,
            timeout=options.election_timeout_ms / 1000.0,
            heartbeat_interval=options.heartbeat_interval_ms / 1000.0,
            on_elected=lambda: engine.promote(self.election.holds_key), on_lost=engine.step_down,
            replicas=journal_replicas_of(journal),
            journal_acknowledged=lambda: journal.acknowledged_at,
            confirm_with_journal=lambda: engine.journal_barrier(_ignore_barrier),
            engine_leads=lambda: engine.is_leader)
        # how this replica's writes and lease calls reach the leader
        self.forwarder = Forwarder(conn, cluster_name, self.leader_id, elected=lambda: self.election.leader_id,
                                   bytes_allowed=self.txn_bytes_read_by_all)
        # read indexes come from the journal's writer: the replica its last
        # epoch record names (the election's view only until there is one)
        self.read_index = ReadIndexAsker(
            Forwarder(conn, cluster_name, lambda: engine.leader_id, elected=lambda: self.election.leader_id,
                      notleader_ends=True),
            engine,
            elected=Forwarder(conn, cluster_name, lambda: self.election.leader_id,
                              elected=lambda: self.election.leader_id))
        engine.use_read_index(self.read_index)
        self._stop = threading.Event()
        self._retention: threading.Thread | None = None
        self._placement: threading.Thread | None = None
        self.purged = 0
        self.removed = False
        self.cannot_lead: str | None = None  # why, once the engine failed (engine_failed)
        # what to do once removed from the membership (brain serve: stop)
        self.on_removed = None
        side.bind(self)

    def engine_failed(self, reason: str) -> None:
        """The engine refuses writes until restart (a journal record it
        cannot apply, a journal write that failed): this replica can never
        lead again.  It leaves the election for good, as a candidate that
        wins the key and fails to take the lead keeps a healthy replica
        from leading, and gives the key up if it leads."""
        if self.cannot_lead is not None:
            return
        self.cannot_lead = reason
        log.error("this replica leaves the election until it is restarted: %s", reason)
        self.election.set_candidate(False)
        if self.election.leading:
            self.election.abdicate(f"this replica cannot lead: {reason}")

    def role_changed(self) -> None:
        """(the committer) The engine changed roles: when it stopped leading
        by itself while this replica holds the key, give the key up."""
        if self.election.leading and not self.engine.is_leader:
            self.election.abdicate("this replica stopped leading the journal (an append was fenced, "
                                   "or its outcome could not be known)")

    # -- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, options: ClusterOptions, engine_config: EngineConfig) -> "Replica":
        servers, cluster_name = parse_journal_url(options.journal_url)
        conn = NatsConnection.connect_retrying(servers, name=f"brain-{options.name}", wait=options.connect_wait)
        try:
            replicas = options.journal_replicas or (3 if len(conn.discovered_servers()) >= 3 else 1)
            membership = Membership(conn, cluster_name, replicas=replicas)
            deadline = time.monotonic() + options.connect_wait
            _retrying(membership.open, "opening the membership bucket", deadline)
            cluster_id = _retrying(membership.cluster_id, "reading the cluster ID", deadline)
            journal = _retrying(lambda: JetStreamJournal.open(conn, cluster_name, replicas=replicas),
                                "opening the journal stream", deadline)
            side = EngineSide(options)
            try:
                engine = Engine.open(engine_config, journal=journal, cluster_id=cluster_id, cluster=side.hooks())
            except JournalPurgedError as e:
                # Its history starts before the journal's first record: every
                # other replica checkpointed those records and they were purged.
                # The cluster holds all of this replica's data: start it again
                # from a peer's snapshot.
                log.warning("this replica's data (%s) ends before the journal's first record %d; replacing "
                            "it with a peer's snapshot", engine_config.data_dir, e.first_index)
                _clear_data_dir(engine_config.data_dir)
                boundaries = engine_config.shard_boundaries
                if boundaries is None:
                    from ..mvcc.shard_map import default_boundaries

                    boundaries = default_boundaries(engine_config.shards)
                bootstrap.copy_from_peer(conn, cluster_name, engine_config.data_dir, cluster_id=cluster_id,
                                         member_name=options.name, shards=engine_config.shards,
                                         boundaries=list(boundaries))
                engine = Engine.open(engine_config, journal=journal, cluster_id=cluster_id, cluster=side.hooks())
            try:
                _check_journal_holds(journal, engine)
            except BaseException:
                engine.close()
                raise
            journal.on_release = membership.set_checkpoint
            replica = cls(options, conn, cluster_name, journal, membership, engine, side)
            replica._join()
            return replica
        except BaseException:
            conn.close()
            raise

    def _join(self) -> None:
        eng = self.engine
        self.forwarding.start()
        self.snapshots.start()
        self.membership.register(Member(eng.member_id, self.options.name, list(self.options.client_urls), [],
                                        checkpoint_index=eng.checkpoint_index(), applied_index=eng.applied_index,
                                        features=self.features()))
        self.membership.on_removed = self._removed
        log.info("joined cluster %s (%x) as member %x (%s); journal R%d, applied index %d",
                 self.cluster_name, eng.cluster_id, eng.member_id, self.options.name,
                 journal_replicas_of(self.journal), eng.applied_index)

    def features(self) -> list[str]:
        """What this replica reads that an older brain does not (its member
        entry lists them: brain.cluster.membership)."""
        return list(FEATURES) + ([TXN_BYTES_FEATURE] if self.options.read_txn is not None else [])

    def txn_bytes_read_by_all(self) -> bool:
        """Every member reads a forwarded Txn as its client's bytes."""
        return all(TXN_BYTES_FEATURE in m.features for m in self.membership.members())

    def start(self) -> None:
        """Campaign for the lead (call once clients can reach this replica)."""
        self.election.start()
        self._retention = threading.Thread(target=self._retain, name="brain-retention", daemon=True)
        self._retention.start()
        self._placement = threading.Thread(target=self._separate_leaders, name="brain-placement", daemon=True)
        self._placement.start()

    # -- what the API layer asks ----------------------------------------------------

    def leader_id(self) -> int:
        return self.election.leader_id or self.engine.store.leader_id

    def serving_problem(self) -> str | None:
        """Why this replica cannot answer writes and linearizable reads now,
        or None (the health service says NOT_SERVING while there is one):
        its engine failed (``engine_failed``), or it has no leader.

        Its NATS connection carries the journal, the election and
        forwarding; the election's view of the leader turns 0 once the
        leader's key has gone unrenewed, or unanswered, for the election
        timeout."""
        if self.cannot_lead is not None:
            return "this replica refuses writes until restarted"
        if not self.conn.is_connected:
            return "journal unreachable"
        if not self.has_leader():
            return "no leader"
        return None

    def has_leader(self) -> bool:
        """Whether this replica has a leader now: the one definition behind
        require-leader (etcd's ``s.Leader() != None``, through
        Engine.has_leader), the health service and etcd_server_has_leader's
        cluster view.

        True while all three hold:

        * its NATS connection is up (it carries the journal and the election);
        * the election names a leader (``leader_id``: the key's holder, 0
          once the key went unrenewed for the election timeout, or this
          replica lost it);
        * it heard the holder's heartbeat, or NATS answered about the key,
          within the election timeout and a poll interval (``last_answer``):
          a replica whose NATS servers stopped answering without closing the
          connection (paused, partitioned) keeps its last view, so an old
          answer does not count.  A holder whose NATS lost its quorum fails
          to renew the key and stops beating once the key's TTL has passed.

        So a replica cut off from NATS, or whose NATS lost its quorum, has
        no leader after at most the election timeout (plus one poll), as an
        etcd follower forgets its leader an election timeout after its last
        heartbeat."""
        election = self.election
        return (self.conn.is_connected and bool(election.leader_id)
                and lease_clock.now() - election.last_answer <= election.timeout + POLL_INTERVAL)

    def members(self) -> list[Member]:
        self.membership.set_applied(self.engine.statistics().applied_index)
        return self.membership.members()

    def add_member(self, name: str, peer_urls: list[str]) -> Member:
        return self.membership.add(name, peer_urls)

    def remove_member(self, member_id: int) -> bool:
        return self.membership.remove(member_id)

    def move_leader(self, member_id: int, timeout: float = 10.0) -> None:
        """Hand the lead to another replica (etcd's MoveLeader); returns
        once it leads, or raises TimeoutError."""
        self.election.set_candidate(False)
        try:
            self.election.hand_over(member_id)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.engine.store.leader_id == member_id:
                    return
                time.sleep(0.02)
            raise TimeoutError(f"member {member_id:x} did not take the lead within {timeout:g}s")
        finally:
            self.election.set_candidate(self.cannot_lead is None)

    # -- retention -----------------------------------------------------------------------

    def _retain(self) -> None:
        while not self._stop.wait(RETENTION_INTERVAL):
            try:
                self.retain_once()
            except Exception as e:  # noqa: BLE001 - retried next time
                log.warning("journal retention: %r", e)

    def retain_once(self) -> int:
        """On the leader: purge what every live replica has checkpointed."""
        if not self.engine.is_leader:
            return 0
        self.membership.refresh()
        floor = self.membership.retention_floor()
        if not floor or floor + 1 <= self.journal.first_index:
            return 0
        n = self.journal.purge(floor + 1)
        self.purged += n
        if n:
            log.info("purged %d journal messages below index %d (every live replica has checkpointed them)",
                     n, floor + 1)
        return n

    # -- stream leaders ------------------------------------------------------------------

    def _separate_leaders(self) -> None:
        journal_stream = stream_names(self.cluster_name)[0]
        bucket_stream = f"KV_{election_bucket(self.cluster_name)}"
        while not self._stop.wait(placement.INTERVAL):
            if not self.engine.is_leader:
                continue
            try:
                placement.separate_leaders(self.conn, journal_stream, bucket_stream)
            except Exception as e:  # noqa: BLE001 - retried next time
                log.debug("checking the streams' leaders: %r", e)

    # -- closing -----------------------------------------------------------------------------

    def _removed(self) -> None:
        log.error("the member has been permanently removed from the cluster; stopping")
        self.removed = True
        if self.on_removed is not None:
            self.on_removed()

    def close(self) -> None:
        self._stop.set()
        self.election.set_candidate(False)
        # while still leading: reading the member list and moving the key are
        # JetStream round trips that would otherwise lengthen the pause
        target = self._successor() if self.election.has_key else 0
        if target:
            try:
                self.election.hand_over(target)  # steps the engine down once the key names the target
            except Exception as e:  # noqa: BLE001 - resigning instead
                log.warning("handing the lead to %x at shutdown failed (%r); resigning it", target, e)
        try:
            self.engine.step_down()
        except Exception:  # noqa: BLE001
            log.exception("stepping down at shutdown")
        self.election.stop(resign=True)  # resigns the key if it was not handed over
        self.membership.stop()
        self.forwarding.stop()
        self.snapshots.stop()
        self.engine.close()
        self.conn.close()
        for thread in (self._retention, self._placement):
            if thread is not None:
                thread.join(2)


    def _successor(self) -> int:
        """Whom to hand the lead to at shutdown (0: nobody)."""
        try:
            self.membership.refresh()
        except Exception as e:  # noqa: BLE001 - the last refresh will do
            log.debug("membership refresh at shutdown: %r", e)
        target = successor(self.membership.members(), self.engine.member_id, time.time())
        if not target:
            log.info("no live follower to hand the lead to; resigning it")
        return target


def jetstream_streams(name: str) -> list[str]:
    """The JetStream streams every write and election of brain cluster
    ``name`` goes through: its journal and its election and membership
    buckets.  A rolling restart of the NATS servers moves their leaders off
    a server before it stops (docs/cluster.md "Operations")."""
    return [stream_names(name)[0], f"KV_{election_bucket(name)}", f"KV_{members_bucket(name)}"]


def successor(members: list[Member], me: int, now: float) -> int:
    """The member to hand the lead to: of the others heard from within
    SUCCESSOR_FRESH_SECONDS (wall clock), the one that has applied the most
    (it catches up fastest); 0 if none."""
    live = [m for m in members if m.id != me and m.updated and now - m.updated <= SUCCESSOR_FRESH_SECONDS]
    if not live:
        return 0
    return max(live, key=lambda m: (m.applied_index, m.updated)).id


def _check_journal_holds(journal: JetStreamJournal, engine: Engine) -> None:
    """Refuse to start on a journal that ends before the records this
    replica's data directory applied: they were lost (the stream deleted
    and created again empty, its NATS servers' storage lost), and a replica
    serving on would hide it.  A stream leader cut off from its quorum
    answers an old end for a while (JOURNAL_SHORT_FOR says how long it is
    waited out); a journal that does not answer is left to the election,
    which checks the same before it leads."""
    started = time.monotonic()
    while True:
        try:
            end = journal.state().last_seq
        except (JournalUnavailableError, TimeoutError) as e:
            log.warning("cannot read the journal's end at start-up (%s); the election checks it", e)
            return
        applied = engine.applied_index
        if end >= applied:
            return
        waited = time.monotonic() - started
        if waited >= JOURNAL_SHORT_FOR:
            raise JournalError(
                f"the journal stream {journal.stream} ends at index {end}, before index {applied} that this "
                f"replica's data directory applied: records it held are lost (the stream was deleted or created "
                f"again, or its NATS servers lost their storage).  Refusing to start on it")
        log.warning("the journal ends at index %d, before index %d that this replica applied; waiting %.0fs "
                    "more for a NATS server cut off from its quorum to stop answering", end, applied,
                    JOURNAL_SHORT_FOR - waited)
        time.sleep(1.0)


def _clear_data_dir(data_dir: str) -> None:
    """Empty a replica's data directory (it belongs to this cluster: the
    engine checked the cluster ID before replaying)."""
    import shutil

    for entry in os.listdir(data_dir):
        path = os.path.join(data_dir, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _retrying(fn, what: str, deadline: float):
    """``fn()``, retried while NATS answers with timeouts or "no
    responders" (a JetStream cluster still electing its meta leader, or
    another replica creating the same stream right now)."""
    import nats.errors

    from ..journal.jetstream_stream import StreamSettingsError

    delay = 0.2
    while True:
        try:
            return fn()
        except StreamSettingsError:
            raise
        except (nats.errors.Error, TimeoutError, JournalError) as e:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: %s; retrying", what, e or type(e).__name__)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _ignore_barrier(index, exc) -> None:
    """The election asks for a barrier for its acknowledgement alone
    (JetStreamJournal.acknowledged_at), not for the index it confirms."""


def journal_replicas_of(journal: JetStreamJournal) -> int:
    try:
        return journal.state().replicas
    except Exception:  # noqa: BLE001
        return 0

