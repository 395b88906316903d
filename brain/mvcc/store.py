"""The MVCC store: one revision sequence over key-range shards.

No I/O happens here except through the value store handed in (reads of
records that a checkpoint moved out of memory).  The store is not
thread-safe: the engine serialises access with one lock.

Writes come in batches: `apply(requests)` runs them in order and returns
their results plus one journal payload describing their effects; the engine
appends that payload, fdatasyncs, and only then acknowledges.  Reads take a
`view` revision: the engine passes the newest *durable* revision, so a read
never observes a write that a crash could still undo.

The store is split as etcd splits its kvstore: this module holds the Store,
its state and every entry point the engine calls; the work is done by

    reads.py       Range, counts, history for watch catch-up, prev_kv
    txn.py         the write transaction and the write requests it runs
    compaction.py  Compact, and the physical compaction's bounded steps
    replay.py      rebuilding state from a checkpoint and journal payloads
    checkpoint.py  the checkpoint cut (CheckpointCut)

which work on the store through its internal interface, StoreCore
(brain.mvcc.store_core): they read its state and change it only through
its methods, among them the two mutations `put_at` and `delete_at`, the
only code that changes a key's history (a write transaction and replay
both go through them, which is why a replayed store equals the one that
wrote the payload).  Every field of the Store is written by its own
methods only.  The engine uses the other methods only.
"""

from __future__ import annotations

from typing import Iterable

from . import auth_apply, checkpoint, errors, reads, replay, txn, validation
from .auth import AuthState
from .checkpoint import CheckpointCut
from .codec import BatchEncoder
from .compaction import Compaction, apply_compact
from .lease import Lessor
from .packed import BLOCK_KEYS
from .requests import (
    AUTH_REQUESTS,
    EVENT_DELETE,
    Authorized,
    EVENT_PUT,
    CompactRequest,
    DeleteRangeRequest,
    Event,
    KeyValue,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeColumns,
    RangeRequest,
    RangeResult,
    TxnRequest,
    TxnResult,
)
from .revision import main_of
from .shard import Shard
from .shard_map import ShardMap

# Overlay keys a shard keeps at least before merging them into blocks: a
# store this small stays on the overlay alone (Store.overlay_floor).
MERGE_FLOOR_KEYS = 4096

# How apply() runs each kind of write request: fn(store, request, encoder).
_APPLY = {
    PutRequest: txn.apply_put,
    TxnRequest: txn.apply_txn,
    DeleteRangeRequest: txn.apply_delete,
    CompactRequest: apply_compact,
    LeaseGrantRequest: txn.apply_lease_grant,
    LeaseRevokeRequest: txn.apply_lease_revoke,
    **{kind: txn.apply_auth for kind in AUTH_REQUESTS},
}


