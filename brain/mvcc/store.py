"""The MVCC store: one revision sequence over key-range shards.

No I/O happens here except through the value store handed in (reads of
records that a checkpoint moved out of memory).  The store is not
thread-safe: the engine serialises access with one lock.

Writes come in batches: `apply(requests)` runs them in order and returns
their results plus one journal payload describing their effects; the engine
appends that payload, fdatasyncs, and only then acknowledges.  Reads take a
`view` revision: the engine passes the newest *durable* revision, so a read
never observes a write that a crash could still undo.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from sortedcontainers import SortedDict, SortedList

from . import errors, validation
from .codec import PUT, BatchEncoder, decode_batch, decode_record_head, encode_record
from .key_index import KeyIndex
from .lease import MAX_LEASE_TTL, Lessor
from .requests import (
    CMP_CREATE,
    CMP_EQUAL,
    CMP_GREATER,
    CMP_LEASE,
    CMP_LESS,
    CMP_MOD,
    CMP_NOT_EQUAL,
    CMP_VALUE,
    CMP_VERSION,
    SORT_ASCEND,
    SORT_DESCEND,
    SORT_NONE,
    TARGET_CREATE,
    TARGET_KEY,
    TARGET_MOD,
    TARGET_VALUE,
    TARGET_VERSION,
    CompactRequest,
    CompactResult,
    Compare,
    DeleteRangeRequest,
    DeleteRangeResult,
    EmptyResult,
    KeyValue,
    LeaseGrantRequest,
    LeaseGrantResult,
    LeaseRevokeRequest,
    LeaseRevokeResult,
    PutRequest,
    PutResult,
    RangeRequest,
    RangeResult,
    EVENT_DELETE,
    EVENT_PUT,
    Event,
    TxnRequest,
    TxnResult,
)
from .revision import SUB_MASK, from_bytes, main_of, pack
from .shard import Shard, ShardMap

_UNION_FOR_TARGET = {
    CMP_VERSION: "version",
    CMP_CREATE: "create_revision",
    CMP_MOD: "mod_revision",
    CMP_VALUE: "value",
    CMP_LEASE: "lease",
}

_SORT_KEYS = {
    TARGET_KEY: lambda kv: kv.key,
    TARGET_VERSION: lambda kv: kv.version,
    TARGET_CREATE: lambda kv: kv.create_revision,
    TARGET_MOD: lambda kv: kv.mod_revision,
    TARGET_VALUE: lambda kv: kv.value,
}


def range_end_bound(range_end: bytes) -> bytes | None | bool:
    """etcd's reading of range_end: b"" a single key (False), b"\\0" every key
    from `key` on (None: no bound), anything else an exclusive bound."""
    if not range_end:
        return False
    if range_end == b"\x00":
        return None
    return range_end


class _Write:
    """The changes of one write request: they all share main revision
    begin+1 and are numbered by sub in the order they happen."""

    __slots__ = ("store", "begin", "sub", "enc")

    def __init__(self, store: "Store", enc: BatchEncoder) -> None:
        self.store = store
        self.begin = store.revision
        self.sub = 0
        self.enc = enc

    @property
    def read_rev(self) -> int:
        return self.begin + 1 if self.sub else self.begin

    def _next(self) -> int:
        if self.sub == 0:
            self.enc.begin_revision(self.begin + 1)
        rev = pack(self.begin + 1, self.sub)
        self.sub += 1
        return rev

    def put(self, key: bytes, value: bytes, lease: int) -> int:
        rev = self._next()
        self.enc.put(key, value, lease)
        self.store._put_at(rev, key, value, lease)
        return self.begin + 1

    def delete(self, key: bytes) -> None:
        rev = self._next()
        self.enc.delete(key)
        self.store._delete_at(rev, key)

    def end(self) -> None:
        if self.sub:
            self.store.revision = self.begin + 1


class Store:
    def __init__(self, backend, boundaries: Iterable[bytes] = (),
                 max_txn_ops: int = validation.DEFAULT_MAX_TXN_OPS) -> None:
        self.shard_map = ShardMap(list(boundaries))
        self.shards = [Shard(i, backend) for i in range(len(self.shard_map))]
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
        self._compaction: _Compaction | None = None
        # After collect_changes(): every change applied, as an Event in
        # revision order, for the watch hub (taken per batch by take_changes).
        # None: not collected (recovery replays history nobody watches yet).
        self._changes: list[Event] | None = None
        # The newest epoch record replayed (a replicated journal's leader
        # term and that leader's member ID); 0 on a single node.
        self.epoch = 0
        self.leader_id = 0

    # ------------------------------------------------------------------
    # key placement

    def collect_changes(self) -> None:
        """Collect every change applied from now on (for live watchers)."""
        if self._changes is None:
            self._changes = []

    def take_changes(self) -> list[Event]:
        """The changes applied since the last take, in revision order (none
        before collect_changes)."""
        changes = self._changes
        if not changes:
            return []
        self._changes = []
        return changes

    def shard_for_key(self, key: bytes) -> Shard:
        return self.shards[self.shard_map.shard_of(key)]

    def _key_indexes(self, key: bytes, end: bytes | None | bool):
        """KeyIndex objects for [key, end) in key order (end False: just key)."""
        if end is False:
            ki = self.shard_for_key(key).index.get(key)
            if ki is not None:
                yield ki
            return
        if end is not None and end <= key:
            return
        for sid in self.shard_map.shards_for(key, end):
            shard = self.shards[sid]
            index = shard.index
            for k in shard.keys_in(key, end):
                yield index[k]

    # Counting at an older revision corrects the newest count with the keys
    # changed since; beyond this many revisions a scan is cheaper.
    COUNT_CORRECTION_REVISIONS = 4096

    def _count(self, key: bytes, end: bytes | None | bool, at: int) -> int | None:
        """Keys in [key, end) that exist at main revision ``at``, without a
        scan; None when only a scan can tell (``at`` too far back).

        The newest count comes from the shards' live_count (bisection).  A
        key exists at ``at`` but not now, or the reverse, only if it changed
        after ``at``; every such change is a memtable record when ``at`` is
        at or above memtable_floor, so those few keys are checked one by one.
        """
        if end is False:
            ki = self.shard_for_key(key).index.get(key)
            return 1 if ki is not None and ki.get(at) is not None else 0
        if end is not None and end <= key:
            return 0
        sids = self.shard_map.shards_for(key, end)
        total = sum(self.shards[sid].live_count(key, end) for sid in sids)
        newest = self.index_rev
        if at >= newest:
            return total
        if at < self.memtable_floor or newest - at > self.COUNT_CORRECTION_REVISIONS:
            return None
        lo, hi = pack(at + 1), pack(newest + 1)
        for sid in sids:
            shard = self.shards[sid]
            checked: set[bytes] = set()
            for _rev, rec in shard.memtable_history(lo, hi):
                k = rec[0]
                if k in checked or k < key or (end is not None and k >= end):
                    continue
                checked.add(k)
                ki = shard.index.get(k)
                if ki is None:
                    continue
                total += (ki.get(at) is not None) - ki.is_live()
        return total

    def _kv(self, ki: KeyIndex, found: tuple[int, int, int]) -> KeyValue:
        mod, created, version = found
        rec = self.shard_for_key(ki.key).record(mod)
        return KeyValue(ki.key, main_of(created), main_of(mod), version, rec[1], rec[4])

    def get_kv(self, key: bytes, at: int) -> KeyValue | None:
        ki = self.shard_for_key(key).index.get(key)
        if ki is None:
            return None
        found = ki.get(at)
        return None if found is None else self._kv(ki, found)

    # ------------------------------------------------------------------
    # low-level mutations (shared by apply and replay)

    def _put_at(self, rev: int, key: bytes, value: bytes, lease: int) -> None:
        shard = self.shard_for_key(key)
        ki = shard.key_index(key)
        last = ki.generations[-1]
        if last.revs:
            created, version = last.created, last.version + 1
        else:
            created, version = rev & ~SUB_MASK, 1  # (main, 0): see Generation.created
            self.keys_live += 1
            if len(ki.generations) > 1:  # a deleted key, put again
                shard.dead.remove(key)
        ki.put(rev)
        self.index_rev = rev >> 32
        shard.active[rev] = (key, value, created, version, lease)
        shard.active_order.append(rev)
        self.lessor.set_key(key, lease)
        if self._changes is not None:
            self._changes.append(Event(EVENT_PUT, KeyValue(key, main_of(created), main_of(rev), version, value, lease)))

    def _delete_at(self, rev: int, key: bytes) -> None:
        shard = self.shard_for_key(key)
        ki = shard.index[key]
        ki.tombstone(rev)
        shard.dead.add(key)
        self.index_rev = rev >> 32
        self.keys_live -= 1
        shard.active[rev] = (key, None, 0, 0, 0)
        shard.active_order.append(rev)
        self.lessor.set_key(key, 0)
        if self._changes is not None:
            self._changes.append(Event(EVENT_DELETE, KeyValue(key, 0, main_of(rev), 0, b"", 0)))

    # ------------------------------------------------------------------
    # reads

    def _check_read_rev(self, rev: int, view: int) -> int:
        if rev > view:
            raise errors.ErrFutureRev.fresh()
        if rev <= 0:
            rev = view
        if rev < self.compact_rev:
            raise errors.ErrCompacted.fresh()
        return rev

    def range(self, r: RangeRequest, view: int) -> RangeResult:
        validation.check_range(r)
        return self._range(r, view)

    def _range(self, r: RangeRequest, view: int) -> RangeResult:
        """etcd's executeRange over the view at revision `view`."""
        rev = self._check_read_rev(r.revision, view)
        at = rev
        end = range_end_bound(r.range_end)
        default_order = r.sort_order == SORT_NONE or (r.sort_target == TARGET_KEY and r.sort_order == SORT_ASCEND)
        filters = r.min_mod_revision or r.max_mod_revision or r.min_create_revision or r.max_create_revision
        limit = r.limit if (default_order and not filters and r.limit > 0) else 0
        fetch = limit + 1 if limit else 0

        if r.count_only:
            total = self._count(r.key, end, at)
            if total is None:
                total = sum(1 for ki in self._key_indexes(r.key, end) if ki.get(at) is not None)
            return RangeResult(view, [], False, total)
        found_list: list[tuple[KeyIndex, tuple[int, int, int]]] = []
        total = self._count(r.key, end, at) if fetch else None
        if total is not None:
            # The count is known: stop scanning once the page is full.
            for ki in self._key_indexes(r.key, end):
                found = ki.get(at)
                if found is not None:
                    found_list.append((ki, found))
                    if len(found_list) >= fetch:
                        break
        else:
            total = 0
            for ki in self._key_indexes(r.key, end):
                found = ki.get(at)
                if found is None:
                    continue
                total += 1
                if not fetch or len(found_list) < fetch:
                    found_list.append((ki, found))
        kvs = [self._kv(ki, f) for ki, f in found_list]

        if r.max_mod_revision:
            kvs = [kv for kv in kvs if kv.mod_revision <= r.max_mod_revision]
        if r.min_mod_revision:
            kvs = [kv for kv in kvs if kv.mod_revision >= r.min_mod_revision]
        if r.max_create_revision:
            kvs = [kv for kv in kvs if kv.create_revision <= r.max_create_revision]
        if r.min_create_revision:
            kvs = [kv for kv in kvs if kv.create_revision >= r.min_create_revision]

        order = r.sort_order
        if r.sort_target != TARGET_KEY and order == SORT_NONE:
            order = SORT_ASCEND
        if not (order == SORT_NONE or (r.sort_target == TARGET_KEY and order == SORT_ASCEND)):
            kvs.sort(key=_SORT_KEYS[r.sort_target], reverse=(order == SORT_DESCEND))

        more = False
        if r.limit > 0 and len(kvs) > r.limit:
            kvs = kvs[: r.limit]
            more = True
        if r.keys_only:
            for kv in kvs:
                kv.value = b""
        return RangeResult(view, kvs, more, total)

    # ------------------------------------------------------------------
    # history (watch catch-up)

    def history(self, key: bytes, end: bytes | None | bool, from_main: int, to_main: int,
                max_records: int) -> tuple[list[Event], int]:
        """Events on [key, end) with main revision in [from_main, to_main],
        in revision order, scanning at most about `max_records` stored
        records (whole revisions only).  Returns the events and the last main
        revision fully covered (from_main - 1 if none was)."""
        lo, hi = pack(from_main), pack(to_main + 1)
        if end is False:
            sids = [self.shard_map.shard_of(key)]
        elif end is not None and end <= key:
            return [], to_main
        else:
            sids = list(self.shard_map.shards_for(key, end))
        streams = [self.shards[sid].history(lo, hi) for sid in sids]
        merged = heapq.merge(*streams, key=lambda item: item[0]) if len(streams) > 1 else streams[0]
        events: list[Event] = []
        scanned = 0
        covered = to_main
        current_main = -1
        for rev, rec in merged:
            m = main_of(rev)
            if m != current_main:
                if scanned >= max_records:
                    covered = current_main
                    break
                current_main = m
            scanned += 1
            k = rec[0]
            if end is False:
                if k != key:
                    continue
            elif k < key or (end is not None and k >= end):
                continue
            if rec[1] is None:
                events.append(Event(EVENT_DELETE, KeyValue(k, 0, m, 0, b"", 0)))
            else:
                events.append(Event(EVENT_PUT, KeyValue(k, main_of(rec[2]), m, rec[3], rec[1], rec[4])))
        for it in streams:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        return events, covered

    def fill_prev_kv(self, ev: Event) -> None:
        """Set ev.prev_kv to the key's value just before the event, as etcd
        does (nothing when that revision is compacted or it is a create)."""
        if ev.prev_done:
            return
        ev.prev_done = True
        if ev.is_create():
            return
        at = ev.kv.mod_revision - 1
        if at < self.compact_rev or at <= 0:
            return
        ev.prev_kv = self.get_kv(ev.kv.key, at)

    # ------------------------------------------------------------------
    # Txn

    def _compare(self, c: Compare, at: int) -> bool:
        end = range_end_bound(c.range_end)
        kvs = [self._kv(ki, f) for ki in self._key_indexes(c.key, end) if (f := ki.get(at)) is not None]
        if not kvs:
            if c.target == CMP_VALUE:
                return False  # a missing key has no value to compare
            return _compare_kv(c, KeyValue(b"", 0, 0, 0, b"", 0))
        return all(_compare_kv(c, kv) for kv in kvs)

    def _path(self, t: TxnRequest, at: int, path: list[bool]) -> None:
        """Evaluate every guard the Txn will take, nested ones included,
        against the state before the Txn (as etcd does)."""
        ok = all(self._compare(c, at) for c in t.compare)
        path.append(ok)
        for op in t.success if ok else t.failure:
            if isinstance(op, TxnRequest):
                self._path(op, at, path)

    def _check_txn_ops(self, t: TxnRequest, at: int, path: list[bool], pos: int, kind: str) -> int:
        """etcd's checkRequests over the branches the Txn will take: errors
        that depend on state, found before any write.  etcd runs it twice,
        first for puts (write Txns only), then for ranges, so a put's error
        wins over a range's."""
        ops = t.success if path[pos] else t.failure
        pos += 1
        for op in ops:
            if isinstance(op, RangeRequest):
                if kind == "range":
                    if op.revision > at:
                        raise errors.ErrFutureRev.fresh()
                    if op.revision and op.revision < self.compact_rev:
                        raise errors.ErrCompacted.fresh()
            elif isinstance(op, PutRequest):
                if kind == "put":
                    if (op.ignore_value or op.ignore_lease) and self.get_kv(op.key, at) is None:
                        raise errors.ErrKeyNotFound.fresh()
                    if op.lease and not self.lessor.exists(op.lease):
                        raise errors.ErrLeaseNotFound.fresh()
            elif isinstance(op, TxnRequest):
                pos = self._check_txn_ops(op, at, path, pos, kind)
        return pos

    def _check_txn(self, t: TxnRequest, at: int, path: list[bool], write: bool) -> None:
        if write:
            self._check_txn_ops(t, at, path, 0, "put")
        self._check_txn_ops(t, at, path, 0, "range")

    def _check_put_state(self, p: PutRequest, at: int) -> None:
        """A top-level Put's state checks, lease first (etcd's order)."""
        if p.lease and not self.lessor.exists(p.lease):
            raise errors.ErrLeaseNotFound.fresh()
        if (p.ignore_value or p.ignore_lease) and self.get_kv(p.key, at) is None:
            raise errors.ErrKeyNotFound.fresh()

    def _execute(self, t: TxnRequest, w: _Write | None, view: int, path: list[bool], pos: int, out: list) -> int:
        ok = path[pos]
        pos += 1
        for op in t.success if ok else t.failure:
            if isinstance(op, RangeRequest):
                out.append(self._range(op, w.read_rev if w else view))
            elif isinstance(op, PutRequest):
                out.append(self._do_put(op, w))
            elif isinstance(op, DeleteRangeRequest):
                out.append(self._do_delete(op, w))
            elif isinstance(op, TxnRequest):
                sub: list = []
                sub_ok = path[pos]
                pos = self._execute(op, w, view, path, pos, sub)
                # etcd leaves a nested Txn's header empty (revision 0).
                out.append(TxnResult(0, sub_ok, sub))
            else:
                out.append(EmptyResult())
        return pos

    def txn_readonly(self, t: TxnRequest, view: int) -> TxnResult:
        """A Txn with no puts or deletes in any branch, served at `view`."""
        validation.check_txn(t, self.max_txn_ops)
        path: list[bool] = []
        self._path(t, view, path)
        self._check_txn(t, view, path, write=False)
        out: list = []
        self._execute(t, None, view, path, 0, out)
        return TxnResult(view, path[0], out)

    def _do_txn(self, t: TxnRequest, enc: BatchEncoder) -> TxnResult:
        validation.check_txn(t, self.max_txn_ops)
        at = self.revision
        path: list[bool] = []
        self._path(t, at, path)
        self._check_txn(t, at, path, write=not validation.txn_writes_nothing(t))
        w = _Write(self, enc)
        out: list = []
        self._execute(t, w, at, path, 0, out)
        rev = w.read_rev
        w.end()
        return TxnResult(rev, path[0], out)

    # ------------------------------------------------------------------
    # single writes

    def _do_put(self, p: PutRequest, w: _Write) -> PutResult:
        prev = None
        if p.ignore_value or p.ignore_lease or p.prev_kv:
            prev = self.get_kv(p.key, w.read_rev)
        value = prev.value if p.ignore_value else p.value
        lease = prev.lease if p.ignore_lease else p.lease
        rev = w.put(p.key, value, lease)
        return PutResult(rev, prev if p.prev_kv else None)

    def _do_delete(self, d: DeleteRangeRequest, w: _Write) -> DeleteRangeResult:
        at = w.read_rev
        end = range_end_bound(d.range_end)
        victims = [ki for ki in self._key_indexes(d.key, end) if ki.get(at) is not None]
        prev_kvs = [self._kv(ki, ki.get(at)) for ki in victims] if d.prev_kv else []
        for ki in victims:
            w.delete(ki.key)
        rev = w.begin + 1 if w.sub else w.begin
        return DeleteRangeResult(rev, len(victims), prev_kvs)

    def _apply_put(self, p: PutRequest, enc: BatchEncoder) -> PutResult:
        validation.check_put(p)
        self._check_put_state(p, self.revision)
        w = _Write(self, enc)
        res = self._do_put(p, w)
        w.end()
        return res

    def _apply_delete(self, d: DeleteRangeRequest, enc: BatchEncoder) -> DeleteRangeResult:
        validation.check_delete(d)
        w = _Write(self, enc)
        res = self._do_delete(d, w)
        w.end()
        return res

    # ------------------------------------------------------------------
    # compaction

    def _apply_compact(self, c: CompactRequest, enc: BatchEncoder) -> CompactResult:
        if c.revision <= self.compact_rev:
            raise errors.ErrCompacted.fresh()
        if c.revision > self.revision:
            raise errors.ErrFutureRev.fresh()
        enc.compact(c.revision)
        self._start_compaction(c.revision)
        return CompactResult(self.revision)

    def _start_compaction(self, rev: int) -> None:
        self.compact_rev = rev
        self._compaction = _Compaction(self, rev)

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
    # leases (bookkeeping; deadlines live in the engine)

    def _apply_lease_grant(self, g: LeaseGrantRequest, enc: BatchEncoder) -> LeaseGrantResult:
        if g.ttl > MAX_LEASE_TTL:
            raise errors.ErrLeaseTTLTooLarge.fresh()
        if g.id in self.lessor.leases:
            raise errors.ErrLeaseExist.fresh()
        self.lessor.grant(g.id, g.ttl)
        enc.lease_grant(g.id, g.ttl)
        return LeaseGrantResult(self.revision, g.id, g.ttl)

    def _apply_lease_revoke(self, r: LeaseRevokeRequest, enc: BatchEncoder) -> LeaseRevokeResult:
        lease = self.lessor.leases.get(r.id)
        if lease is None:
            raise errors.ErrLeaseNotFound.fresh()
        w = _Write(self, enc)
        for key in sorted(lease.keys):
            w.delete(key)
        w.end()
        enc.lease_revoke(r.id)
        self.lessor.remove(r.id)
        return LeaseRevokeResult(self.revision)

    # ------------------------------------------------------------------
    # the batch entry point

    def apply(self, requests: list) -> tuple[list, bytes]:
        """Apply write requests in order.  Returns one result or EtcdError per
        request and the journal payload of their effects (b"" if none)."""
        enc = BatchEncoder()
        results: list = []
        for req in requests:
            try:
                if isinstance(req, PutRequest):
                    results.append(self._apply_put(req, enc))
                elif isinstance(req, TxnRequest):
                    results.append(self._do_txn(req, enc))
                elif isinstance(req, DeleteRangeRequest):
                    results.append(self._apply_delete(req, enc))
                elif isinstance(req, CompactRequest):
                    results.append(self._apply_compact(req, enc))
                elif isinstance(req, LeaseGrantRequest):
                    results.append(self._apply_lease_grant(req, enc))
                elif isinstance(req, LeaseRevokeRequest):
                    results.append(self._apply_lease_revoke(req, enc))
                else:
                    raise TypeError(f"not a write request: {req!r}")
            except errors.EtcdError as e:
                results.append(e)
        return results, enc.finish()

    # ------------------------------------------------------------------
    # recovery

    def replay(self, payload: bytes, *, live: bool = False) -> None:
        """Re-apply one journal payload written by `apply` (or by a leader
        or a mirror: any payload of effects continuing this revision).

        ``live``: the store is serving (a follower applying a replicated
        journal): a compaction record only starts the compaction, whose
        physical steps run between batches as on the leader; in recovery it
        is finished at once."""
        for entry in decode_batch(payload):
            tag = entry[0]
            if tag == "T":
                main, changes = entry[1], entry[2]
                if main != self.revision + 1:
                    raise ValueError(f"journal revision {main} does not follow {self.revision}")
                for sub, change in enumerate(changes):
                    rev = pack(main, sub)
                    if change[0] == PUT:
                        self._put_at(rev, change[1], change[2], change[3])
                    else:
                        self._delete_at(rev, change[1])
                self.revision = main
            elif tag == "C":
                if entry[1] > self.compact_rev:
                    self._start_compaction(entry[1])
                    while not live and not self.compaction_step(1 << 30):
                        pass
            elif tag == "G":
                self.lessor.grant(entry[1], entry[2])
            elif tag == "R":
                self.lessor.remove(entry[1])
            elif tag == "E":
                self.epoch, self.leader_id = entry[1], entry[2]

    def check_continues(self, payload: bytes) -> None:
        """Raise ValueError unless ``payload`` decodes and its revisions
        continue this store's (nothing is applied)."""
        expect = self.revision + 1
        for entry in decode_batch(payload):
            if entry[0] == "T":
                if entry[1] != expect:
                    raise ValueError(f"payload revision {entry[1]} does not follow {expect - 1}")
                expect += 1

    def load_checkpoint(self, revision: int, leases: Iterable[tuple[int, int]], *, compact_rev: int,
                        compaction_finished: bool, epoch: int = 0, leader_id: int = 0) -> None:
        """Take the state a checkpoint recorded (``load_records`` plus its
        revisions); a physical compaction it records as unfinished starts
        again from the beginning."""
        self.load_records(leases)
        self.revision = revision
        self.compact_rev = compact_rev
        self.compact_done_rev = compact_rev if compaction_finished else -1
        self.epoch, self.leader_id = epoch, leader_id
        if not compaction_finished:
            self._start_compaction(compact_rev)

    def load_records(self, leases: Iterable[tuple[int, int]] = ()) -> None:
        """Rebuild every shard's key index from the value store (after a
        checkpoint, the store holds every record not yet compacted) and
        reattach keys to the checkpoint's `leases` ((id, ttl) pairs)."""
        for lease_id, ttl in leases:
            self.lessor.grant(lease_id, ttl)
        self.keys_live = 0
        floor = 0
        for shard in self.shards:
            # Records come in revision order, not key order: collect into a
            # dict and sort once.  A key's newest record comes last, so its
            # lease is the last one seen (no second read per key).
            index: dict[bytes, KeyIndex] = {}
            key_lease: dict[bytes, int] = {}
            for rev_bytes, data in self.backend.scan(shard.id):
                rev = from_bytes(rev_bytes)
                key, deleted, created, version, lease = decode_record_head(data)
                ki = index.get(key)
                if ki is None:
                    ki = index[key] = KeyIndex(key)
                if deleted:
                    ki.tombstone(rev)  # may stand alone: a tombstone kept at the compaction revision
                else:
                    ki.restore(rev, created, version)
                if lease:
                    key_lease[key] = lease
                else:
                    key_lease.pop(key, None)
                floor = rev
            shard.index = SortedDict(index)
            dead = []
            for key, ki in index.items():
                if ki.is_live():
                    self.keys_live += 1
                    lease = key_lease.get(key)
                    if lease:
                        self.lessor.set_key(key, lease)
                else:
                    dead.append(key)
            shard.dead = SortedList(dead)
            self.memtable_floor = self.index_rev = max(self.memtable_floor, main_of(floor))

    # ------------------------------------------------------------------
    # checkpoints

    def checkpoint_cut(self) -> "CheckpointCut":
        """Freeze the memtables; the returned cut describes exactly the state
        as of now and can be encoded and written without the store lock."""
        frozen = []
        deletes = []
        for shard in self.shards:
            if shard.frozen:
                raise RuntimeError("a checkpoint is already in progress")
            shard.frozen, shard.active = shard.active, {}
            shard.frozen_order, shard.active_order = shard.active_order, []
            frozen.append(shard.frozen)
            deletes.append(shard.pending_deletes)
            shard.pending_deletes = []
        leases = sorted((lease.id, lease.ttl) for lease in self.lessor.leases.values())
        self._cut_revision = self.revision
        return CheckpointCut(self.revision, self.compact_rev, self.compact_done_rev if not self.compacting else -1,
                             frozen, deletes, leases, self.epoch, self.leader_id)

    def checkpoint_done(self) -> None:
        for shard in self.shards:
            shard.frozen = {}
            shard.frozen_order = []
        self.memtable_floor = self._cut_revision

    def checkpoint_abort(self, cut: "CheckpointCut") -> None:
        """The cut was not written: serve its records from memory again and
        keep its deletes for the next checkpoint."""
        for sid, shard in enumerate(self.shards):
            dropped = set(shard.pending_deletes)
            merged = {rev: rec for rev, rec in shard.frozen.items() if rev not in dropped}
            merged.update(shard.active)
            shard.active_order = [r for r in shard.frozen_order if r in merged] + shard.active_order
            shard.active = merged
            shard.frozen = {}
            shard.frozen_order = []
            shard.pending_deletes = [r for r in cut.deletes[sid] if r not in merged] + [
                r for r in shard.pending_deletes if r not in merged]

    def memtable_entries(self) -> int:
        return sum(len(s.active) + len(s.frozen) for s in self.shards)

    def keys_total(self) -> int:
        return sum(len(s.index) for s in self.shards)


