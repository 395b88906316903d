"""The engine: the MVCC store made durable.

Writes: callers `submit` requests; one committer thread takes everything that
queued up, applies it to the store as one batch, appends one journal record
for the whole batch, fdatasyncs once, and only then publishes the new
revision and completes the callers (group commit).  While it syncs, the next
batch queues.  A leader's commit and a follower's apply of a journal record
end the same way, in `_publish`: the committed revision and applied index
move together, watchers are notified, waiting linearizable reads go ahead.
Other threads hand the committer work as typed items (brain.engine.items),
one inbox per kind.

Reads are served at `committed_rev`, the newest revision whose journal record
is on disk, so no reader sees a write that a crash could undo, even though the
store's in-memory state may already be a batch ahead.

Lock order: `_lock` guards the store and `committed_rev`; it is never held
while waiting on the disk (journal sync, checkpoint writes), and the queue's
condition variable is never taken while holding `_lock`.

Crash safety: the value store only receives whole checkpoints (records up to
a cut, plus the cut's journal index, in one atomic synced write:
brain/engine/checkpointing.py, its meta's format in checkpoint_meta.py).
Recovery (brain/engine/recovery.py) = load the last checkpoint + replay
journal records after its index.  A journal
failure after a batch was applied in memory cannot be rolled back, so the
engine stops taking writes (reads keep working at the committed revision,
which never included that batch) until it is restarted.

Roles: on its own local journal the engine is always the *leader*: its
committer decides every write.  On a shared journal (a replica of a brain
cluster, see brain/engine/replication.py) it starts as a *follower* that
applies what the leader journaled and forwards its clients' writes, and the
cluster package promotes it when it wins the election.  What differs
between the two (where a batch of writes goes, who answers lease calls, the
lease clocks and the compactor that only a leader runs) is the role object
the engine holds (brain/engine/roles.py).  Following, forwarding and the
changes of lead are a Replication the engine holds, which reaches the
committer only through the interface written there (ReplicaCore).  One
thread, the committer, changes the store in either role.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from .. import backend as backend_mod
from ..journal import (
    JournalFencedError,
    JournalUnavailableError,
    SegmentJournal,
    SharedJournal,
)
from ..mvcc.store import Store
from ..mvcc import errors
from ..mvcc.requests import (
    CompactRequest,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from ..mvcc.shard_map import default_boundaries, layout_problem
from ..mvcc.validation import txn_writes_nothing
from ..thread_names import name_os_thread
from .alarms import ALARM_CORRUPT, ALARM_NOSPACE, AlarmSet
from .compactor import Compactor, parse_retention
from . import datadir, recovery
from .checkpoint_meta import CheckpointMeta
from .checkpointing import Checkpointer
from .config import EngineConfig
from .history import History
from .items import Confirmation, Control, Delivered, Effects, ForwardOutcome, JournalBarrier
from .memory import release_free_memory
from .leases import IdGenerator, LeaseKeeper, LeaseLeasesResult, LeaseTimeToLiveResult, effective_ttl
from .readindex import ReadBarrier
from .replication import Replication
from .roles import LEADER, Follower, Forwarder, Leader
from .watching import WatchManager, WatchStreamHandle
from .ids import new_id

log = logging.getLogger("brain.engine")

META_IDENTITY = b"brain.identity"
META_LAYOUT = b"brain.layout"
META_ALARMS = b"brain.alarms"


# How long a write waits for an answer it may never get (etcd: its request
# timeout, 5 s + 2 x election timeout); past it the caller gets
# ErrTimeout and the outcome is unknown to it.
REQUEST_TIMEOUT = 7.0
# Read-index round trips a replica keeps in flight at once (each serves the
# linearizable reads that began before it was sent).
READ_INDEX_IN_FLIGHT = 4


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    revision: int
    committed_revision: int
    compact_revision: int
    keys_total: int
    keys_live: int
    memtable_records: int
    batches: int
    requests: int
    checkpoints: int
    last_checkpoint_seconds: float
    journal_bytes_since_checkpoint: int
    backend_size_bytes: int
    backend_in_use_bytes: int
    leases: int
    failed: str | None
    leases_expired: int = 0  # revoked by expiry since this replica began leading
    role: str = LEADER
    applied_index: int = 0
    leader_id: int = 0
    epoch: int = 0


class _FutureSink:
    """Where a ``submit`` call's outcome goes: a Future per request."""

    __slots__ = ("futures",)

    def __init__(self, n: int) -> None:
        self.futures = [Future() for _ in range(n)]

    def add(self, index: int, result, exc) -> bool:
        f = self.futures[index]
        if exc is not None:
            # result() raises it: a shared EtcdError would collect tracebacks
            f.set_exception(errors.raisable(exc))
        else:
            f.set_result(result)
        return False  # nothing to flush


