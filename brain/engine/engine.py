"""The engine: the MVCC store made durable, as the API layer sees it.

It opens a data directory (its identity and layout, brain.engine.datadir;
the value store; the local journal, or a shared one for a replica of a
brain cluster), recovers the store from the last checkpoint plus the
journal's tail (brain.engine.recovery), and hands it to the *committer*
(brain.engine.committer), the one thread that changes it: group commit,
publishing, the lock order and crash safety are written there.

Writes: callers ``submit`` requests (a Future each) or ``submit_batch``
them (one callback per commit batch); the committer answers once their
journal record is durable.  Reads are served at the committed revision,
the newest one whose record is durable, from memory.

Roles: on its own local journal the engine always leads: its committer
decides every write.  On a shared journal it starts as a follower that
applies what the leader journaled and forwards its clients' writes
(brain.engine.replication), and brain.cluster promotes it when it wins the
election.  What the engine asks of its cluster is one frozen object,
``ClusterHooks``, given to ``Engine.open``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Callable

from .. import backend as backend_mod
from ..journal import SegmentJournal, SharedJournal
from ..mvcc import errors
from ..mvcc.requests import (
    Authorized,
    CompactRequest,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from ..mvcc.shard_map import default_boundaries, layout_problem
from ..mvcc.store import Store
from ..mvcc.validation import txn_writes_nothing
from . import datadir, recovery
from .alarms import StoredAlarms
from .checkpoint_meta import CheckpointMeta
from .committer import Committer
from .compactor import Compactor, parse_retention
from .config import EngineConfig
from .history import History
from .ids import new_id
from .items import Effects
from .leases import IdGenerator, LeaseKeeper, LeaseLeasesResult, LeaseTimeToLiveResult, effective_ttl
from .hooks import ClusterHooks
from .pending import BatchSink, FutureSink, Pending
from .roles import Forwarder, Leader
from .statistics import EngineStatistics, statistics_of
from .timeouts import REQUEST_TIMEOUT
from .watching import WatchStreamHandle

log = logging.getLogger("brain.engine")


class DataDirLocked(RuntimeError):
    pass


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Parsed before touching the data directory: a bad one fails here.
        self._retention = parse_retention(config.auto_compaction_mode, config.auto_compaction_retention)
        self.alarms: StoredAlarms | None = None  # the data directory's, once open
        self.cluster_id = 0
        self.member_id = 0
        self.cluster: ClusterHooks | None = None
        self.committer: Committer | None = None  # set when the engine opens

    # ------------------------------------------------------------------
    # opening and recovery

    @classmethod
    def open(cls, config: EngineConfig, *, journal: SharedJournal | None = None, cluster_id: int | None = None,
             cluster: ClusterHooks | None = None) -> "Engine":
        """Open the data directory and recover.  With ``journal`` (a shared
        journal, the ``cluster_id`` it belongs to and the ``cluster`` hooks)
        the engine is a replica of that cluster and starts as a follower;
        otherwise it owns a local journal in the data directory and leads
        itself."""
        if (journal is None) != (cluster is None):
            raise ValueError("a shared journal and the cluster's hooks come together")
        eng = cls(config)
        eng.cluster = cluster
        eng._open(journal, cluster_id)
        return eng

    def _open(self, shared: SharedJournal | None, cluster_id: int | None) -> None:
        cfg = self.config
        datadir.check_servable(cfg.data_dir)  # not etcd's directory, nor anyone else's
        os.makedirs(cfg.data_dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(cfg.data_dir, datadir.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DataDirLocked(f"data directory {cfg.data_dir} is in use by another process")
        try:
            self._open_locked(shared, cluster_id)
        except BaseException:
            backend = getattr(self, "backend", None)
            if backend is not None:
                backend.close()
            os.close(self._lock_fd)
            raise

    def _open_locked(self, shared: SharedJournal | None, cluster_id: int | None) -> None:
        cfg = self.config
        boundaries = cfg.shard_boundaries if cfg.shard_boundaries is not None else default_boundaries(cfg.shards)
        problem = layout_problem(cfg.shards, boundaries)
        if problem is not None:
            raise ValueError(problem)
        self._boundaries = list(boundaries)
        values_dir = os.path.join(cfg.data_dir, datadir.VALUES_DIR)
        if cfg.backend == "lmdb":
            os.makedirs(values_dir, exist_ok=True)
        self.backend = backend_mod.open_backend(cfg.backend, values_dir, cfg.shards)
        identity = self._identify(cluster_id)
        self.alarms = StoredAlarms(self.backend)

        started = time.monotonic()
        if shared is None:
            self.journal = SegmentJournal.open(os.path.join(cfg.data_dir, datadir.JOURNAL_DIR),
                                               segment_bytes=cfg.segment_bytes)
        else:
            self.journal = shared
        with recovery.index_building():
            store, applied_index, replayed_bytes = self._load_store()
        recovery.keep_out_of_gc(store)
        self._lease_ids = IdGenerator(self.member_id)
        self.committer = Committer(
            cfg, store=store, applied_index=applied_index, journal=self.journal, backend=self.backend,
            member_id=self.member_id, term=store.epoch if shared is not None else identity.term,
            alarms=self.alarms, raise_nospace=lambda why: self.alarms.raise_nospace(self.member_id, why),
            make_leader=self._make_leader,
            cluster=self.cluster, replayed_bytes=replayed_bytes,
            load_store=lambda upto: self._load_store(upto))
        store.collect_changes()
        log.info("recovered to revision %d in %.2fs", store.revision, time.monotonic() - started)
        self.committer.start()

    def _identify(self, cluster_id: int | None) -> datadir.Identity:
        """Check the stored layout against this start's, and count the start
        (a single node's term); a new directory gets new IDs."""
        cfg, backend = self.config, self.backend
        layout = backend.get_meta(datadir.META_LAYOUT)
        if layout is not None:
            stored = datadir.decode_layout(layout)
            if stored != self._boundaries:
                raise ValueError(
                    f"data directory {cfg.data_dir} was created with shard boundaries "
                    f"{stored!r}; this server was started with {self._boundaries!r} (resharding is not supported)"
                )
        raw = backend.get_meta(datadir.META_IDENTITY)
        ident = (datadir.Identity.decode(raw) if raw
                 else datadir.Identity(cluster_id or new_id(), new_id()))
        if cluster_id is not None and ident.cluster_id != cluster_id:
            raise ValueError(
                f"data directory {cfg.data_dir} belongs to cluster {ident.cluster_id:x}, but the journal "
                f"belongs to cluster {cluster_id:x}; use an empty data directory to join this cluster")
        ident = datadir.Identity(ident.cluster_id, ident.member_id, ident.term + 1, ident.name,
                                 ident.restored_from)
        self.cluster_id, self.member_id = ident.cluster_id, ident.member_id
        backend.write(backend_mod.WriteBatch(meta=datadir.meta_entries(ident, self._boundaries)))
        return ident

    def _load_store(self, upto_index: int | None = None) -> tuple[Store, int, int]:
        """brain.engine.recovery.load_store of this engine's value store and
        journal (store, last index held, journal bytes replayed)."""
        return recovery.load_store(self.backend, self.journal, self._boundaries, self.config.max_txn_ops,
                                   upto_index)

    def _make_leader(self) -> Leader:
        """The leader's role: lease clocks and auto-compaction run where
        writes are decided."""
        cfg = self.config
        keeper = LeaseKeeper(self._expire_lease)
        # Lease clocks: every recovered lease gets its full TTL from now.
        keeper.restore((lease.id, lease.ttl) for lease in self.store.lessor.leases.values())
        if cfg.lease_expiry:
            keeper.start()
        compactor = Compactor(cfg.auto_compaction_mode, self._retention, lambda: self.committed_rev, self.compact)
        compactor.start()
        return Leader(keeper, compactor, committed_revision=lambda: self.committed_rev,
                      attached_keys=self._attached_keys)

    def _attached_keys(self, lease_id: int) -> list[bytes]:
        return self.lease_keys(lease_id)

    def lease_keys(self, lease_id: int) -> list[bytes]:
        """The keys a lease holds now, sorted ([] for an unknown lease)."""
        with self.committer.lock:
            lease = self.store.lessor.leases.get(lease_id)
            return sorted(lease.keys) if lease is not None else []

    def lease_ids(self) -> list[int]:
        with self.committer.lock:
            return list(self.store.lessor.leases)

    def _expire_lease(self, lease_id: int) -> Future:
        """A lease's deadline passed: revoke it, here or nowhere (as the
        server itself, which auth never refuses: etcd revokes as root)."""
        sink = FutureSink(1)
        revoke = Authorized(LeaseRevokeRequest(lease_id), system=True)
        self.committer.enqueue([Pending(revoke, sink, 0, local=True)])
        return sink.futures[0]

    # ------------------------------------------------------------------
    # the committed view (the committer owns it)

    @property
    def store(self) -> Store:
        return self.committer.store

    @property
    def committed_rev(self) -> int:
        return self.committer.committed_rev

    @property
    def applied_index(self) -> int:
        """The last journal record this replica applied (on the leader:
        the last one acknowledged)."""
        return self.committer.applied_index

    @property
    def term(self) -> int:
        """The epoch of the journal this replica last saw (a single node:
        how many times it started), etcd's raft term in response headers."""
        return self.committer.term

    @property
    def watches(self):
        return self.committer.watches

    @property
    def auth(self):
        """The auth state calls are checked against (brain.mvcc.auth.AuthState,
        immutable): the one of the last published batch, read without a lock."""
        return self.committer.committed_auth

    @property
    def tokens(self):
        """The simple tokens this replica honours (brain.engine.tokens)."""
        return self.committer.tokens

    @property
    def journal_sync_hooks(self) -> list:  # duration observers (seconds) of journal syncs, for metrics
        return self.committer.journal_sync_hooks

    @property
    def checkpoint_hooks(self) -> list:  # ... of checkpoint writes
        return self.committer.checkpoint_hooks

    @property
    def role_hooks(self) -> list:  # called on the committer after the role or the leader changed
        return self.committer.role_hooks

    @property
    def leader_changes(self) -> int:
        return self.committer.leader_changes

    # ------------------------------------------------------------------
    # who leads (the replica's part: brain.engine.replication)

    @property
    def role(self) -> str:
        return self.committer.role.name

    @property
    def is_leader(self) -> bool:
        return self.committer.is_leader

    @property
    def leader_id(self) -> int:
        """The member ID of the replica leading the journal (0: unknown);
        on a single node, this one.  The journal's last epoch record names
        it; until this replica has applied one (a replica started from a
        snapshot), the election's view stands in."""
        if self.cluster is None:
            return self.member_id
        return self.store.leader_id or self.cluster.leader_hint()

    @property
    def has_leader(self) -> bool:
        """Whether this server has a leader now (etcd's ``s.Leader() !=
        None``), what require-leader calls are refused without.  A single
        node always has one: itself.  A replica asks the cluster."""
        return self.cluster is None or self.cluster.has_leader()

    @property
    def read_lease(self) -> Callable[[], bool] | None:
        """True while this replica, leading, may answer a read index without
        asking the journal (None: the lease is off, or a single node)."""
        return self.committer.read_lease

    @property
    def forwarder(self) -> Forwarder | None:
        """How this replica reaches the leader now (None: a single node, or
        no leader known)."""
        return self.committer.forwarder

    @property
    def election_timeout(self) -> float:
        """How often require-leader checks an open stream (seconds)."""
        return self.cluster.election_timeout if self.cluster is not None else 1.0

    @property
    def unwritten_confirmations(self) -> int:
        """Answers decided without a journal record that asked the journal
        before they were given (Replication.confirm_unwritten)."""
        return self.committer.replication.unwritten_confirmations

    @property
    def read_index_round_trips(self) -> int:
        """Read-index round trips this replica started (0 on a single node)."""
        barrier = self.committer.barrier
        return barrier.round_trips if barrier is not None else 0

    def use_read_index(self, ask) -> None:
        """Where linearizable reads get their read index from:
        ``ask(callback(index, exc))`` (default: ``journal_barrier``, which
        only a leader answers; brain.cluster asks the leader from anywhere)."""
        if self.committer.barrier is not None:
            self.committer.barrier.use_source(ask)

    def promote(self, holds_key) -> bool:
        """(any thread) Try to become the leader; True on success.  Called
        by the cluster package once it holds the election key;
        ``holds_key()`` tells whether that hold is still valid
        (Replication.promote)."""
        return self.committer.replication.promote(holds_key)

    def step_down(self) -> None:
        """(any thread) Stop leading (the election key was lost)."""
        self.committer.replication.step_down()

    # ------------------------------------------------------------------
    # reads (served at the committed revision)

    def range(self, req: RangeRequest):
        c = self.committer
        with c.lock:
            return c.store.range(req, c.committed_rev)

    def range_columns(self, req: RangeRequest):
        """A Range in columns (Store.range_columns): how the KV service
        answers, so a list builds no object per key."""
        c = self.committer
        with c.lock:
            return c.store.range_columns(req, c.committed_rev)

    def range_chunk(self, req: RangeRequest):
        """One chunk of a RangeStream, in columns: a range without its total
        count (Store.range_chunk), so a limited chunk costs O(limit)."""
        c = self.committer
        with c.lock:
            return c.store.range_chunk(req, c.committed_rev)

    def read_barrier(self, callback) -> bool:
        """Make linearizable reads safe.  True: reads at ``committed_rev``
        are linearizable now (always so on a single node, whose committer is
        the only writer).  False: ``callback(exc)`` will be called once on
        an engine thread, with exc None when reads may go ahead or an
        EtcdError (request timed out, no leader) when they must fail.  One
        barrier serves any number of reads that began before it was asked,
        so callers group the reads of a batch behind one call."""
        c = self.committer
        barrier = c.barrier
        if barrier is None:
            return True
        if c.role.within_read_lease(c.read_lease):
            # A leader within its lease: no other writer can exist, so the
            # journal ends at this replica's last append.  A record appended
            # but not yet acknowledged may already be stored, and applied by a
            # follower whose reader saw it: wait for its acknowledgement.
            return barrier.wait_index(self.journal.last_index, callback)
        barrier.request(callback)
        return False

    def wait_linearizable(self, timeout: float = REQUEST_TIMEOUT) -> None:
        """Block until reads are linearizable (for callers on their own
        thread, like grpcio handlers); raises the barrier's EtcdError."""
        if self.committer.barrier is None:
            return
        done = threading.Event()
        outcome: list = [None]

        def passed(exc) -> None:
            outcome[0] = exc
            done.set()

        if self.read_barrier(passed):
            return
        if not done.wait(timeout):
            raise errors.ErrTimeout.fresh()
        if outcome[0] is not None:
            raise errors.raisable(outcome[0])

    def watch_stream(self, wakeup=None) -> WatchStreamHandle:
        """A new watch stream (one per client Watch RPC); ``wakeup`` (see
        WatchStreamHandle) lets an event-driven server poll it instead of
        blocking a thread in ``get``."""
        return self.committer.watches.open_stream(wakeup)

    # ------------------------------------------------------------------
    # writes

    def submit(self, request) -> Future:
        """Queue a write request; the future completes with its result or
        EtcdError once its journal record is on disk."""
        return self.submit_many((request,))[0]

    def submit_many(self, requests) -> list[Future]:
        """``submit`` for several requests at once: one queue operation and
        one wake-up, so a batch that arrived together commits together."""
        sink = FutureSink(len(requests))
        self.committer.enqueue([Pending(r, sink, i) for i, r in enumerate(requests)], refusable=True)
        return sink.futures

    def submit_batch(self, requests, callback, *, local: bool = False, wires=None) -> None:
        """Queue ``requests`` like ``submit_many``; outcomes are delivered as
        ``callback([(slot, result, exc), ...])`` on the committer thread,
        once per commit batch that settles some of them (``slot`` is the
        request's place in ``requests``; ``exc`` None or an EtcdError).  The
        cheap path for the batching gRPC front.  ``local``: decide them here
        or answer ErrNotLeader (for writes another replica forwarded).
        ``wires``: for each request its client's bytes or None, what a
        follower forwards instead of encoding the request (Pending.wire)."""
        sink = BatchSink(callback)
        if wires is None:
            pending = [Pending(r, sink, i, local) for i, r in enumerate(requests)]
        else:
            pending = [Pending(r, sink, i, local, w) for i, (r, w) in enumerate(zip(requests, wires))]
        self.committer.enqueue(pending, refusable=not local)
        sink.flush()  # outcomes settled already (engine stopping, too many requests)

    def submit_effects(self, payload: bytes) -> Future:
        """Journal and apply a payload of effects as it is (brain.mvcc.codec:
        revisions continuing this engine's, lease grants and revokes,
        compaction): what a mirror of another store writes.  The future
        completes with the new revision once the payload is durable;
        readers and watchers see it then.  A payload that does not continue
        the revision is refused with ValueError and nothing is applied."""
        return self.submit(Effects(payload))

    def journal_barrier(self, callback) -> None:
        """A read index confirmed by the journal's quorum (leading only):
        Committer.journal_barrier."""
        self.committer.journal_barrier(callback)

    def _write(self, request):
        return self.submit(request).result()

    def put(self, req: PutRequest):
        return self._write(req)

    def delete_range(self, req):
        return self._write(req)

    def txn(self, req: TxnRequest):
        if txn_writes_nothing(req):
            c = self.committer
            with c.lock:
                return c.store.txn_readonly(req, c.committed_rev)
        return self._write(req)

    def compact(self, req: CompactRequest):
        return self._write(req)

    def lease_grant(self, req: LeaseGrantRequest):
        return self._write(self.prepare_lease_grant(req))

    def prepare_lease_grant(self, req: LeaseGrantRequest) -> LeaseGrantRequest:
        """The grant to submit: etcd's minimum TTL applied and, for ID 0, an
        ID chosen here (never 0, never an existing lease's)."""
        ttl = effective_ttl(req.ttl)
        lease_id = req.id
        while lease_id == 0:
            lease_id = self._lease_ids.next()
            with self.committer.lock:
                if self.store.lessor.exists(lease_id):
                    lease_id = 0
        return LeaseGrantRequest(ttl, lease_id)

    def lease_revoke(self, req):
        return self._write(req)

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew a lease (not journaled, as in etcd); returns its TTL."""
        return self.committer.role.lease_keepalive(lease_id)

    def lease_keepalive_many(self, lease_ids, callback) -> None:
        """Renew several leases: ``callback([(id, ttl or EtcdError), ...])``
        in order (ttl 0: no such lease, as etcd answers), at once on the
        leader, later on another thread where a follower asks the leader:
        callers must not block on it (brain.engine.roles)."""
        self.committer.role.lease_keepalive_many(lease_ids, callback)

    def renew_leases(self, lease_ids) -> list:
        """The leader's part of lease_keepalive_many (ErrNotLeader for
        each on a follower)."""
        return self.committer.role.renew_leases(lease_ids)

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLiveResult:
        return self.committer.role.lease_time_to_live(lease_id, keys)

    def lease_leases(self) -> LeaseLeasesResult:
        """Live lease IDs, soonest expiry first (etcd's order)."""
        return self.committer.role.lease_leases()

    # ------------------------------------------------------------------
    # alarms, compaction pins, work on the committer thread (maintenance)

    def alarm_activate(self, member_id: int, alarm: int) -> bool:
        """Raise an alarm (stored with the data); False if already raised."""
        return self._store_alarms(lambda: self.alarms.raise_alarm(member_id, alarm))

    def alarm_deactivate(self, member_id: int, alarm: int) -> bool:
        """Clear an alarm; False if it was not raised.  On a disk still
        full it stays raised: etcd's NOSPACE error."""
        return self._store_alarms(lambda: self.alarms.clear_alarm(member_id, alarm))

    def _store_alarms(self, change) -> bool:
        try:
            return change()
        except backend_mod.BackendFullError as e:
            log.warning("the alarms could not be stored: %s", e)
            raise errors.ErrNoSpace.fresh() from e

    def history(self) -> History:
        """The committed history, for readers that walk it while writes go
        on (hashes, snapshots, export, the mirror): brain/engine/history.py."""
        return History(self.committer.lock, self.store, self)

    def pin_compaction(self) -> None:
        """Hold physical compaction (logical compaction still happens)
        until unpin_compaction; history above the compaction revision read
        now stays readable meanwhile.  Call with the engine lock held."""
        self.committer.compaction_pins += 1

    def unpin_compaction(self) -> None:
        with self.committer.lock:
            self.committer.compaction_pins -= 1

    def on_committer(self, fn):
        """Run fn() on the committer thread between batches, when the store
        holds exactly the committed state, and return its result."""
        return self.committer.on_committer(fn)

    def checkpoint(self) -> None:
        """Run a full checkpoint now (used by tests and shutdown)."""
        c = self.committer
        c.on_committer(lambda: c.checkpointer.now(c.store, c.applied_index, may_start=c.failed is None))

    def checkpoint_index(self) -> int:
        """The last journal index the value store's checkpoint holds (0:
        none yet); a replica's records up to it may be purged."""
        meta = CheckpointMeta.read(self.backend)
        return 0 if meta is None else meta.journal_index

    # ------------------------------------------------------------------
    # shutdown and introspection

    def close(self, checkpoint: bool = True) -> None:
        """Stop: answer what is queued, write a final checkpoint (so the
        next start replays no journal) and release the data directory.
        ``checkpoint=False`` leaves the directory as a kill -9 would, with
        the journal's tail to replay (recovery tests)."""
        c = self.committer
        if c.stopping:
            return
        # a batch waiting for an unreachable shared journal gives up now
        c.closing = True
        c.role.stop(wait=True)
        if checkpoint:
            try:
                self.checkpoint()
            except Exception:
                log.exception("final checkpoint failed; the journal still holds every write")
        c.stop()
        c.watches.close()
        c.checkpointer.join()
        self.journal.close()
        self.backend.close()
        os.close(self._lock_fd)

    def statistics(self) -> EngineStatistics:
        return statistics_of(self.committer, self.leader_id)