class CheckpointCut:
    __slots__ = ("revision", "compact_rev", "compact_done_rev", "frozen", "deletes", "leases", "epoch", "leader_id")

    def __init__(self, revision, compact_rev, compact_done_rev, frozen, deletes, leases, epoch=0,
                 leader_id=0) -> None:
        self.revision = revision
        self.compact_rev = compact_rev
        self.compact_done_rev = compact_done_rev
        self.frozen = frozen
        self.deletes = deletes
        self.leases = leases
        self.epoch = epoch
        self.leader_id = leader_id

    def records(self):
        """(shard, revision bytes, encoded record) for every frozen record."""
        for sid, table in enumerate(self.frozen):
            for rev, rec in table.items():
                yield sid, rev.to_bytes(16, "big"), encode_record(rec)

    def deleted(self):
        for sid, revs in enumerate(self.deletes):
            for rev in revs:
                yield sid, rev.to_bytes(16, "big")


class _Compaction:
    """A compaction in bounded steps: walks each shard's keys in order from a
    cursor, so keys created meanwhile are either visited or need no work
    (their revisions are newer than the compaction revision)."""

    __slots__ = ("store", "rev", "shard_pos", "cursor")

    def __init__(self, store: Store, rev: int) -> None:
        self.store = store
        self.rev = rev
        self.shard_pos = 0
        self.cursor: bytes | None = None

    def step(self, budget: int) -> bool:
        shards = self.store.shards
        while self.shard_pos < len(shards):
            shard = shards[self.shard_pos]
            index = shard.index
            if self.cursor is None:
                it = index.irange()
            else:
                it = index.irange(self.cursor, inclusive=(False, True))
            batch = []
            for k in it:
                batch.append(k)
                if len(batch) >= budget:
                    break
            removed: list[int] = []
            for k in batch:
                ki = index[k]
                ki.compact(self.rev, removed)
                if ki.is_empty():
                    del index[k]
                    shard.dead.discard(k)
            for r in removed:
                shard.drop(r)
            budget -= len(batch)
            if len(batch) and budget <= 0:
                self.cursor = batch[-1]
                return False
            self.shard_pos += 1
            self.cursor = None
        return True


def _compare_kv(c: Compare, kv: KeyValue) -> bool:
    operand = c.operand if c.union == _UNION_FOR_TARGET.get(c.target) else None
    t = c.target
    if t == CMP_VALUE:
        a, b = kv.value, operand if operand is not None else b""
    elif t == CMP_CREATE:
        a, b = kv.create_revision, operand or 0
    elif t == CMP_MOD:
        a, b = kv.mod_revision, operand or 0
    elif t == CMP_VERSION:
        a, b = kv.version, operand or 0
    elif t == CMP_LEASE:
        a, b = kv.lease, operand or 0
    else:
        return True
    r = c.result
    if r == CMP_EQUAL:
        return a == b
    if r == CMP_NOT_EQUAL:
        return a != b
    if r == CMP_GREATER:
        return a > b
    if r == CMP_LESS:
        return a < b
    return True