class _BatchSink:
    """Where a ``submit_batch`` call's outcomes go: collected while the
    committer settles a commit batch, then handed to ``callback`` in one
    call (no Future, lock or closure per request)."""

    __slots__ = ("callback", "items")

    def __init__(self, callback) -> None:
        self.callback = callback
        self.items: list = []

    def add(self, index: int, result, exc) -> bool:
        self.items.append((index, result, exc))
        return len(self.items) == 1  # first item: flush this sink later

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            try:
                self.callback(items)
            except Exception:  # noqa: BLE001 - a caller's bug must not stop the committer
                log.exception("write completion callback failed")


class _Pending:
    """A queued write: settled exactly once, with a result or an EtcdError.

    ``local``: decided here or nowhere: a write forwarded to this replica by
    another one, or a lease expiry, is never forwarded on (a replica that
    is no longer the leader answers ErrNotLeader and the sender retries)."""

    __slots__ = ("request", "sink", "index", "wait_compact", "result", "settled", "local", "deadline")

    def __init__(self, request, sink, index: int, local: bool = False) -> None:
        self.request = request
        self.sink = sink
        self.index = index
        self.wait_compact = (request.revision if isinstance(request, CompactRequest) and request.physical
                             else 0)
        self.result = None
        self.settled = False
        self.local = local
        self.deadline = 0.0  # set when first forwarded to a leader


