"""The engine as a replica of a shared journal: following, forwarding,
taking and giving up the lead.

A brain cluster is several engines on one shared journal (a NATS JetStream
stream).  Exactly one of them *leads*: its committer decides writes and
appends their effects, every append fenced on the record before it.  The
others *follow*: their committer applies each record the journal delivers
(the same replay as recovery), so every replica holds the same history at
the same revisions, and serves reads and watches from it.

A follower's clients still write through it.  Their writes go to the
leader (``Forwarder``, provided by brain.cluster); the leader's answer
comes back with its revisions, and the follower answers its client only
once it has applied those revisions itself, so a client reads its own
writes on the replica it wrote through (etcd's members behave the same).

Linearizable reads wait for the read index (brain.engine.readindex).

Taking the lead (``promote``, run on the committer when brain.cluster says
this replica won the election): stop following, apply the journal to its
end, then append an epoch record fenced on that end.  If another record
got there first, catch up and try again: the epoch record is the first
thing a new leader writes, so no record of a previous leader can follow it.

Giving up the lead (``step_down``): on a fenced append (someone else
leads: our batch is not in the journal, but it is in our memory) the store
is rebuilt from the last local checkpoint and the journal, up to the last
record this replica knows is in the journal; when the election was lost
without a failed append, the store is exact and following resumes.

Invariant: on a follower, everything in the store is in the journal
(``committed_rev == store.revision``); on the leader, at most the batch
being synced is not.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future

from ..journal import JournalError, JournalFencedError, JournalPurgedError
from ..mvcc import errors
from ..mvcc.codec import BatchEncoder
from .items import Confirmation, Delivered, Effects, ForwardOutcome
from .roles import APPLY_WAIT_SECONDS, LEADER, Forwarder

log = logging.getLogger("brain.engine.replication")

PROMOTE_ATTEMPTS = 20


class Replication:
    """The replica half of the Engine (mixed into it; see the module
    docstring).  Every method here runs on the committer thread unless it
    says otherwise."""

    def __init__(self) -> None:
        self.unwritten_confirmations = 0  # of them, those that asked the journal
        self._parked: list = []  # heap: (revision, seq, deadline, [(pending, result)])
        self._park_seq = itertools.count()
        self._applied_index = 0
        self.forwarder: Forwarder | None = None
        self.leader_hint = None  # () -> member ID the election names (brain.cluster sets it)
        # () -> True while this replica, leading, may read without asking the
        # journal (the election's lease: brain.cluster.election.Election.lease_valid)
        self.read_lease = None
        # Called (on the committer) after the role or the leader changed.
        self.role_hooks: list = []
        self.leader_changes = 1  # terms seen (etcd_server_leader_changes_seen_total)
        self._follow_error: BaseException | None = None
        self._following = False
        # set (from any thread) when this replica lost the election: a batch
        # waiting for an unreachable journal is given up
        self._abandon_writes = False
        self._rebuild_pending = False
        self._rebuild_retry_at = 0.0
        self._refollow_at = 0.0  # following failed: start again at this time
        self._behind: tuple[int, float] | None = None  # (an index the journal has, since when)

    # ------------------------------------------------------------------
    # who leads

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

    def use_read_index(self, ask) -> None:
        """Where linearizable reads get their read index from:
        ``ask(callback(index, exc))`` (default: the journal's)."""
        if self._barrier is not None:
            self._barrier.use_source(ask)

    @property
    def leader_id(self) -> int:
        """The member ID of the replica leading the journal (0: unknown);
        on a single node, this one.  The journal's last epoch record names
        it; until this replica has applied one (a replica started from a
        snapshot), the election's view (``leader_hint``) stands in."""
        if self._barrier is None:
            return self.member_id
        return self.store.leader_id or (self.leader_hint() if self.leader_hint is not None else 0)

    # ------------------------------------------------------------------
    # following

    def _follow(self) -> None:
        """Start receiving the journal's records after the applied index."""
        self._follow_error = None
        self._following = True
        self.journal.follow(self._applied_index, self._deliver, self._follow_failed)

    def _deliver(self, index: int, payload: bytes) -> None:
        """(journal thread) A record to apply."""
        self._post(Delivered(index, payload))

    def _follow_failed(self, exc: BaseException) -> None:
        """(journal thread) The journal cannot deliver any more records."""
        self._follow_error = exc
        if isinstance(exc, JournalPurgedError):
            log.error("following the journal failed: %s", exc)
            self._fail(errors.ErrStopped, f"journal records needed by this replica were purged: {exc}")
        else:
            log.warning("following the journal failed (%s); trying again in 1s", exc)
            self._refollow_at = time.monotonic() + 1.0

    def _check_following(self) -> None:
        """(committer, between batches) Start following again when it
        failed, or when the journal is known to hold records that have not
        arrived for a while (a consumer lost across a NATS outage)."""
        if self.is_leader or self._rebuild_pending or self._failed is not None:
            return
        now = time.monotonic()
        behind = self._behind
        if behind is not None:
            if self._applied_index >= behind[0]:
                self._behind = None
            elif now - behind[1] > 3.0 and not self._inboxes[Delivered]:
                log.warning("the journal holds index %d but this replica is at %d since %.1fs; "
                            "following again", behind[0], self._applied_index, now - behind[1])
                self._behind = None
                self._refollow_at = now
        if self._refollow_at and now >= self._refollow_at:
            self._refollow_at = 0.0
            self.journal.stop_following()
            self._follow()

    def _apply_records(self, records: list[Delivered]) -> None:
        """Apply delivered records (a follower's commit)."""
        if self.is_leader:
            # Left over from before a promotion: promote applied them already.
            return
        applied = self._applied_index
        nbytes = 0
        with self._lock:
            for record in records:
                index, payload = record.index, record.payload
                if index <= applied:
                    continue  # delivered twice across a restart of following
                try:
                    self.store.replay(payload, live=True)
                except ValueError as e:
                    self._fail(errors.ErrCorrupt, f"journal record {index} cannot be applied: {e}")
                    log.error("journal record %d cannot be applied (%s); this replica stops applying", index, e)
                    break
                applied = index
                nbytes += len(payload)
            events = self.store.take_changes()
        self._checkpointer.journal_bytes += nbytes
        self._publish(self.store.revision, applied, events)
        if self.store.epoch != self.raft_term:
            self.raft_term = self.store.epoch
            self._run_role_hooks()
        self._release_parked()

    def _journal_ahead(self, index: int) -> None:
        """(any thread) The journal reported an index beyond what this
        replica has.  A follower will receive it; a leader that never wrote
        it has been deposed without noticing: step down."""
        if self.is_leader and index > self.journal.last_index:
            log.warning("the journal is at index %d, past this leader's last append %d: stepping down",
                        index, self.journal.last_index)
            self._control(lambda: self.is_leader and self._step_down(rebuild=True))
        elif not self.is_leader and self._behind is None:
            self._behind = (index, time.monotonic())

    # ------------------------------------------------------------------
    # answers decided without a journal record

    def _confirm_unwritten(self, admitted: list, results: list) -> None:
        """(committer, leading) Settle a batch that appended nothing (failed
        compares, deletes of nothing, refused requests) once this replica is
        known to have decided it on the whole journal.

        A batch that appends is vouched for by the fence on its record.  One
        that does not was decided on this replica's store alone, and a
        replica deposed without noticing yet (its key taken over while it was
        paused) would answer from a store missing the new leader's writes:
        "compare failed" at a revision below one already acknowledged.  So:
        at once within the read lease (no other writer can exist), else after
        a read index no higher than this replica's own last append, asked
        after the decision, while it still leads in the same term.  Otherwise
        nothing was applied and the requests are decided again by whoever
        leads (``_settle_confirmed``)."""
        lease = self.read_lease
        if lease is not None and lease():
            self._settle_results(admitted, results)
            return
        term = self.raft_term
        self.unwritten_confirmations += 1

        def passed(exc) -> None:  # on an engine or journal thread
            self._post(Confirmation(admitted, results, term, exc))

        self._barrier.request(passed)

    def _settle_confirmed(self, confirmed: list) -> None:
        for c in confirmed:
            admitted, term = c.admitted, c.term
            if c.exc is not None:
                for p in admitted:
                    self._settle(p, None, c.exc)
            elif self.is_leader and self.raft_term == term:
                # the journal ended at or before this replica's own records
                self._settle_results(admitted, c.results)
            else:
                # another replica led meanwhile: decided on a store that may
                # have missed its writes, and applied nowhere
                log.info("%d answers decided in term %d without a journal record are decided again "
                         "(this replica no longer leads in that term)", len(admitted), term)
                again = []
                for p in admitted:
                    if p.local:
                        self._settle(p, None, errors.ErrNotLeader)  # its sender forwards it again
                    else:
                        again.append(p)
                if again:
                    with self._cv:
                        self._queue.extend(again)

    # ------------------------------------------------------------------
    # forwarding a follower's writes

    def _forward(self, batch: list) -> None:
        """A follower's queued writes: forward them to the leader."""
        local = [p for p in batch if p.local]
        for p in local:
            self._settle(p, None, errors.ErrNotLeader)
        batch = [p for p in batch if not p.local]
        if not batch:
            return
        if self._failed is not None:
            for p in batch:
                self._settle(p, None, self._failed)
            return
        forwarder = self.forwarder
        if forwarder is None:
            for p in batch:
                self._settle(p, None, errors.ErrNoLeader)
            return
        now = time.monotonic()
        for p in batch:
            if not p.deadline:
                p.deadline = now + APPLY_WAIT_SECONDS
            elif now > p.deadline:  # sent again after a leader change, for too long
                self._settle(p, None, errors.ErrTimeout)
        batch = [p for p in batch if not p.settled]
        if not batch:
            return
        requests = [p.request for p in batch]
        if any(type(r) is Effects for r in requests):
            for p in batch:
                self._settle(p, None, errors.ErrNotLeader)
            return

        def done(outcome) -> None:  # on the forwarder's thread
            self._post(ForwardOutcome(batch, outcome))

        try:
            forwarder.forward(requests, done)
        except Exception as e:  # noqa: BLE001
            log.exception("forwarding writes failed")
            done(errors.ErrStopped if not isinstance(e, errors.EtcdError) else e)

    def _complete_forwarded(self, completions: list) -> None:
        """The leader answered: answer our callers once we applied it."""
        now = time.monotonic()
        for completion in completions:
            batch, outcome = completion.batch, completion.outcome
            if isinstance(outcome, BaseException):
                err = outcome if isinstance(outcome, errors.EtcdError) else errors.ErrStopped
                for p in batch:
                    self._settle(p, None, err)
                continue
            need = 0
            items = []
            again = []
            for p, res in zip(batch, outcome):
                if res == errors.ErrNotLeader and not p.settled:
                    again.append(p)  # the old leader never decided it: send it again
                    continue
                rev = getattr(res, "revision", 0) or 0
                if not isinstance(res, BaseException) and rev > need:
                    need = rev
                items.append((p, res))
            if again:
                with self._cv:
                    self._queue.extend(again)
            if need <= self.committed_rev:
                self._settle_forwarded(items)
            else:
                heapq.heappush(self._parked, (need, next(self._park_seq), now + APPLY_WAIT_SECONDS, items))

    def _settle_forwarded(self, items: list) -> None:
        for p, res in items:
            if isinstance(res, BaseException):
                self._settle(p, None, res)
            elif p.wait_compact and self.store.compact_done_rev < p.wait_compact:
                p.result = res
                self._compact_waiters.append((p.wait_compact, p))
            else:
                self._settle(p, res)

    def _release_parked(self) -> None:
        parked = self._parked
        rev = self.committed_rev
        while parked and parked[0][0] <= rev:
            self._settle_forwarded(heapq.heappop(parked)[3])

    def _expire_waiting(self) -> None:
        """Answers that waited too long for this replica to catch up."""
        if self._barrier is not None:
            self._barrier.expire()
        if not self._parked:
            return
        now = time.monotonic()
        keep = []
        for item in self._parked:
            if item[2] <= now:
                for p, _ in item[3]:
                    self._settle(p, None, errors.ErrTimeout)
            else:
                keep.append(item)
        if len(keep) != len(self._parked):
            heapq.heapify(keep)
            self._parked = keep

    # ------------------------------------------------------------------
    # taking and giving up the lead

    def promote(self) -> bool:
        """(any thread) Try to become the leader; True on success.  Called
        by the cluster package once it holds the election key."""
        if self._barrier is None:
            return True
        fut: Future = Future()
        self._control(lambda: fut.set_result(self._promote()))
        return fut.result()

    def step_down(self) -> None:
        """(any thread) Stop leading (the election key was lost)."""
        if self._barrier is None:
            return
        self._abandon_writes = True
        with self._cv:
            self._cv.notify()
        fut: Future = Future()

        def run() -> None:
            if self.is_leader:
                self._step_down(rebuild=False)
            fut.set_result(None)

        self._control(run)
        fut.result()

    def _promote(self) -> bool:
        if self.is_leader:
            return True
        if self._failed is not None:
            return False
        if self._rebuild_pending:
            # the store may hold a batch the journal does not (a step-down
            # whose rebuild could not read the journal yet): leading from it
            # would append the next batch after a revision nobody has
            self._rebuild_retry_at = 0.0
            self._try_rebuild()
            if self._rebuild_pending or self._failed is not None:
                log.warning("cannot take the lead before the store is rebuilt from the journal")
                return False
        if self.store.revision != self.committed_rev:
            log.error("cannot take the lead: the store is at revision %d, the journal at %d",
                      self.store.revision, self.committed_rev)
            return False
        journal = self.journal
        journal.stop_following()
        self._following = False
        self._apply_records(self._take_posted(Delivered))
        for _ in range(PROMOTE_ATTEMPTS):
            try:
                end = _read_index_now(journal)
                if end > self._applied_index:
                    self._catch_up(end)
                journal.begin_writing(self._applied_index)
                enc = BatchEncoder()
                epoch = self.store.epoch + 1
                enc.epoch(epoch, self.member_id)
                payload = enc.finish()
                journal.append(payload)
                journal.sync()
            except JournalFencedError as e:
                log.info("another record reached the journal first (%s); catching up", e)
                journal.stop_writing()
                continue
            except (JournalError, errors.EtcdError, TimeoutError) as e:
                log.warning("cannot take the lead: %s", e)
                journal.stop_writing()
                break
            with self._lock:
                self.store.replay(payload, live=True)
                self._applied_index = journal.last_index
            self._abandon_writes = False
            self.raft_term = epoch
            self._lead()
            log.info("leading the journal from index %d, revision %d (term %d)",
                     self._applied_index, self.committed_rev, epoch)
            self._run_role_hooks()
            return True
        self._follow()
        return False

    def _catch_up(self, end: int) -> None:
        """Apply the journal's records up to ``end`` (promotion)."""
        batch: list = []
        for index, payload in self.journal.records(after_index=self._applied_index):
            batch.append(Delivered(index, payload))
            if len(batch) >= 256 or index >= end:
                self._apply_records(batch)
                batch = []
            if index >= end:
                break
        if batch:
            self._apply_records(batch)

    def _step_down(self, rebuild: bool) -> None:
        """Become a follower.  ``rebuild``: the store may hold a batch that
        is not in the journal; rebuild it from what is."""
        log.warning("stepping down from leading the journal (term %d)%s", self.raft_term,
                    "; rebuilding the store from the checkpoint and the journal" if rebuild else "")
        self._follow_leader()
        self.journal.stop_writing()
        for _, p in self._compact_waiters:
            self._settle(p, p.result)
        self._compact_waiters = []
        if rebuild:
            self._rebuild_pending = True
            self._try_rebuild()
        else:
            self._follow()
        self._run_role_hooks()

    def _try_rebuild(self) -> None:
        """Rebuild, then follow; retried between batches while the journal
        cannot be read (the replica keeps serving serializable reads at its
        committed revision meanwhile)."""
        if not self._rebuild_pending or time.monotonic() < self._rebuild_retry_at:
            return
        try:
            self._rebuild()
        except Exception as e:  # noqa: BLE001 - the journal may be unreachable: retry
            log.warning("rebuilding the store failed (%r); retrying in 1s", e)
            self._rebuild_retry_at = time.monotonic() + 1.0
            return
        self._rebuild_pending = False
        if self._failed is None:
            self._follow()

    def _rebuild(self) -> None:
        """Replace the store by one recovered from the local checkpoint and
        the journal up to the applied index.  Reads go on meanwhile from
        the old store at the committed revision, which the rebuild
        reproduces exactly."""
        started = time.monotonic()
        self._checkpointer.settle(self.store)
        store, applied, nbytes = self._load_store(upto_index=self._applied_index)
        if applied != self._applied_index or store.revision != self.committed_rev:
            self._fail(errors.ErrCorrupt, f"rebuilding the store reached journal index {applied}, revision "
                                          f"{store.revision}; expected {self._applied_index}, {self.committed_rev}")
            log.error("%s", self._failed_reason)
            return
        store.collect_changes()
        with self.watches.lock:
            with self._lock:
                self.store = store
            self.watches.hub.store = store
        self._checkpointer.journal_bytes = nbytes
        log.info("store rebuilt at revision %d in %.2fs", store.revision, time.monotonic() - started)

    def _run_role_hooks(self) -> None:
        self.leader_changes += 1
        for hook in self.role_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001
                log.exception("role hook failed")

    def _close_replication(self) -> None:
        if self._barrier is not None:
            self._barrier.fail_all(errors.ErrStopped)
            if self._following:
                self.journal.stop_following()
        for c in self._take_posted(Confirmation):
            for p in c.admitted:
                self._settle(p, None, errors.ErrStopped)
        for item in self._parked:
            for p, _ in item[3]:
                self._settle(p, None, errors.ErrStopped)
        self._parked = []
        self._flush_sinks()


def _read_index_now(journal, timeout: float = 5.0) -> int:
    """The journal's newest index, waited for on this thread."""
    done = threading.Event()
    out: list = [None, None]

    def answer(index, exc) -> None:
        out[0], out[1] = index, exc
        done.set()

    journal.read_index(answer)
    if not done.wait(timeout):
        raise TimeoutError("the journal did not answer its newest index")
    if out[1] is not None:
        raise errors.raisable(out[1])
    return out[0]