class Store:
    def __init__(self, backend, boundaries: Iterable[bytes] = (),
                 max_txn_ops: int = validation.DEFAULT_MAX_TXN_OPS, block_size: int = BLOCK_KEYS) -> None:
        self.shard_map = ShardMap(list(boundaries))
        self.shards = [Shard(i, backend, block_size) for i in range(len(self.shard_map))]
        self.backend = backend
        self.max_txn_ops = max_txn_ops
        self.revision = 1  # etcd's empty store is at revision 1
        self.compact_rev = -1  # nothing compacted yet (etcd's -1)
        self.compact_done_rev = -1  # physical compaction finished up to here
        self.lessor = Lessor()
        self.keys_live = 0
        # Every record with a main revision above this is in a memtable
        # (active or frozen), so recent history is readable without I/O.
        self.memtable_floor = 0
        self._cut_revision = 0
        # The newest main revision in the key indexes: ahead of `revision`
        # while a Txn is half applied (its Ranges see its own writes).
        self.index_rev = 0
        self._compaction: Compaction | None = None
        # After collect_changes(): every change applied, as an Event in
        # revision order, for the watch hub (taken per batch by take_changes).
        # None: not collected (recovery replays history nobody watches yet).
        self._changes: list[Event] | None = None
        # The newest epoch record replayed (a replicated journal's leader
        # term and that leader's member ID); 0 on a single node.
        self.epoch = 0
        self.leader_id = 0
        # Users, roles, auth on or off (brain.mvcc.auth): replaced, never
        # changed in place, by auth requests and replayed auth effects.
        self.auth = AuthState()
        # Since the last take_auth: whether the auth state changed, and the
        # token effects (brain.mvcc.auth_apply), collected like _changes.
        self._auth_changed = False
        self._token_effects: list | None = None

    # ------------------------------------------------------------------
    # changes for the watch hub

    def collect_changes(self) -> None:
        """Collect every change applied from now on (for live watchers),
        and the token effects (for the engine's token table: tokens issued
        before a restart are gone, as in etcd)."""
        if self._changes is None:
            self._changes = []
        if self._token_effects is None:
            self._token_effects = []

    def take_changes(self) -> list[Event]:
        """The changes applied since the last take, in revision order (none
        before collect_changes)."""
        changes = self._changes
        if not changes:
            return []
        self._changes = []
        return changes

    # ------------------------------------------------------------------
    # key placement and the two mutations (the internal interface)

    def shard_for_key(self, key: bytes) -> Shard:
        return self.shards[self.shard_map.shard_of(key)]

    def put_at(self, rev: int, key: bytes, value: bytes, lease: int) -> None:
        """Record a put of `key` at packed revision `rev`, newer than any in
        the key indexes (Write and replay number them)."""
        created, version = self.shard_for_key(key).put(rev, key, value, lease)
        if version == 1:
            self.keys_live += 1
        self.index_rev = rev >> 32
        self.lessor.set_key(key, lease)
        if self._changes is not None:
            self._changes.append(Event(EVENT_PUT, KeyValue(key, main_of(created), main_of(rev), version, value, lease)))

    def delete_at(self, rev: int, key: bytes) -> None:
        """Record the delete of live `key` at packed revision `rev`."""
        self.shard_for_key(key).delete(rev, key)
        self.index_rev = rev >> 32
        self.keys_live -= 1
        self.lessor.set_key(key, 0)
        if self._changes is not None:
            self._changes.append(Event(EVENT_DELETE, KeyValue(key, 0, main_of(rev), 0, b"", 0)))

    def set_auth(self, state: AuthState, token_effects=()) -> None:
        """The auth state is ``state`` now (an auth request decided, auth
        effects replayed); ``token_effects`` go to the token table."""
        if state is not self.auth:
            self.auth = state
            self._auth_changed = True
        if token_effects and self._token_effects is not None:
            self._token_effects.extend(token_effects)

    def take_auth(self) -> tuple[AuthState, list] | None:
        """(the auth state, the token effects) when either changed since the
        last take, else None: what the engine publishes with a batch."""
        tokens = self._token_effects
        if not self._auth_changed and not tokens:
            return None
        self._auth_changed = False
        if tokens:
            self._token_effects = []
        return self.auth, tokens or []

    def finish_revision(self, main: int) -> None:
        """Every change of main revision `main` is applied (a write
        transaction ended, a journal revision replayed): the store is at
        `main` now, and reads at it see them."""
        self.revision = main

    def set_epoch(self, epoch: int, leader_id: int) -> None:
        """An epoch record was applied: a replicated journal's leader term
        and that leader's member ID (brain.mvcc.replay)."""
        self.epoch, self.leader_id = epoch, leader_id

    # ------------------------------------------------------------------
    # reads (brain.mvcc.reads)

    def range(self, r: RangeRequest, view: int) -> RangeResult:
        validation.check_range(r)
        return reads.execute_range(self, r, view)

    def range_columns(self, r: RangeRequest, view: int) -> RangeColumns:
        """Range answered column by column (brain.mvcc.reads.range_columns):
        what a list of many keys is served from."""
        validation.check_range(r)
        return reads.range_columns(self, r, view)

    def range_chunk(self, r: RangeRequest, view: int) -> RangeColumns:
        """A range read without its total count (brain.mvcc.reads.range_columns
        with_count False), in columns: one chunk of a RangeStream, O(limit)."""
        validation.check_range(r)
        return reads.range_columns(self, r, view, with_count=False)

    def get_kv(self, key: bytes, at: int) -> KeyValue | None:
        return reads.get_kv(self, key, at)

    def history(self, key: bytes, end: bytes | None | bool, from_main: int, to_main: int,
                max_records: int) -> tuple[list[Event], int]:
        """Events on [key, end) for watch catch-up (brain.mvcc.reads.history)."""
        return reads.history(self, key, end, from_main, to_main, max_records)

    def fill_prev_kv(self, ev: Event) -> None:
        """Set ev.prev_kv as etcd does (brain.mvcc.reads.fill_prev_kv)."""
        reads.fill_prev_kv(self, ev)

    def txn_readonly(self, t: TxnRequest, view: int) -> TxnResult:
        """A Txn that writes nothing, served at `view` (brain.mvcc.txn)."""
        return txn.txn_readonly(self, t, view)

    # ------------------------------------------------------------------
    # the batch entry point (brain.mvcc.txn, brain.mvcc.compaction)

    def apply(self, requests: list) -> tuple[list, bytes]:
        """Apply write requests in order.  Returns one result or EtcdError per
        request and the journal payload of their effects (b"" if none)."""
        enc = BatchEncoder()
        results: list = []
        for req in requests:
            try:
                if type(req) is Authorized or self.auth.enabled:
                    req = auth_apply.admit(self.auth, self.lessor, req)
                run = _APPLY.get(type(req))
                if run is None:
                    raise TypeError(f"not a write request: {req!r}")
                results.append(run(self, req, enc))
            except errors.EtcdError as e:
                results.append(e)
        return results, enc.finish()

    # ------------------------------------------------------------------
    # physical compaction (brain.mvcc.compaction)

    def start_compaction(self, rev: int) -> None:
        """Compact at `rev` (logically at once; physically by compaction_step)."""
        self.compact_rev = rev
        self._compaction = Compaction(self, rev)

    @property
    def compacting(self) -> bool:
        return self._compaction is not None

    def compaction_step(self, budget: int = 1000) -> bool:
        """Compact up to `budget` keys; True when no compaction is pending.
        Steps are small so writes interleave with a long compaction."""
        job = self._compaction
        if job is None:
            return True
        if job.step(budget):
            self._compaction = None
            self.compact_done_rev = job.rev
            return True
        return False

    # ------------------------------------------------------------------
    # folding recent writes into the packed index (Shard.merge)

    def overlay_floor(self, shard: Shard) -> int:
        """How many overlay keys a shard keeps before merges start: a
        small store stays in the overlay, a large one keeps it to a
        hundredth of its keys, so reads that merge both tiers stay cheap
        and the index's memory stays near the blocks'."""
        return max(MERGE_FLOOR_KEYS, shard.keys() // 100)

    @property
    def merging(self) -> bool:
        """True when some shard has entries to fold past its floor (Shard.merge_due)."""
        return any(s.merge_due(self.overlay_floor(s)) for s in self.shards)

    def unmerged(self) -> int:
        """Index entries out of the blocks, every shard's (Shard.unmerged)."""
        return sum(s.unmerged() for s in self.shards)

    @property
    def packed(self) -> bool:
        """True when every key is in the blocks: no shard holds an overlay
        or lifted key (what a merge leaves: its floor, and the hot keys)."""
        return not any(s.unmerged() for s in self.shards)

    def merge_step(self, budget: int = 1000, *, everything: bool = False) -> None:
        """Rebuild about `budget` keys of blocks with overlay keys folded in,
        in the shards whose unmerged entries are past their floor, the
        furthest past it first: a shard of the busiest keys (node leases,
        pods) is not left behind the quieter ones that fill the budget
        every step.  ``everything``: a floor of 0, hot keys folded too (a
        store that stopped taking writes: brain.engine.committer)."""
        floors = {shard.id: 0 if everything else self.overlay_floor(shard) for shard in self.shards}
        job = self._compaction
        for shard in sorted(self.shards, key=lambda sh: floors[sh.id] - sh.unmerged()):
            if budget <= 0:
                return
            # the shard a compaction is walking: its cursor's block is not rebuilt
            cursor = job.cursor if job is not None and job.shard_pos == shard.id else None
            budget -= shard.merge(budget, floors[shard.id], cursor)

    # ------------------------------------------------------------------
    # recovery (brain.mvcc.replay)

    def replay(self, payload: bytes, *, live: bool = False) -> None:
        """Re-apply one journal payload (brain.mvcc.replay.replay)."""
        replay.replay(self, payload, live=live)

    def check_continues(self, payload: bytes) -> None:
        """Refuse a payload that does not continue this store (brain.mvcc.replay)."""
        replay.check_continues(self, payload)

    def load_checkpoint(self, revision: int, leases: Iterable[tuple[int, int]], *, compact_rev: int,
                        compaction_finished: bool, epoch: int = 0, leader_id: int = 0,
                        auth: AuthState | None = None, progress: replay.LoadProgress | None = None) -> None:
        """Take the state a checkpoint recorded (``load_records`` plus its
        revisions and auth state); a physical compaction it records as
        unfinished starts again from the beginning."""
        self.load_records(leases, progress)
        if auth is not None:
            self.set_auth(auth)
        self.revision = revision
        self.compact_rev = compact_rev
        self.compact_done_rev = compact_rev if compaction_finished else -1
        self.epoch, self.leader_id = epoch, leader_id
        if not compaction_finished:
            self.start_compaction(compact_rev)

    def load_records(self, leases: Iterable[tuple[int, int]] = (),
                     progress: replay.LoadProgress | None = None) -> None:
        """Rebuild the key indexes from the value store (brain.mvcc.replay.load_records)."""
        self.keys_live, newest = replay.load_records(self, leases, progress)
        self.memtable_floor = self.index_rev = max(self.memtable_floor, newest)

    # ------------------------------------------------------------------
    # checkpoints (brain.mvcc.checkpoint)

    def checkpoint_cut(self) -> CheckpointCut:
        """Freeze the memtables into a cut to write without the lock (brain.mvcc.checkpoint)."""
        cut = checkpoint.cut(self)
        self._cut_revision = cut.revision
        return cut

    def checkpoint_done(self) -> None:
        """The cut is in the value store: drop its frozen memtables; every
        record above the cut's revision is in the active memtable."""
        checkpoint.done(self)
        self.memtable_floor = self._cut_revision

    def checkpoint_abort(self, cut: CheckpointCut) -> None:
        """The cut was not written: take its records back (brain.mvcc.checkpoint)."""
        checkpoint.abort(self, cut)

    # ------------------------------------------------------------------
    # sizes

    def memtable_entries(self) -> int:
        return sum(s.memtable_records() for s in self.shards)

    def keys_total(self) -> int:
        return sum(s.keys() for s in self.shards)