class DataDirLocked(RuntimeError):
    pass


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Parsed before touching the data directory: a bad one fails here.
        self._retention = parse_retention(config.auto_compaction_mode, config.auto_compaction_retention)
        self._lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[_Pending] = deque()
        # Everything else for the committer, by kind (brain.engine.items).
        self._inboxes: dict[type, list] = _empty_inboxes()
        self._stopping = False
        self._closing = False
        self._failed: errors.EtcdError | None = None
        self._failed_reason: str | None = None
        self._compact_waiters: list[tuple[int, _Pending]] = []
        self._dirty_sinks: list[_BatchSink] = []  # settled outcomes not yet delivered
        self._batches = 0
        self._requests = 0
        self.raft_term = 1
        self.cluster_id = 0
        self.member_id = 0
        self.alarms = AlarmSet()
        # While > 0, physical compaction waits (a snapshot or hash is reading
        # history below a newer compaction revision).
        self._compaction_pins = 0
        # Duration observers (seconds) for metrics: every journal fdatasync
        # of a batch, every checkpoint write.  Called on engine threads.
        self.journal_sync_hooks: list = []
        self.checkpoint_hooks: list = []
        self._role: Leader | Follower | None = None  # set when the engine opens
        self._barrier: ReadBarrier | None = None
        self._replication: Replication | None = None  # set when the engine opens
        self._applied_index = 0
        # Set by brain.cluster on a replica of a shared journal:
        self.forwarder: Forwarder | None = None  # how a follower reaches the leader
        self.leader_hint = None  # () -> member ID the election names
        # () -> whether this replica has a leader now (brain.cluster.Replica.has_leader),
        # and how often etcd's require-leader asks (the election timeout, seconds)
        self.leader_known = None
        self.election_timeout = 1.0
        # () -> True while this replica, leading, may read without asking the
        # journal (the election's lease: brain.cluster.election.Election.lease_valid)
        self.read_lease = None
        # Called (on the committer) after the role or the leader changed.
        self.role_hooks: list = []
        self.leader_changes = 1  # terms seen (etcd_server_leader_changes_seen_total)

    # ------------------------------------------------------------------
    # opening and recovery

    @classmethod
    def open(cls, config: EngineConfig, *, journal: SharedJournal | None = None,
             cluster_id: int | None = None) -> "Engine":
        """Open the data directory and recover.  With ``journal`` (a shared
        journal and the ``cluster_id`` it belongs to) the engine is a replica
        of that cluster and starts as a follower; otherwise it owns a local
        journal in the data directory and leads itself."""
        eng = cls(config)
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

        layout = self.backend.get_meta(META_LAYOUT)
        identity = self.backend.get_meta(META_IDENTITY)
        if layout is not None:
            stored = [bytes.fromhex(b) for b in json.loads(layout)["boundaries"]]
            if stored != list(boundaries):
                raise ValueError(
                    f"data directory {cfg.data_dir} was created with shard boundaries "
                    f"{stored!r}; this server was started with {list(boundaries)!r} (resharding is not supported)"
                )
        ident = json.loads(identity) if identity else {"cluster_id": cluster_id or new_id(), "member_id": new_id(),
                                                       "term": 0}
        if cluster_id is not None and ident["cluster_id"] != cluster_id:
            raise ValueError(
                f"data directory {cfg.data_dir} belongs to cluster {ident['cluster_id']:x}, but the journal "
                f"belongs to cluster {cluster_id:x}; use an empty data directory to join this cluster")
        ident["term"] = ident.get("term", 0) + 1
        self.cluster_id, self.member_id, self.raft_term = ident["cluster_id"], ident["member_id"], ident["term"]
        self.backend.write(backend_mod.WriteBatch(meta={
            META_LAYOUT: json.dumps({"boundaries": [b.hex() for b in boundaries]}).encode(),
            META_IDENTITY: json.dumps(ident).encode(),
        }))
        self.alarms.load(self.backend.get_meta(META_ALARMS))

        started = time.monotonic()
        if shared is None:
            self.journal = SegmentJournal.open(os.path.join(cfg.data_dir, datadir.JOURNAL_DIR),
                                               segment_bytes=cfg.segment_bytes)
        else:
            self.journal = shared
        with recovery.index_building():
            self.store, self._applied_index, replayed_bytes = self._load_store()
        recovery.keep_out_of_gc(self.store)
        self._checkpointer = Checkpointer(self.backend, self.journal, self._lock, cfg, self.checkpoint_hooks,
                                          journal_bytes=replayed_bytes,
                                          on_full=lambda e: self._raise_nospace(f"a checkpoint found no space ({e})"))
        self.committed_rev = self.store.revision
        if shared is not None:
            self.raft_term = self.store.epoch
        self._lease_ids = IdGenerator(self.member_id)
        self.watches = WatchManager(self.store, self._lock, progress_interval=cfg.watch_progress_notify_interval,
                                    max_queued_events=cfg.watch_queue_events)
        self.store.collect_changes()
        log.info("recovered to revision %d in %.2fs", self.committed_rev, time.monotonic() - started)

        self._committer = threading.Thread(target=self._run, name="brain-committer", daemon=True)
        if shared is not None:
            self._barrier = ReadBarrier(self.journal_barrier, lambda: self._applied_index,
                                        ahead=lambda index: self._replication.journal_ahead(index),
                                        max_in_flight=READ_INDEX_IN_FLIGHT)
        self._replication = Replication(_ReplicaCore(self), self._lock, self.journal, self._barrier,
                                        self._checkpointer)
        if shared is None:
            self._lead()
        else:
            self._role = self._new_follower()
            self._replication.follow()
        self._committer.start()

    def _load_store(self, upto_index: int | None = None) -> tuple[Store, int, int]:
        """brain.engine.recovery.load_store of this engine's value store and
        journal (store, last index held, journal bytes replayed)."""
        return recovery.load_store(self.backend, self.journal, self._boundaries, self.config.max_txn_ops,
                                   upto_index)

    def _lead(self) -> None:
        """Take the leader's role: lease clocks and auto-compaction run
        where writes are decided."""
        cfg = self.config
        keeper = LeaseKeeper(self._expire_lease)
        # Lease clocks: every recovered lease gets its full TTL from now.
        keeper.restore((lease.id, lease.ttl) for lease in self.store.lessor.leases.values())
        if cfg.lease_expiry:
            keeper.start()
        compactor = Compactor(cfg.auto_compaction_mode, self._retention, lambda: self.committed_rev, self.compact)
        compactor.start()
        self._role = Leader(self._commit, keeper, compactor, committed_revision=lambda: self.committed_rev,
                            attached_keys=self._attached_keys)

    def _follow_leader(self) -> None:
        """Give up the leader's role (on the committer thread: the
        compactor, which may be waiting for a write, is not joined)."""
        self._role.stop(wait=False)
        self._role = self._new_follower()

    def _new_follower(self) -> Follower:
        return Follower(self._replication.forward, lambda: self.forwarder)

    def _attached_keys(self, lease_id: int) -> list[bytes]:
        with self._lock:
            lease = self.store.lessor.leases.get(lease_id)
            return sorted(lease.keys) if lease is not None else []

    def _expire_lease(self, lease_id: int) -> Future:
        """A lease's deadline passed: revoke it, here or nowhere."""
        sink = _FutureSink(1)
        self._enqueue([_Pending(LeaseRevokeRequest(lease_id), sink, 0, local=True)])
        return sink.futures[0]

    # ------------------------------------------------------------------
    # who leads (the replica's part: brain.engine.replication)

    @property
    def role(self) -> str:
        return self._role.name

    @property
    def is_leader(self) -> bool:
        return self._role.name == LEADER

    @property
    def applied_index(self) -> int:
        """The last journal record this replica applied (on the leader:
        the last one acknowledged)."""
        return self._applied_index

    @property
    def leader_id(self) -> int:
        """The member ID of the replica leading the journal (0: unknown);
        on a single node, this one.  The journal's last epoch record names
        it; until this replica has applied one (a replica started from a
        snapshot), the election's view (``leader_hint``) stands in."""
        if self._barrier is None:
            return self.member_id
        return self.store.leader_id or (self.leader_hint() if self.leader_hint is not None else 0)

    @property
    def has_leader(self) -> bool:
        """Whether this server has a leader now (etcd's ``s.Leader() !=
        None``), what require-leader calls are refused without.  A single
        node always has one: itself.  A replica asks the cluster
        (``leader_known``, where the definition lives)."""
        return self.leader_known is None or self.leader_known()

    @property
    def unwritten_confirmations(self) -> int:
        """Answers decided without a journal record that asked the journal
        before they were given (Replication.confirm_unwritten)."""
        return self._replication.unwritten_confirmations

    def use_read_index(self, ask) -> None:
        """Where linearizable reads get their read index from:
        ``ask(callback(index, exc))`` (default: ``journal_barrier``, which
        only a leader answers; brain.cluster asks the leader from anywhere)."""
        if self._barrier is not None:
            self._barrier.use_source(ask)

    def promote(self, holds_key) -> bool:
        """(any thread) Try to become the leader; True on success.  Called
        by the cluster package once it holds the election key;
        ``holds_key()`` tells whether that hold is still valid
        (Replication.promote)."""
        return self._replication.promote(holds_key)

    def step_down(self) -> None:
        """(any thread) Stop leading (the election key was lost)."""
        self._replication.step_down()

    def _run_role_hooks(self) -> None:
        self.leader_changes += 1
        for hook in self.role_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001
                log.exception("role hook failed")

    # ------------------------------------------------------------------
    # reads (served at the committed revision)

    def range(self, req: RangeRequest):
        with self._lock:
            return self.store.range(req, self.committed_rev)

    def range_columns(self, req: RangeRequest):
        """A Range in columns (Store.range_columns): how the KV service
        answers, so a list builds no object per key."""
        with self._lock:
            return self.store.range_columns(req, self.committed_rev)

    def range_chunk(self, req: RangeRequest):
        """One chunk of a RangeStream, in columns: a range without its total
        count (Store.range_chunk), so a limited chunk costs O(limit)."""
        with self._lock:
            return self.store.range_chunk(req, self.committed_rev)

    def read_barrier(self, callback) -> bool:
        """Make linearizable reads safe.  True: reads at ``committed_rev``
        are linearizable now (always so on a single node, whose committer is
        the only writer).  False: ``callback(exc)`` will be called once on
        an engine thread, with exc None when reads may go ahead or an
        EtcdError (request timed out, no leader) when they must fail.  One
        barrier serves any number of reads that began before it was asked,
        so callers group the reads of a batch behind one call."""
        barrier = self._barrier
        if barrier is None:
            return True
        if self._role.within_read_lease(self.read_lease):
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
        if self._barrier is None:
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

    # ------------------------------------------------------------------
    # writes

    def watch_stream(self, wakeup=None) -> WatchStreamHandle:
        """A new watch stream (one per client Watch RPC); ``wakeup`` (see
        WatchStreamHandle) lets an event-driven server poll it instead of
        blocking a thread in ``get``."""
        return self.watches.open_stream(wakeup)

    def submit(self, request) -> Future:
        """Queue a write request; the future completes with its result or
        EtcdError once its journal record is on disk."""
        return self.submit_many((request,))[0]

    def submit_many(self, requests) -> list[Future]:
        """``submit`` for several requests at once: one queue operation and
        one wake-up, so a batch that arrived together commits together."""
        sink = _FutureSink(len(requests))
        self._enqueue([_Pending(r, sink, i) for i, r in enumerate(requests)])
        return sink.futures

    def submit_batch(self, requests, callback, *, local: bool = False) -> None:
        """Queue ``requests`` like ``submit_many``; outcomes are delivered as
        ``callback([(index, result, exc), ...])`` on the committer thread,
        once per commit batch that settles some of them (``exc`` is None or
        an EtcdError).  The cheap path for the batching gRPC front.
        ``local``: decide them here or answer ErrNotLeader (for writes
        another replica forwarded)."""
        sink = _BatchSink(callback)
        self._enqueue([_Pending(r, sink, i, local) for i, r in enumerate(requests)])
        sink.flush()  # outcomes settled already (engine stopping)

    def submit_effects(self, payload: bytes) -> Future:
        """Journal and apply a payload of effects as it is (brain.mvcc.codec:
        revisions continuing this engine's, lease grants and revokes,
        compaction): what a mirror of another store writes.  The future
        completes with the new revision once the payload is durable;
        readers and watchers see it then.  A payload that does not continue
        the revision is refused with ValueError and nothing is applied."""
        return self.submit(Effects(payload))

    def journal_barrier(self, callback) -> None:
        """(any thread; leading) A read index confirmed by the journal's
        quorum: once a record appended after this call is acknowledged (the
        next commit batch's, an empty one if it has nothing else to append),
        ``callback(index, None)`` with the index of the record before it;
        ``callback(None, EtcdError)`` if this replica does not lead or the
        append failed.  The record is fenced on that index and a JetStream
        ack means a quorum of the stream's replicas stored it there, which
        a deposed leader, of brain or of the stream, cannot get: so every
        record acknowledged, or visible anywhere, before this call is at or
        below that index (docs/cluster.md, "Reads").  A follower has it
        applied already unless it is behind: it needs no round trip of the
        barrier record itself."""

        def settled(items) -> None:  # on the committer
            _, index, exc = items[0]
            callback(None if exc is not None else index - 1, exc)

        self.submit_batch([JournalBarrier()], settled, local=True)

    def _enqueue(self, pending: list[_Pending]) -> None:
        with self._cv:
            if self._stopping:  # settled here, on the caller's thread
                for p in pending:
                    p.settled = True
                    p.sink.add(p.index, None, errors.ErrStopped)
                return
            was_empty = not self._queue
            self._queue.extend(pending)
            if was_empty and pending:
                self._cv.notify()

    def _settle(self, p: _Pending, result, exc=None) -> None:
        if p.settled:
            return
        p.settled = True
        if p.sink.add(p.index, result, exc):
            self._dirty_sinks.append(p.sink)

    def _flush_sinks(self) -> None:
        sinks, self._dirty_sinks = self._dirty_sinks, []
        for sink in sinks:
            sink.flush()

    def _write(self, request):
        return self.submit(request).result()

    def put(self, req: PutRequest):
        return self._write(req)

    def delete_range(self, req):
        return self._write(req)

    def txn(self, req: TxnRequest):
        if txn_writes_nothing(req):
            with self._lock:
                return self.store.txn_readonly(req, self.committed_rev)
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
            with self._lock:
                if self.store.lessor.exists(lease_id):
                    lease_id = 0
        return LeaseGrantRequest(ttl, lease_id)

    def lease_revoke(self, req):
        return self._write(req)

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew a lease (not journaled, as in etcd); returns its TTL."""
        return self._role.lease_keepalive(lease_id)

    def lease_keepalive_many(self, lease_ids, callback) -> None:
        """Renew several leases; ``callback([(id, outcome), ...])`` follows,
        in order, where outcome is the TTL (0 for a lease that does not
        exist, as etcd answers) or the EtcdError that should end the stream
        (request timed out, server stopped).  The callback may run on the
        caller's thread (on the leader, at once) or, where the renewal needs
        a round trip (a follower asks the leader), on another thread later:
        callers must not block on it."""
        self._role.lease_keepalive_many(lease_ids, callback)

    def renew_leases(self, lease_ids) -> list:
        """The leader's part of lease_keepalive_many (ErrNotLeader for
        each on a follower)."""
        return self._role.renew_leases(lease_ids)

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLiveResult:
        return self._role.lease_time_to_live(lease_id, keys)

    def lease_leases(self) -> LeaseLeasesResult:
        """Live lease IDs, soonest expiry first (etcd's order)."""
        return self._role.lease_leases()

    # ------------------------------------------------------------------
    # the committer thread

    def _post(self, item) -> None:
        """(any thread) Hand ``item`` (one of brain.engine.items) to the
        committer's next turn."""
        with self._cv:
            inbox = self._inboxes[type(item)]
            inbox.append(item)
            if len(inbox) == 1:
                self._cv.notify()

    def _take_posted(self, kind: type) -> list:
        """(committer) The items of ``kind`` posted since the turn began."""
        with self._cv:
            items, self._inboxes[kind] = self._inboxes[kind], []
        return items

    def _run(self) -> None:
        # its OS name too: per-thread CPU readings (the node-capacity benchmark's) find it by that
        name_os_thread()
        # the inboxes handled before the turn's writes, in this order
        # (controls after them: see brain.engine.items)
        replication = self._replication
        handlers = ((Delivered, replication.apply_records), (ForwardOutcome, replication.complete_forwarded),
                    (Confirmation, replication.settle_confirmed))
        while True:
            with self._cv:
                if not self._queue and not any(self._inboxes.values()) and not self._stopping:
                    # background work (compaction, folding recent writes into
                    # the packed index) goes on step by step while no write
                    # waits, not one step per 0.2 s
                    busy = self.store.compacting and not self._compaction_pins or self.store.merging
                    idle_wait = 0.0 if busy else 0.2
                    if idle_wait:
                        self._cv.wait(idle_wait)
                batch = list(self._queue)
                self._queue.clear()
                posted, self._inboxes = self._inboxes, _empty_inboxes()
                stopping = self._stopping
            for kind, handle in handlers:
                if posted[kind]:
                    handle(posted[kind])
            if batch:
                try:
                    self._role.writes(batch)
                except BaseException as e:  # never leave callers hanging
                    log.exception("commit failed")
                    self._fail(errors.ErrStopped, f"unexpected error in commit: {e!r}")
                    for p in batch:
                        self._settle(p, None, errors.ErrStopped)
            self._maintain()
            self._flush_sinks()
            for control in posted[Control]:
                control.fn()
            if stopping and not batch:
                with self._cv:
                    if not self._queue and not self._inboxes[Control]:
                        return

    def _over_quota(self) -> bool:
        quota = self.config.quota_backend_bytes
        return quota >= 0 and self._checkpointer.bytes_in_use > quota

    def _commit(self, batch: list[_Pending]) -> None:
        if self._failed is not None:
            for p in batch:
                self._settle(p, None, self._failed)
            return
        admitted = []
        over = self._over_quota()
        capped = over or self.alarms.has(ALARM_NOSPACE)
        corrupt = self.alarms.has(ALARM_CORRUPT)
        for p in batch:
            if corrupt:
                self._settle(p, None, errors.ErrCorrupt)
                continue
            if capped and _adds_data(p.request):
                if over:
                    over = False  # raise the alarm once per batch
                    self._raise_nospace(f"backend quota of {self.config.quota_backend_bytes} bytes exceeded "
                                        f"({self._checkpointer.bytes_in_use} in use)")
                self._settle(p, None, errors.ErrNoSpace)
                continue
            admitted.append(p)
        barriers = [p for p in admitted if type(p.request) is JournalBarrier]
        if barriers:
            admitted = [p for p in admitted if type(p.request) is not JournalBarrier]
        if not admitted and not barriers:
            return
        with self._lock:
            results, payload = self._apply(admitted) if admitted else ([], b"")
            new_rev = self.store.revision
            events = self.store.take_changes()
        index = self._applied_index
        # A barrier needs a record even when nothing else is appended: an
        # empty one, which every replica applies as nothing (brain.mvcc.codec).
        appends = bool(payload) or (bool(barriers) and self._barrier is not None)
        if appends:
            # the append is fenced on this replica's last record: once it
            # lands, every decision of the batch was made on the whole journal
            index = self._make_durable(payload, admitted + barriers)
            if index is None:
                return
        self._publish(new_rev, index, events)
        for p in barriers:
            self._settle(p, index)
        if not admitted:
            return
        self._requests += len(admitted)
        self._role.keeper.on_commit([p.request for p in admitted], results)  # the leader's commit
        if not appends and self._barrier is not None:
            # Decided from this replica's store with nothing to append (a
            # failed compare, a delete of nothing, a refused request): no
            # fence vouches that no other replica leads and wrote meanwhile.
            self._replication.confirm_unwritten(admitted, results)
        else:
            self._settle_results(admitted, results)

    def _publish(self, revision: int, index: int, events: list) -> None:
        """Make a batch that is in the journal visible: readers see
        ``revision`` and the journal ``index`` holding it, watchers get its
        ``events``, reads waiting for ``index`` go ahead.  The leader's commit
        and the follower's apply both end here."""
        with self._lock:
            # together, so that a reader of both sees a matching pair
            self.committed_rev = revision
            self._applied_index = index
        if events:
            self.watches.notify(events, revision)
        self._batches += 1
        if self._barrier is not None:
            self._barrier.applied(index)

    def _settle_results(self, admitted: list[_Pending], results: list) -> None:
        for p, res in zip(admitted, results):
            if isinstance(res, Exception):  # an EtcdError, or a refused Effects payload's ValueError
                self._settle(p, None, res)
            elif p.wait_compact:
                self._await_compaction(p, res)
            else:
                self._settle(p, res)

    def _await_compaction(self, p: _Pending, result) -> None:
        """Answer ``result`` once physical compaction reached p.wait_compact."""
        p.result = result
        self._compact_waiters.append((p.wait_compact, p))

    def _release_compaction_waiters(self) -> None:
        for _, p in self._compact_waiters:
            self._settle(p, p.result)
        self._compact_waiters = []

    def _apply(self, admitted: list[_Pending]) -> tuple[list, bytes]:
        """Apply a batch to the store (lock held): requests are decided,
        effects payloads are replayed as they are.  Returns one result per
        pending write and the journal payload of them all."""
        if not any(type(p.request) is Effects for p in admitted):
            return self.store.apply([p.request for p in admitted])
        results: list = []
        parts: list[bytes] = []
        run: list = []

        def flush_run() -> None:
            if run:
                res, payload = self.store.apply(run)
                results.extend(res)
                parts.append(payload)
                run.clear()

        for p in admitted:
            if type(p.request) is not Effects:
                run.append(p.request)
                continue
            flush_run()
            payload = p.request.payload
            try:
                self.store.check_continues(payload)
            except ValueError as e:
                results.append(e)
                continue
            self.store.replay(payload, live=True)
            results.append(self.store.revision)
            parts.append(payload)
        flush_run()
        return results, b"".join(parts)

    def _make_durable(self, payload: bytes, admitted: list[_Pending]) -> int | None:
        """Append and sync one batch's record; its journal index.  None: it
        is not durable and every caller of the batch has been answered."""
        try:
            self.journal.append(payload)
            synced = time.perf_counter()
            self._sync_journal(admitted)
            synced = time.perf_counter() - synced
        except JournalFencedError as e:
            log.warning("another replica wrote to the journal (%s); stepping down", e)
            for p in admitted:
                self._settle(p, None, errors.ErrLeaderChanged)
            self._replication.step_down_now(rebuild=True)
            return None
        except JournalUnavailableError as e:
            if not self._replication.abandoning_writes or self._closing:
                raise
            # lost the election while the journal could not say whether the
            # batch landed: its callers cannot know either
            log.warning("giving up an append whose outcome is unknown (%s); stepping down", e)
            for p in admitted:
                self._settle(p, None, errors.ErrTimeoutDueToLeaderFail)
            self._replication.step_down_now(rebuild=True)
            return None
        except BaseException as e:
            # A write the journal refused for space (JournalWriteError: the
            # journal is intact) is NOSPACE; a failed fdatasync is not, even
            # for ENOSPC (freeing space cannot make lost pages durable).
            nospace = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            err = errors.ErrNoSpace if nospace else errors.ErrStopped
            log.error("journal write failed (%r); refusing writes until restart", e)
            self._fail(err, f"journal write failed: {e!r}")
            for p in admitted:
                self._settle(p, None, err)
            if nospace:
                self._raise_nospace(f"the journal found no space ({e})")
            return None
        self._checkpointer.journaled(len(payload))
        for hook in self.journal_sync_hooks:
            hook(synced)
        return self.journal.last_index

    def _sync_journal(self, admitted: list[_Pending]) -> None:
        """sync(), waiting out a shared journal that cannot be reached: its
        appends are retried (de-duplicated) until it says whether they
        landed.  Callers waiting longer than the request timeout are told
        ErrTimeout meanwhile (they cannot know the outcome either)."""
        started = time.monotonic()
        while True:
            try:
                self.journal.sync()
                return
            except JournalUnavailableError as e:
                if self._stopping or self._closing or self._replication.abandoning_writes:
                    raise
                if time.monotonic() - started > REQUEST_TIMEOUT:
                    for p in admitted:
                        self._settle(p, None, errors.ErrTimeout)
                    self._flush_sinks()
                log.warning("journal unavailable (%s); retrying the append", e)
                time.sleep(0.2)

    def _fail(self, err: errors.EtcdError, reason: str) -> None:
        self._failed = err
        self._failed_reason = reason

    def _maintain(self) -> None:
        """Between batches: a bounded compaction step, a bounded merge of
        recent writes into the packed index, checkpoint work."""
        if self.store.compacting and not self._compaction_pins:
            with self._lock:
                self.store.compaction_step(self.config.compaction_step_keys)
        if self.store.merging:
            with self._lock:
                self.store.merge_step(self.config.compaction_step_keys)
                if not self.store.merging:  # caught up: the overlay's objects are gone
                    release_free_memory()
        if self._compact_waiters:
            done_rev = self.store.compact_done_rev
            still = []
            for rev, p in self._compact_waiters:
                if done_rev >= rev:
                    self._settle(p, p.result)
                else:
                    still.append((rev, p))
            self._compact_waiters = still
        if self._replication.maintain():
            return  # no checkpoint of a store about to be replaced
        self._checkpointer.maintain(self.store, self._applied_index, may_start=self._failed is None)

    # ------------------------------------------------------------------
    # alarms, compaction pins, work on the committer thread (maintenance)

    def _raise_nospace(self, why: str) -> None:
        """Raise the NOSPACE alarm (puts, lease grants and Txns that may put
        are refused until it is disarmed, as in etcd): stored with the data
        where there is room for it, else held in memory until a restart."""
        log.warning("%s; raising the NOSPACE alarm", why)
        try:
            self.alarm_activate(self.member_id, ALARM_NOSPACE)
        except backend_mod.BackendError as e:
            self.alarms.activate(self.member_id, ALARM_NOSPACE)
            log.warning("the NOSPACE alarm could not be stored (%s); it holds until a restart", e)

    def _store_alarms(self, encoded: bytes) -> None:
        self.backend.write(backend_mod.WriteBatch(meta={META_ALARMS: encoded}))

    def alarm_activate(self, member_id: int, alarm: int) -> bool:
        """Raise an alarm (stored with the data); False if already raised."""
        return self.alarms.activate(member_id, alarm, self._store_alarms)

    def alarm_deactivate(self, member_id: int, alarm: int) -> bool:
        """Clear an alarm; False if it was not raised."""
        return self.alarms.deactivate(member_id, alarm, self._store_alarms)

    def history(self) -> History:
        """The committed history, for readers that walk it while writes go
        on (hashes, snapshots, export, the mirror): brain/engine/history.py."""
        return History(self._lock, self.store, self)

    def pin_compaction(self) -> None:
        """Hold physical compaction (logical compaction still happens)
        until unpin_compaction; history above the compaction revision read
        now stays readable meanwhile.  Call with the engine lock held."""
        self._compaction_pins += 1

    def unpin_compaction(self) -> None:
        with self._lock:
            self._compaction_pins -= 1

    def on_committer(self, fn):
        """Run fn() on the committer thread between batches, when the store
        holds exactly the committed state, and return its result."""
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        with self._cv:
            if self._stopping:
                raise errors.ErrStopped.fresh()
        self._control(run)
        return fut.result()

    def checkpoint(self) -> None:
        """Run a full checkpoint now (used by tests and shutdown)."""
        self.on_committer(lambda: self._checkpointer.now(self.store, self._applied_index,
                                                         may_start=self._failed is None))

    def checkpoint_index(self) -> int:
        """The last journal index the value store's checkpoint holds (0:
        none yet); a replica's records up to it may be purged."""
        meta = CheckpointMeta.read(self.backend)
        return 0 if meta is None else meta.journal_index

    def _control(self, fn) -> None:
        """Run fn on the committer thread (the journal's only writer)."""
        self._post(Control(fn))

    # ------------------------------------------------------------------
    # shutdown and introspection

    def close(self) -> None:
        with self._cv:
            if self._stopping:
                return
        # a batch waiting for an unreachable shared journal gives up now
        self._closing = True
        self._role.stop(wait=True)
        try:
            self.checkpoint()
        except Exception:
            log.exception("final checkpoint failed; the journal still holds every write")
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._committer.join()
        self._replication.close()
        self.watches.close()
        self._checkpointer.join()
        self.journal.close()
        self.backend.close()
        os.close(self._lock_fd)

    def statistics(self) -> EngineStatistics:
        with self._lock:
            s, cp = self.store, self._checkpointer
            return EngineStatistics(
                revision=s.revision, committed_revision=self.committed_rev, compact_revision=s.compact_rev,
                keys_total=s.keys_total(), keys_live=s.keys_live, memtable_records=s.memtable_entries(),
                batches=self._batches, requests=self._requests, checkpoints=cp.checkpoints,
                last_checkpoint_seconds=cp.last_seconds, journal_bytes_since_checkpoint=cp.journal_bytes,
                backend_size_bytes=cp.backend_size, backend_in_use_bytes=cp.backend_in_use,
                leases=len(s.lessor), failed=self._failed_reason,
                leases_expired=self._role.leases_expired(), role=self._role.name,
                applied_index=self._applied_index, leader_id=self.leader_id, epoch=s.epoch)


class _ReplicaCore:
    """The engine's committer core as Replication sees it
    (brain.engine.replication.ReplicaCore, where the contract is written):
    the one door through which replication reaches the engine's state."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def store(self) -> Store:
        return self._engine.store

    @property
    def committed_rev(self) -> int:
        return self._engine.committed_rev

    @property
    def applied_index(self) -> int:
        return self._engine._applied_index

    @property
    def member_id(self) -> int:
        return self._engine.member_id

    @property
    def is_leader(self) -> bool:
        return self._engine.is_leader

    @property
    def failed(self) -> errors.EtcdError | None:
        return self._engine._failed

    @property
    def forwarder(self) -> Forwarder | None:
        return self._engine.forwarder

    @property
    def read_lease(self):
        return self._engine.read_lease

    @property
    def raft_term(self) -> int:
        return self._engine.raft_term

    @raft_term.setter
    def raft_term(self, term: int) -> None:
        self._engine.raft_term = term

    def post(self, item) -> None:
        self._engine._post(item)

    def take_posted(self, kind: type) -> list:
        return self._engine._take_posted(kind)

    def has_posted(self, kind: type) -> bool:
        eng = self._engine
        with eng._cv:
            return bool(eng._inboxes[kind])

    def wake(self) -> None:
        eng = self._engine
        with eng._cv:
            eng._cv.notify()

    def requeue(self, pending: list) -> None:
        eng = self._engine
        with eng._cv:
            eng._queue.extend(pending)

    def settle(self, p: _Pending, result, exc=None) -> None:
        self._engine._settle(p, result, exc)

    def settle_results(self, admitted: list, results: list) -> None:
        self._engine._settle_results(admitted, results)

    def await_compaction(self, p: _Pending, result) -> None:
        self._engine._await_compaction(p, result)

    def release_compaction_waiters(self) -> None:
        self._engine._release_compaction_waiters()

    def flush_sinks(self) -> None:
        self._engine._flush_sinks()

    def publish(self, revision: int, index: int, events: list) -> None:
        self._engine._publish(revision, index, events)

    def apply_epoch(self, payload: bytes, index: int) -> None:
        eng = self._engine
        with eng._lock:
            eng.store.replay(payload, live=True)
            eng._applied_index = index

    def fail(self, err: errors.EtcdError, reason: str) -> None:
        self._engine._fail(err, reason)

    def load_store(self, upto_index: int) -> tuple[Store, int, int]:
        return self._engine._load_store(upto_index=upto_index)

    def replace_store(self, store: Store) -> None:
        eng = self._engine
        with eng.watches.lock:
            with eng._lock:
                eng.store = store
            eng.watches.hub.store = store

    def lead(self) -> None:
        self._engine._lead()

    def follow_leader(self) -> None:
        self._engine._follow_leader()

    def role_changed(self) -> None:
        self._engine._run_role_hooks()


def _empty_inboxes() -> dict[type, list]:
    return {kind: [] for kind in (Delivered, ForwardOutcome, Confirmation, Control)}


def _adds_data(req) -> bool:
    """What the NOSPACE alarm and an exceeded quota refuse, as etcd 3.6 does
    (its capped applier and quota refuse a request whose cost is above 0): a
    Put, a LeaseGrant, and a Txn with a Put directly in either branch.
    etcd's costTxn counts only those Puts, so a Txn that only deletes, or
    puts only inside a nested Txn, is applied."""
    if isinstance(req, (PutRequest, LeaseGrantRequest)):
        return True
    if isinstance(req, TxnRequest):
        return any(isinstance(op, PutRequest) for op in (*req.success, *req.failure))
    return False
