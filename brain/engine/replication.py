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
end, then append an epoch record fenced on that end, the first thing a new
leader writes, so no record of a previous leader can follow it.  The epoch
is appended only while this replica's hold on the election key is still
valid (``holds_key``, asked after the journal's end was read): a replica
that won the key, stalled past the election timeout and resumed must not
append after the epoch of the replica that took the key meanwhile, whose
read lease says nobody else writes.  Worked example: X wins the key at T0
and stalls; Y, having known X's key revision for the election timeout T,
takes it after T0 + T and appends its epoch at index 9.  X resumes at T0 +
2T, reads the journal's end (9), and would append its epoch at 10 and
decide writes that Y, answering reads from its lease, never sees.  X's
hold ended at T0 + 0.8 T, so X gives up instead.  If another record got
there first (the fence refused the epoch: a deposed leader's last batch),
catch up and try again, while the hold is still valid.

Giving up the lead (``step_down``): on a fenced append (someone else
leads: our batch is not in the journal, but it is in our memory) the store
is rebuilt from the last local checkpoint and the journal, up to the last
record this replica knows is in the journal; when the election was lost
without a failed append, the store is exact and following resumes.

The committer holds a Replication (a single node's holds one too, that
never follows) and hands it the turns' delivered records, forwarded
answers and confirmations; Replication works through the committer's
public methods, as brain.engine.committer_core lists them (the queue and
inboxes, settling, publishing, the role), and its lock, and runs on the
committer thread unless a method says otherwise.

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
from typing import Callable

from .. import failpoints
from ..journal import JournalError, JournalFencedError, JournalPurgedError, JournalUnavailableError
from ..mvcc import errors
from ..mvcc.codec import BatchEncoder
from ..mvcc.requests import TxnRequest
from ..mvcc.store import Store
from .checkpointing import Checkpointer
from .committer_core import CommitterCore
from .items import Confirmation, Control, Delivered, Effects, ForwardOutcome
from .readindex import ReadBarrier
from .timeouts import REQUEST_TIMEOUT

log = logging.getLogger("brain.engine.replication")

PROMOTE_ATTEMPTS = 20
# How long a journal may end before the records a replica applied before
# they count as lost: three times NATS's 10 s lost-quorum interval, after
# which a cut-off stream leader has stopped answering with its old end.
JOURNAL_SHORT_FOR = 30.0


class Replication:
    """The replica's following, forwarding and changes of lead (see the
    module docstring), held by the committer (``_core``) and talking to it
    through what brain.engine.committer_core lists.  ``barrier`` is None on a single node,
    which leads its local journal from the start and never follows.  Every
    method runs on the committer thread unless it says otherwise."""

    def __init__(self, committer: CommitterCore, lock: threading.Lock, journal, barrier: ReadBarrier | None,
                 checkpointer: Checkpointer, load_store: Callable[[int], tuple[Store, int, int]]) -> None:
        self._core = committer
        self._lock = lock  # the committer's: guards the store (see brain.engine.committer)
        # a store recovered from the checkpoint and the journal up to an
        # index: (store, last index held, journal bytes replayed)
        self._load_store = load_store
        self._journal = journal
        self._barrier = barrier
        self._checkpointer = checkpointer
        self.unwritten_confirmations = 0  # of them, those that asked the journal
        self._parked: list = []  # heap: (revision, seq, deadline, [(pending, result)])
        self._park_seq = itertools.count()
        self._follow_error: BaseException | None = None
        self._following = False
        # set (from any thread) when this replica lost the election: a batch
        # waiting for an unreachable journal is given up
        self._abandon_writes = False
        self._rebuild_pending = False
        self._rebuild_retry_at = 0.0
        self._refollow_at = 0.0  # following failed: start again at this time
        self._behind: tuple[int, float] | None = None  # (an index the journal has, since when)
        # the journal's end was first seen below the applied index, and last
        self._short_since: float | None = None
        self._short_seen = 0.0

    @property
    def abandoning_writes(self) -> bool:
        """(any thread) The election was lost: a batch waiting for an
        unreachable journal gives up."""
        return self._abandon_writes

    # ------------------------------------------------------------------
    # following

    def follow(self) -> None:
        """Start receiving the journal's records after the applied index."""
        self._follow_error = None
        self._following = True
        self._journal.follow(self._core.applied_index, self._deliver, self._follow_failed,
                             epoch=self._core.store.epoch)

    def _deliver(self, index: int, payload: bytes) -> None:
        """(journal thread) A record to apply."""
        self._core.post(Delivered(index, payload))

    def _follow_failed(self, exc: BaseException) -> None:
        """(journal thread) The journal cannot deliver any more records."""
        self._follow_error = exc
        if isinstance(exc, JournalPurgedError):
            log.error("following the journal failed: %s", exc)
            self._core.fail(errors.ErrStopped, f"journal records needed by this replica were purged: {exc}")
        else:
            log.warning("following the journal failed (%s); trying again in 1s", exc)
            self._refollow_at = time.monotonic() + 1.0

    def maintain(self) -> bool:
        """(between batches) Time out answers that waited too long, follow
        again where following stalled, retry a pending rebuild.  True while
        the store is still to be rebuilt (no checkpoint of a store about to
        be replaced)."""
        self._expire_waiting()
        self._check_following()
        if self._rebuild_pending:
            self._try_rebuild()
            return True
        return False

    def _check_following(self) -> None:
        """Start following again when it failed, or when the journal is
        known to hold records that have not arrived for a while (a consumer
        lost across a NATS outage)."""
        core = self._core
        if core.is_leader or self._rebuild_pending or core.failed is not None:
            return
        now = time.monotonic()
        behind = self._behind
        if behind is not None:
            if core.applied_index >= behind[0]:
                self._behind = None
            elif now - behind[1] > 3.0 and not core.has_posted(Delivered):
                log.warning("the journal holds index %d but this replica is at %d since %.1fs; "
                            "following again", behind[0], core.applied_index, now - behind[1])
                self._behind = None
                self._refollow_at = now
        if self._refollow_at and now >= self._refollow_at:
            self._refollow_at = 0.0
            self._journal.stop_following()
            self.follow()

    def apply_records(self, records: list[Delivered]) -> None:
        """Apply delivered records (a follower's commit)."""
        core = self._core
        if core.is_leader:
            # Left over from before a promotion: promote applied them already.
            return
        applied = core.applied_index
        nbytes = 0
        store = core.store
        with self._lock:
            for record in records:
                index, payload = record.index, record.payload
                if index <= applied:
                    continue  # delivered twice across a restart of following
                try:
                    store.replay(payload, live=True)
                except ValueError as e:
                    core.fail(errors.ErrCorrupt, f"journal record {index} cannot be applied: {e}")
                    log.error("journal record %d cannot be applied (%s); this replica stops applying", index, e)
                    break
                applied = index
                nbytes += len(payload)
            events = store.take_changes()
            auth = store.take_auth()
        self._checkpointer.journaled(nbytes)
        core.publish(store.revision, applied, events, auth)
        if store.epoch != core.term:
            core.term = store.epoch
            core.role_changed()
        self._release_parked()

    def journal_ahead(self, index: int) -> None:
        """(any thread) The journal reported an index beyond what this
        replica has.  A follower will receive it; a leader that never wrote
        it has been deposed without noticing: step down."""
        core = self._core
        if core.is_leader and index > self._journal.last_index:
            log.warning("the journal is at index %d, past this leader's last append %d: stepping down",
                        index, self._journal.last_index)
            core.post(Control(lambda: core.is_leader and self.step_down_now(rebuild=True)))
        elif not core.is_leader and self._behind is None:
            self._behind = (index, time.monotonic())

    # ------------------------------------------------------------------
    # answers decided without a journal record

    def confirm_unwritten(self, admitted: list, results: list) -> None:
        """(leading) Settle a batch that appended nothing (failed compares,
        deletes of nothing, refused requests) once this replica is known to
        have decided it on the whole journal.

        A batch that appends is vouched for by the fence on its record.  One
        that does not was decided on this replica's store alone, and a
        replica deposed without noticing yet (its key taken over while it was
        paused) would answer from a store missing the new leader's writes:
        "compare failed" at a revision below one already acknowledged.  So:
        at once within the read lease (no other writer can exist), else after
        a read index no higher than this replica's own last append, asked
        after the decision, while it still leads in the same term.  Otherwise
        nothing was applied and the requests are decided again by whoever
        leads (``settle_confirmed``)."""
        core = self._core
        lease = core.read_lease
        if lease is not None and lease():
            core.settle_decided(admitted, results)
            return
        term = core.term
        self.unwritten_confirmations += 1

        def passed(exc) -> None:  # on an engine or journal thread
            core.post(Confirmation(admitted, results, term, exc))

        self._barrier.request(passed)

    def settle_confirmed(self, confirmed: list[Confirmation]) -> None:
        core = self._core
        for c in confirmed:
            admitted, term = c.admitted, c.term
            if c.exc is not None:
                for p in admitted:
                    core.settle(p, None, c.exc)
            elif core.is_leader and core.term == term:
                # the journal ended at or before this replica's own records
                core.settle_results(admitted, c.results)
            else:
                # another replica led meanwhile: decided on a store that may
                # have missed its writes, and applied nowhere
                log.info("%d answers decided in term %d without a journal record are decided again "
                         "(this replica no longer leads in that term)", len(admitted), term)
                again = []
                for p in admitted:
                    if p.local:
                        core.settle(p, None, errors.ErrNotLeader)  # its sender forwards it again
                    else:
                        again.append(p)
                if again:
                    core.requeue(again)

    # ------------------------------------------------------------------
    # forwarding a follower's writes

    def forward(self, batch: list) -> None:
        """A follower's queued writes: forward them to the leader."""
        core = self._core
        local = [p for p in batch if p.local]
        for p in local:
            core.settle(p, None, errors.ErrNotLeader)
        batch = [p for p in batch if not p.local]
        if not batch:
            return
        failed = core.failed
        if failed is not None:
            for p in batch:
                core.settle(p, None, failed)
            return
        forwarder = core.forwarder
        if forwarder is None:
            for p in batch:
                core.settle(p, None, errors.ErrNoLeader)
            return
        now = time.monotonic()
        for p in batch:
            if not p.deadline:
                p.deadline = now + REQUEST_TIMEOUT
            elif now > p.deadline:  # sent again after a leader change, for too long
                core.settle(p, None, errors.ErrTimeout)
        batch = [p for p in batch if not p.settled]
        if not batch:
            return
        requests = [p.request for p in batch]
        if any(type(r) is Effects for r in requests):
            for p in batch:
                core.settle(p, None, errors.ErrNotLeader)
            return

        def done(outcome) -> None:  # on the forwarder's thread
            core.post(ForwardOutcome(batch, outcome))

        # a plain Txn goes as its client's bytes where the front kept them
        # (an authorized write is wrapped: it goes as a request)
        wires = [p.wire if type(p.request) is TxnRequest else None for p in batch]
        try:
            forwarder.forward(requests, done, wires)
        except Exception as e:  # noqa: BLE001
            log.exception("forwarding writes failed")
            done(errors.ErrStopped if not isinstance(e, errors.EtcdError) else e)

    def complete_forwarded(self, completions: list[ForwardOutcome]) -> None:
        """The leader answered: answer our callers once we applied it."""
        core = self._core
        now = time.monotonic()
        for completion in completions:
            batch, outcome = completion.batch, completion.outcome
            if isinstance(outcome, BaseException):
                err = outcome if isinstance(outcome, errors.EtcdError) else errors.ErrStopped
                for p in batch:
                    core.settle(p, None, err)
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
                core.requeue(again)
            if need <= core.committed_rev:
                self._settle_forwarded(items)
            else:
                heapq.heappush(self._parked, (need, next(self._park_seq), now + REQUEST_TIMEOUT, items))

    def _settle_forwarded(self, items: list) -> None:
        core = self._core
        for p, res in items:
            if isinstance(res, BaseException):
                core.settle(p, None, res)
            elif p.wait_compact and core.store.compact_done_rev < p.wait_compact:
                core.await_compaction(p, res)
            else:
                core.settle(p, res)

    def _release_parked(self) -> None:
        parked = self._parked
        rev = self._core.committed_rev
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
                    self._core.settle(p, None, errors.ErrTimeout)
            else:
                keep.append(item)
        if len(keep) != len(self._parked):
            heapq.heapify(keep)
            self._parked = keep

    # ------------------------------------------------------------------
    # taking and giving up the lead

    def promote(self, holds_key: Callable[[], bool]) -> bool:
        """(any thread) Try to become the leader; True on success.  Called
        by the cluster package once it holds the election key;
        ``holds_key()`` says whether that hold is still valid now (no other
        replica can have taken the key): the epoch record is appended only
        while it is."""
        if self._barrier is None:
            return True
        fut: Future = Future()
        self._core.post(Control(lambda: fut.set_result(self._promote(holds_key))))
        return fut.result()

    def step_down(self) -> None:
        """(any thread) Stop leading (the election key was lost)."""
        if self._barrier is None:
            return
        core = self._core
        self._abandon_writes = True
        core.wake()
        fut: Future = Future()

        def run() -> None:
            if core.is_leader:
                self.step_down_now(rebuild=False)
            fut.set_result(None)

        core.post(Control(run))
        fut.result()

    def _promote(self, holds_key: Callable[[], bool]) -> bool:
        failpoints.hit("promote.start")  # a fault test stalls the new key holder here
        core = self._core
        if core.is_leader:
            return True
        if core.failed is not None:
            return False
        if self._rebuild_pending:
            # the store may hold a batch the journal does not (a step-down
            # whose rebuild could not read the journal yet): leading from it
            # would append the next batch after a revision nobody has
            self._rebuild_retry_at = 0.0
            self._try_rebuild()
            if self._rebuild_pending or core.failed is not None:
                log.warning("cannot take the lead before the store is rebuilt from the journal")
                return False
        if core.store.revision != core.committed_rev:
            log.error("cannot take the lead: the store is at revision %d, the journal at %d",
                      core.store.revision, core.committed_rev)
            return False
        journal = self._journal
        journal.stop_following()
        self._following = False
        self.apply_records(core.take_posted(Delivered))
        for _ in range(PROMOTE_ATTEMPTS):
            try:
                end = _end_index_now(journal)
                if end < core.applied_index:
                    if self._journal_ends_short(end, "not taking the lead"):
                        return False
                    break
                self._short_since = None
                if end > core.applied_index:
                    self._catch_up(end)
                # Asked after the end was read: an epoch of whoever took the
                # key is in that end only if it was appended after this
                # hold ended (see the module docstring).
                if not holds_key():
                    log.warning("not taking the lead: this replica's hold on the election key ended before "
                                "its epoch record could be appended (the journal ends at index %d)", end)
                    break
                epoch = core.store.epoch + 1
                journal.begin_writing(core.applied_index, epoch)
                enc = BatchEncoder()
                enc.epoch(epoch, core.member_id)
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
            core.apply_epoch(payload, journal.last_index)
            self._abandon_writes = False
            core.term = epoch
            core.lead()
            log.info("leading the journal from index %d, revision %d (term %d)",
                     core.applied_index, core.committed_rev, epoch)
            core.role_changed()
            return True
        self.follow()
        return False

    def _journal_ends_short(self, end: int, doing: str) -> bool:
        """The journal ends before the records this replica applied.  A
        stream leader cut off from its quorum answers such an old end until
        it notices (NATS's lost-quorum interval, 10 s); past
        JOURNAL_SHORT_FOR seconds the records are gone (the stream deleted
        and created again, its NATS servers' storage lost), and leading
        would append after a history nobody else can read: the engine
        refuses writes until restarted, loudly.  True once it failed.
        The looks of one episode come a second or two apart (promotions,
        rebuild retries); a look more than JOURNAL_SHORT_FOR after the last
        starts a new one, so short looks hours apart never add up."""
        core = self._core
        now = time.monotonic()
        if self._short_since is None or now - self._short_seen > JOURNAL_SHORT_FOR:
            self._short_since = now  # a new episode: an old one ended without a look at a longer journal
        self._short_seen = now
        short_for = now - self._short_since
        what = f"the journal ends at index {end}, before index {core.applied_index} that this replica applied"
        if short_for < JOURNAL_SHORT_FOR:
            log.warning("%s: %s (for %.1fs; a NATS server cut off from its quorum answers an old end until "
                        "it notices)", doing, what, short_for)
            return False
        reason = (f"{what}, for {short_for:.0f}s: records it held are lost (the stream was deleted or created "
                  f"again, or its NATS servers lost their storage)")
        log.error("%s; this replica refuses writes until restarted", reason)
        core.fail(errors.ErrCorrupt, reason)
        return True

    def _catch_up(self, end: int) -> None:
        """Apply the journal's records up to ``end`` (promotion)."""
        batch: list = []
        for index, payload in self._journal.records(after_index=self._core.applied_index,
                                                    epoch=self._core.store.epoch):
            batch.append(Delivered(index, payload))
            if len(batch) >= 256 or index >= end:
                self.apply_records(batch)
                batch = []
            if index >= end:
                break
        if batch:
            self.apply_records(batch)

    def step_down_now(self, rebuild: bool) -> None:
        """Become a follower.  ``rebuild``: the store may hold a batch that
        is not in the journal; rebuild it from what is."""
        core = self._core
        log.warning("stepping down from leading the journal (term %d)%s", core.term,
                    "; rebuilding the store from the checkpoint and the journal" if rebuild else "")
        core.follow_leader()
        self._journal.stop_writing()
        core.release_compaction_waiters()
        if rebuild:
            self._rebuild_pending = True
            self._try_rebuild()
        else:
            self.follow()
        core.role_changed()

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
        if self._core.failed is None:
            self.follow()

    def _rebuild(self) -> None:
        """Replace the store by one recovered from the local checkpoint and
        the journal up to the applied index.  Reads go on meanwhile from
        the old store at the committed revision, which the rebuild
        reproduces exactly."""
        core = self._core
        started = time.monotonic()
        self._checkpointer.settle(core.store)
        store, applied, nbytes = self._load_store(core.applied_index)
        if applied < core.applied_index:
            # Records this replica applied exist (the journal delivered
            # them), so a read that ends before them saw a view of the
            # stream still catching up: a NATS server just back from a
            # partition answers with its own, older end.  Retried, until
            # it has lasted too long for that (_journal_ends_short).
            if self._journal_ends_short(applied, "cannot rebuild the store yet"):
                return
            raise JournalUnavailableError(
                f"the journal read ended at index {applied}, before index {core.applied_index} that this "
                f"replica has applied (a NATS server still catching up)")
        if applied != core.applied_index or store.revision != core.committed_rev:
            reason = (f"rebuilding the store reached journal index {applied}, revision {store.revision}; "
                      f"expected {core.applied_index}, {core.committed_rev}")
            core.fail(errors.ErrCorrupt, reason)
            log.error("%s", reason)
            return
        self._short_since = None
        store.collect_changes()
        core.replace_store(store)
        self._checkpointer.journal_bytes = nbytes
        log.info("store rebuilt at revision %d in %.2fs", store.revision, time.monotonic() - started)

    def close(self) -> None:
        """(the committer has ended) Answer what still waits: ErrStopped."""
        core = self._core
        if self._barrier is not None:
            self._barrier.fail_all(errors.ErrStopped)
            if self._following:
                self._journal.stop_following()
        for c in core.take_posted(Confirmation):
            for p in c.admitted:
                core.settle(p, None, errors.ErrStopped)
        for item in self._parked:
            for p, _ in item[3]:
                core.settle(p, None, errors.ErrStopped)
        self._parked = []
        core.flush_sinks()


def _end_index_now(journal, timeout: float = 5.0) -> int:
    """The journal's newest index, waited for on this thread (stale at
    worst: the epoch record appended after it is fenced on it)."""
    done = threading.Event()
    out: list = [None, None]

    def answer(index, exc) -> None:
        out[0], out[1] = index, exc
        done.set()

    journal.end_index(answer)
    if not done.wait(timeout):
        raise TimeoutError("the journal did not answer its newest index")
    if out[1] is not None:
        raise errors.raisable(out[1])
    return out[0]
