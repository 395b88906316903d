"""The committer: the one thread that changes the store, and the order in
which decisions become durable and visible.

Callers queue writes (``enqueue``: ``Pending`` entries, brain.engine.pending)
and other threads post typed items (``post``: brain.engine.items), one
inbox per kind.  Each *turn* the committer takes everything that queued up
and handles, in this order: records delivered to a follower, forwarded
writes' answers, confirmations of answers decided without a record, the
writes, maintenance (a compaction step, a merge step, checkpoint work),
and controls last (they see the store as the turn's writes left it).

A leader's writes (``commit``) go through four steps:

1. *admit*: refuse what the state forbids (brain.engine.admission: a
   failed engine, the CORRUPT alarm, NOSPACE or an exceeded quota for
   requests that add data, --max-leases);
2. *decide*: apply them to the store as one batch under the lock; the store
   returns one journal payload of their effects (brain.mvcc.codec);
3. *make durable*: append the payload as one record, fenced on the record
   before it on a shared journal, and sync;
4. *publish and settle*: move ``committed_rev`` and ``applied_index``
   together, tell watchers and waiting reads, answer the callers.

While a record syncs, the next writes queue: one sync serves every write
of a turn (group commit).  A follower's turn applies delivered records and
publishes them the same way (brain.engine.replication).

Reads are served at ``committed_rev``: the store may hold a batch whose
record is not durable yet, which every key's full history hides from a
read at the committed revision.  A journal failure after a batch was
applied cannot be rolled back, so the committer then refuses writes
(``failed``) until restarted; reads go on at the committed revision.  One
exception: a local journal that refused a record for space is still
whole, and the store is rebuilt without the batch
(brain.engine.journal_space).

Lock order, written on the field below: a watch stream's lock (the
WatchManager's) before ``lock``; ``lock`` is never held while waiting on
the disk or the network; ``_cv`` (the queue's) is never taken while
holding ``lock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

from ..mvcc import errors
from ..mvcc.store import Store
from ..thread_names import name_os_thread
from .admission import Admission
from .alarms import AlarmSet
from .checkpointing import Checkpointer
from .config import EngineConfig
from .items import (
    Confirmation,
    Control,
    Delivered,
    Durable,
    ForwardOutcome,
    JournalBarrier,
    SyncFailed,
    SyncOverdue,
)
from .decide import decide
from .inline_durability import make_durable
from .journal_space import JournalSpace
from .limits import Limits
from .memory import release_free_memory
from .packing import QuietPacker
from .pending import BatchSink, Pending
from .pipeline import InFlight, Pipeline
from .readindex import ReadBarrier
from .replication import Replication
from .roles import Follower, Leader
from .tokens import TokenTable
from .watching import WatchManager

log = logging.getLogger("brain.engine")

# Read-index round trips a replica keeps in flight at once (each serves the
# linearizable reads that began before it was sent).
READ_INDEX_IN_FLIGHT = 4


class Committer:
    """Owns the store while it changes: the write queue and the inboxes,
    the role deciding where writes go (Leader, Follower), a replica's
    Replication, the checkpointer and the watch manager it drives, and the
    committed view readers see (``store``, ``committed_rev``,
    ``applied_index`` under ``lock``).

    ``make_leader()`` builds the leader's role (lease clocks,
    auto-compaction); a leader's writes are decided here (``commit``), a
    follower's forwarded (Replication.forward); ``cluster`` (brain.engine.hooks.
    ClusterHooks) is None on a single node, which leads its local journal
    from the start and never follows."""

    def __init__(self, config: EngineConfig, *, store: Store, applied_index: int, journal, backend,
                 member_id: int, term: int, alarms: AlarmSet, raise_nospace: Callable[[str], None],
                 make_leader: Callable[[], Leader], cluster, replayed_bytes: int,
                 load_store: Callable[[int], tuple[Store, int, int]]) -> None:
        self.config = config
        # Guards store, committed_rev and applied_index (readers take it to
        # read a matching pair).  Order: a WatchManager's lock, then this one;
        # never held while waiting on the disk or the network; _cv is never
        # taken while holding it.
        self.lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())  # guards _queue, _inboxes, _stopping
        self._queue: deque[Pending] = deque()
        self._inboxes: dict[type, list] = _empty_inboxes()
        self._stopping = False
        self.limits = Limits(config.max_leases)  # too many requests, --max-leases
        self.closing = False  # set by the engine before it stops the committer
        self.store = store
        self.committed_rev = store.revision
        # The auth state readers check calls against: the store's as of the
        # last published batch (brain.mvcc.auth: immutable, read without the lock).
        self.committed_auth = store.auth
        # Simple tokens, learned from published batches (brain.engine.tokens).
        self.tokens = TokenTable(config.auth_token_ttl)
        self.applied_index = applied_index
        self.member_id = member_id
        self.term = term
        self.journal = journal
        self.raise_nospace = raise_nospace
        self._make_leader = make_leader
        self.cluster = cluster
        self._failed: errors.EtcdError | None = None
        self.failed_reason: str | None = None
        self._compact_waiters: list[tuple[int, Pending]] = []
        self._dirty_sinks: list[BatchSink] = []  # settled outcomes not yet delivered
        self.batches = 0
        self.requests = 0
        # While > 0, physical compaction waits (a snapshot or hash is reading
        # history below a newer compaction revision).
        self.compaction_pins = 0
        self.packer = QuietPacker()  # the index packed whole once writes stop
        # How long the last turn's background steps (compaction, merge,
        # packing) held the lock: an idle committer rests that long before
        # the next, so readers get about half of a quiet store's lock.
        self._background_held = 0.0
        # Duration observers (seconds) for metrics: every journal sync of a
        # batch, every checkpoint write; called on engine threads.
        self.journal_sync_hooks: list = []
        self.checkpoint_hooks: list = []
        # Called (on the committer) after the role or the leader changed.
        self.role_hooks: list = []
        self.leader_changes = 1  # terms seen (etcd_server_leader_changes_seen_total)
        self.checkpointer = Checkpointer(backend, journal, self.lock, config, self.checkpoint_hooks,
                                         journal_bytes=replayed_bytes,
                                         on_full=lambda e: raise_nospace(f"a checkpoint found no space ({e})"))
        # a single node's local journal: what a full disk under it does
        self.admission = Admission(config.quota_backend_bytes, self.checkpointer, alarms, self.limits, self.settle,
                                   raise_nospace)
        self.space = (JournalSpace(self, journal, self.checkpointer, load_store, alarms, raise_nospace)
                      if cluster is None else None)
        self.watches = WatchManager(store, self.lock, progress_interval=config.watch_progress_notify_interval,
                                    max_queued_events=config.watch_queue_events,
                                    max_watchers_per_stream=config.max_watchers_per_stream)
        self.barrier: ReadBarrier | None = None
        if cluster is not None:
            self.barrier = ReadBarrier(self.journal_barrier, lambda: self.applied_index,
                                       ahead=lambda index: self.replication.journal_ahead(index),
                                       max_in_flight=READ_INDEX_IN_FLIGHT)
        self.replication = Replication(self, self.lock, journal, self.barrier, self.checkpointer, load_store)
        # a leader's batches in flight on a shared journal that takes appends
        # while it acknowledges earlier ones (brain.engine.pipeline)
        self.pipeline = Pipeline(self, journal) if cluster is not None and getattr(journal, "pipelined", False) \
            else None
        # a replica starts following; a single node leads from ``start``
        self.role: Leader | Follower = self._new_follower()
        self._thread = threading.Thread(target=self._run, name="brain-committer", daemon=True)

    # ------------------------------------------------------------------
    # life

    def start(self) -> None:
        if self.cluster is None:
            self.lead()
        else:
            self.replication.follow()
        if self.pipeline is not None:
            self.pipeline.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop taking writes, finish what is queued, end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        if self.pipeline is not None:
            self.pipeline.stop()
        self.replication.close()

    def giving_up(self) -> bool:
        """(any thread) An append whose outcome the journal cannot tell now
        is given up instead of waited for: the engine closes, or the
        election was lost (the next leader decides)."""
        return self.closing or self.stopping or self.replication.abandoning_writes

    @property
    def stopping(self) -> bool:
        with self._cv:
            return self._stopping

    # ------------------------------------------------------------------
    # roles

    @property
    def is_leader(self) -> bool:
        return isinstance(self.role, Leader)

    @property
    def failed(self) -> errors.EtcdError | None:
        return self._failed

    @property
    def forwarder(self):
        return self.cluster.forwarder() if self.cluster is not None else None

    @property
    def read_lease(self) -> Callable[[], bool] | None:
        return self.cluster.read_lease if self.cluster is not None else None

    def lead(self) -> None:
        """Take the leader's role (a replica's promotion)."""
        if self.pipeline is not None:
            self.pipeline.new_session()
        self.role = self._make_leader()

    def follow_leader(self) -> None:
        """Give up the leader's role (on the committer thread: the
        compactor, which may be waiting for a write, is not joined)."""
        if self.pipeline is not None:
            self.pipeline.new_session()
        self.role.stop(wait=False)
        self.role = self._new_follower()

    def _new_follower(self) -> Follower:
        return Follower(lambda: self.forwarder)

    def role_changed(self) -> None:
        self.leader_changes += 1
        for hook in self.role_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001
                log.exception("role hook failed")
        if self.cluster is not None:
            try:
                self.cluster.role_changed()
            except Exception:  # noqa: BLE001
                log.exception("the cluster's role hook failed")

    # ------------------------------------------------------------------
    # the queue and the inboxes

    def enqueue(self, pending: list[Pending], *, refusable: bool = False) -> None:
        """Queue writes for the next turn.  ``refusable``: clients' writes,
        which brain.engine.limits may refuse (ErrTooManyRequests)."""
        with self._cv:
            if self._stopping:
                pending, refused, error = [], pending, errors.ErrStopped
            else:
                pending, refused = self.limits.admit_writes(len(self._queue), pending) if refusable else (pending, [])
                error = errors.ErrTooManyRequests
            was_empty = not self._queue
            self._queue.extend(pending)
            if was_empty and pending:
                self._cv.notify()
        for p in refused:  # settled here, on the caller's thread
            p.settled = True
            p.sink.add(p.slot, None, error)

    @property
    def pending_writes(self) -> int:  # queued for the next turn (read without the queue's lock)
        return len(self._queue)

    def requeue(self, pending: list[Pending]) -> None:
        """Queue writes again, to be decided in the next turn."""
        with self._cv:
            self._queue.extend(pending)

    def post(self, item) -> None:
        """(any thread) Hand ``item`` (one of brain.engine.items) to the
        next turn."""
        with self._cv:
            inbox = self._inboxes[type(item)]
            inbox.append(item)
            if len(inbox) == 1:
                self._cv.notify()

    def take_posted(self, kind: type) -> list:
        """The items of ``kind`` posted since the turn began."""
        with self._cv:
            items, self._inboxes[kind] = self._inboxes[kind], []
        return items

    def has_posted(self, kind: type) -> bool:
        with self._cv:
            return bool(self._inboxes[kind])

    def wake(self) -> None:
        """(any thread) Wake the committer (a sync loop rechecks why it waits)."""
        with self._cv:
            self._cv.notify()

    def on_committer(self, fn):
        """Run fn() on the committer thread between batches, when the store
        holds exactly the committed state, and return its result."""
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        if self.stopping:
            raise errors.ErrStopped.fresh()
        self.post(Control(run))
        return fut.result()

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

        sink = BatchSink(settled)
        self.enqueue([Pending(JournalBarrier(), sink, 0, local=True)])
        sink.flush()  # settled already (stopping)

    # ------------------------------------------------------------------
    # settling

    def settle(self, p: Pending, result, exc=None) -> None:
        if p.settled:
            return
        p.settled = True
        if p.sink.add(p.slot, result, exc):
            self._dirty_sinks.append(p.sink)

    def flush_sinks(self) -> None:
        sinks, self._dirty_sinks = self._dirty_sinks, []
        for sink in sinks:
            sink.flush()

    def settle_decided(self, admitted: list[Pending], results: list) -> None:
        """Answer outcomes decided without a record, behind the batches a
        pipelined journal has in flight (they may have seen their effects)."""
        if self.pipeline is not None and self.pipeline.busy:
            self.pipeline.after_appended(InFlight(0, 0, [], admitted, results))
        else:
            self.settle_results(admitted, results)

    def settle_results(self, admitted: list[Pending], results: list) -> None:
        for p, res in zip(admitted, results):
            if isinstance(res, Exception):  # an EtcdError, or a refused Effects payload's ValueError
                self.settle(p, None, res)
            elif p.wait_compact:
                self.await_compaction(p, res)
            else:
                self.settle(p, res)

    def await_compaction(self, p: Pending, result) -> None:
        """Answer ``result`` once physical compaction reached p.wait_compact."""
        p.result = result
        self._compact_waiters.append((p.wait_compact, p))

    def release_compaction_waiters(self) -> None:
        for _, p in self._compact_waiters:
            self.settle(p, p.result)
        self._compact_waiters = []

    def fail(self, err: errors.EtcdError, reason: str) -> None:
        """Refuse writes with ``err`` until restart; the first failure tells
        the cluster (a replica that cannot decide writes must not win the
        election: it would take the key and fail to lead, again and again)."""
        first = self._failed is None
        self._failed = err
        self.failed_reason = reason
        hook = self.cluster.engine_failed if self.cluster is not None else None
        if first and hook is not None:
            try:
                hook(reason)
            except Exception:  # noqa: BLE001 - the refusal above stands either way
                log.exception("the cluster's failure hook failed")

    # ------------------------------------------------------------------
    # the turn

    def _run(self) -> None:
        # its OS name too: per-thread CPU readings (the node-capacity benchmark's) find it by that
        name_os_thread()
        replication = self.replication
        handlers = ((Delivered, replication.apply_records), (ForwardOutcome, replication.complete_forwarded),
                    (Confirmation, replication.settle_confirmed))
        while True:
            with self._cv:
                if not self._queue and not any(self._inboxes.values()) and not self._stopping:
                    # background work (compaction, folding recent writes into
                    # the packed index) goes on step by step while no write
                    # waits, not one step per 0.2 s
                    busy = (self.store.compacting and not self.compaction_pins or self.store.merging
                            or self.packer.due(self.store))
                    if not busy:
                        self._cv.wait(0.2)
                    elif self._background_held > 0:
                        # a reader gets the lock between two steps: the
                        # thread that lets it go takes it straight back
                        # unless it waits (a write still wakes it at once)
                        self._cv.wait(min(self._background_held, 0.2))
                batch = list(self._queue)
                self._queue.clear()
                posted, self._inboxes = self._inboxes, _empty_inboxes()
                stopping = self._stopping
            if self.pipeline is not None:
                self._durability(posted)
            for kind, handle in handlers:
                if posted[kind]:
                    handle(posted[kind])
            if batch and self.pipeline is not None and self.pipeline.full and self.is_leader:
                self._await_durability(lambda: not self.pipeline.full)
            if batch:
                try:
                    if self.is_leader:
                        self.commit(batch)  # decided here
                    else:
                        self.replication.forward(batch)  # sent to the leader
                except BaseException as e:  # never leave callers hanging
                    log.exception("commit failed")
                    self.fail(errors.ErrStopped, f"unexpected error in commit: {e!r}")
                    for p in batch:
                        self.settle(p, None, errors.ErrStopped)
            self._maintain()
            self.flush_sinks()
            if posted[Control] and self.pipeline is not None and self.pipeline.busy:
                self._await_durability(lambda: not self.pipeline.busy)  # controls see the committed state
            for control in posted[Control]:
                control.fn()
            if stopping and not batch:
                with self._cv:
                    if not self._queue and not self._inboxes[Control]:
                        return

    def _maintain(self) -> None:
        """Between batches: a bounded compaction step, a bounded merge of
        recent writes into the packed index, checkpoint work."""
        store, step = self.store, self.config.compaction_step_keys
        started = time.perf_counter()
        if store.compacting and not self.compaction_pins:
            with self.lock:
                store.compaction_step(step)
        if store.merging:
            with self.lock:
                store.merge_step(step)
                if not store.merging:  # caught up: the overlay's objects are gone
                    release_free_memory()
        elif self.packer.due(store):
            self.packer.step(store, self.lock, step)
        self._background_held = time.perf_counter() - started
        if self._compact_waiters:
            done_rev = store.compact_done_rev
            still = []
            for rev, p in self._compact_waiters:
                if done_rev >= rev:
                    self.settle(p, p.result)
                else:
                    still.append((rev, p))
            self._compact_waiters = still
        if self.space is not None:
            self.space.maintain()
        if self.replication.maintain():
            return  # no checkpoint of a store about to be replaced
        may_start = self._failed is None
        if may_start and self.pipeline is not None and self.pipeline.busy:
            # a checkpoint cuts the store at the committed state: drain first,
            # when one is due (a pipeline under load is never empty by itself)
            if self.checkpointer.due(self.store):
                self._await_durability(lambda: not self.pipeline.busy)
            may_start = not self.pipeline.busy
        self.checkpointer.maintain(self.store, self.applied_index, may_start=may_start)

    def _durability(self, posted: dict) -> None:
        """What the syncing thread learned: acknowledged batches published
        and answered in order, overdue callers told, failures handled."""
        pipeline = self.pipeline
        if posted[Durable]:
            pipeline.durable(posted[Durable])
        if posted[SyncOverdue]:
            pipeline.overdue(posted[SyncOverdue])
        for item in posted[SyncFailed]:
            pipeline.failed(item)

    def _await_durability(self, done: Callable[[], bool]) -> None:
        """Wait on the committer for the syncing thread's news until
        ``done()``: the pipeline has room, or is drained."""
        kinds = (Durable, SyncOverdue, SyncFailed)
        while not done():
            with self._cv:
                while not any(self._inboxes[k] for k in kinds):
                    self._cv.wait(0.2)
                posted = {k: self._inboxes[k] for k in kinds}
                for k in kinds:
                    self._inboxes[k] = []
            self._durability(posted)
            self.flush_sinks()

    # ------------------------------------------------------------------
    # a leader's commit: admit, decide, make durable, publish and settle

    def commit(self, batch: list[Pending]) -> None:
        admitted, barriers = self._admit(batch)
        if not admitted and not barriers:
            return
        with self.lock:
            results, payload = decide(self.store, admitted) if admitted else ([], b"")
            new_rev = self.store.revision
            events = self.store.take_changes()
            auth = self.store.take_auth()
        index = self.applied_index
        # A barrier needs a record even when nothing else is appended: an
        # empty one, which every replica applies as nothing (brain.mvcc.codec).
        appends = bool(payload) or (bool(barriers) and self.barrier is not None)
        if appends and self.pipeline is not None:
            # published and answered once acknowledged (brain.engine.pipeline)
            self.pipeline.append(InFlight(0, new_rev, events, admitted, results, barriers, len(payload), auth=auth),
                                 payload)
            return
        if appends:
            # the append is fenced on this replica's last record: once it
            # lands, every decision of the batch was made on the whole journal
            index = make_durable(self, payload, admitted + barriers)
            if index is None:
                return
        if self.pipeline is None:  # (a pipelined store may hold batches still in flight: nothing to publish)
            self.publish(new_rev, index, events, auth)
        for p in barriers:
            self.settle(p, index)
        if not admitted:
            return
        self.requests += len(admitted)
        self.role.keeper.on_commit([p.request for p in admitted], results)  # the leader's lease clocks
        if not appends and self.barrier is not None:
            # Decided from this replica's store with nothing to append (a
            # failed compare, a delete of nothing, a refused request): no
            # fence vouches that no other replica leads and wrote meanwhile.
            self.replication.confirm_unwritten(admitted, results)
        else:
            self.settle_results(admitted, results)

    def _admit(self, batch: list[Pending]) -> tuple[list[Pending], list[Pending]]:
        refused = self._failed
        if refused is None and self.space is not None and self.space.refusing:
            refused = errors.ErrNoSpace
        return self.admission.split(batch, refused, len(self.store.lessor))

    def publish(self, revision: int, index: int, events: list, auth=None) -> None:
        """Make a batch that is in the journal visible: readers see
        ``revision`` and the journal ``index`` holding it, watchers get its
        ``events``, reads waiting for ``index`` go ahead, and ``auth`` (the
        store's take_auth: its auth state and token effects) is what calls
        are checked against.  The leader's commit and the follower's apply
        both end here."""
        with self.lock:
            # together, so that a reader of both sees a matching pair
            self.committed_rev = revision
            self.applied_index = index
            if auth is not None:
                self.committed_auth = auth[0]
        if auth is not None and auth[1]:
            self.tokens.apply(auth[1])
        if events:
            self.watches.publish_committed(events, revision)
        self.batches += 1
        if self.barrier is not None:
            self.barrier.applied(index)

    def apply_epoch(self, payload: bytes, index: int) -> None:
        """Apply a new leader's epoch record (which holds no revision), at
        journal ``index``."""
        with self.lock:
            self.store.replay(payload, live=True)
            self.applied_index = index

    def replace_store(self, store: Store) -> None:
        """Serve from ``store`` from now on (reads and watches included)."""
        with self.watches.lock:
            with self.lock:
                self.store = store
                self.committed_auth = store.auth
            self.watches.hub.store = store


def _empty_inboxes() -> dict[type, list]:
    return {kind: [] for kind in (Durable, SyncOverdue, SyncFailed, Delivered, ForwardOutcome, Confirmation, Control)}
