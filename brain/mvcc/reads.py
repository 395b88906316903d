"""Reads: etcd's Range at a revision, counts without a scan, the history a
watch catches up from, and an event's prev_kv.

Nothing here changes the store.  Every read names the main revision it
sees: a Range is checked against the `view` the engine passes (the newest
durable revision) and the compaction revision; a write transaction reads at
its own `Write.read_rev` (brain.mvcc.txn), so its Ranges see its writes.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterator

from . import errors
from .key_index import KeyIndex
from .requests import (
    EVENT_DELETE,
    EVENT_PUT,
    SORT_ASCEND,
    SORT_DESCEND,
    SORT_NONE,
    TARGET_CREATE,
    TARGET_KEY,
    TARGET_MOD,
    TARGET_VALUE,
    TARGET_VERSION,
    Event,
    KeyValue,
    RangeRequest,
    RangeResult,
)
from .revision import main_of, pack

if TYPE_CHECKING:
    from .store import Store

# Counting at an older revision corrects the newest count with the keys
# changed since; beyond this many revisions a scan is cheaper.
COUNT_CORRECTION_REVISIONS = 4096

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


def key_indexes(store: Store, key: bytes, end: bytes | None | bool) -> Iterator[KeyIndex]:
    """KeyIndex objects for [key, end) in key order (end False: just key)."""
    if end is False:
        ki = store.shard_for_key(key).get(key)
        if ki is not None:
            yield ki
        return
    if end is not None and end <= key:
        return
    shards = store.shards
    for sid in store.shard_map.shards_for(key, end):
        yield from shards[sid].key_indexes(key, end)


def count(store: Store, key: bytes, end: bytes | None | bool, at: int) -> int | None:
    """Keys in [key, end) that exist at main revision ``at``, without a
    scan; None when only a scan can tell (``at`` too far back).

    The newest count comes from the shards' live_count (bisection).  A
    key exists at ``at`` but not now, or the reverse, only if it changed
    after ``at``; every such change is a memtable record when ``at`` is
    at or above memtable_floor, so those few keys are checked one by one.
    """
    if end is False:
        ki = store.shard_for_key(key).get(key)
        return 1 if ki is not None and ki.get(at) is not None else 0
    if end is not None and end <= key:
        return 0
    sids = store.shard_map.shards_for(key, end)
    total = sum(store.shards[sid].live_count(key, end) for sid in sids)
    newest = store.index_rev
    if at >= newest:
        return total
    if at < store.memtable_floor or newest - at > COUNT_CORRECTION_REVISIONS:
        return None
    lo, hi = pack(at + 1), pack(newest + 1)
    for sid in sids:
        shard = store.shards[sid]
        checked: set[bytes] = set()
        for _rev, rec in shard.memtable_history(lo, hi):
            k = rec[0]
            if k in checked or k < key or (end is not None and k >= end):
                continue
            checked.add(k)
            ki = shard.get(k)
            if ki is None:
                continue
            total += (ki.get(at) is not None) - ki.is_live()
    return total


def key_value(store: Store, ki: KeyIndex, found: tuple[int, int, int]) -> KeyValue:
    """The KeyValue of what ``ki.get`` found (its record read from the shard)."""
    mod, created, version = found
    rec = store.shard_for_key(ki.key).record(mod)
    return KeyValue(ki.key, main_of(created), main_of(mod), version, rec[1], rec[4])


def get_kv(store: Store, key: bytes, at: int) -> KeyValue | None:
    ki = store.shard_for_key(key).get(key)
    if ki is None:
        return None
    found = ki.get(at)
    return None if found is None else key_value(store, ki, found)


def _check_read_rev(store: Store, rev: int, view: int) -> int:
    if rev > view:
        raise errors.ErrFutureRev.fresh()
    if rev <= 0:
        rev = view
    if rev < store.compact_rev:
        raise errors.ErrCompacted.fresh()
    return rev


def execute_range(store: Store, r: RangeRequest, view: int) -> RangeResult:
    """etcd's executeRange over the view at revision `view` (the request
    already validated)."""
    rev = _check_read_rev(store, r.revision, view)
    at = rev
    end = range_end_bound(r.range_end)
    default_order = r.sort_order == SORT_NONE or (r.sort_target == TARGET_KEY and r.sort_order == SORT_ASCEND)
    filters = r.min_mod_revision or r.max_mod_revision or r.min_create_revision or r.max_create_revision
    limit = r.limit if (default_order and not filters and r.limit > 0) else 0
    fetch = limit + 1 if limit else 0

    if r.count_only:
        total = count(store, r.key, end, at)
        if total is None:
            total = sum(1 for ki in key_indexes(store, r.key, end) if ki.get(at) is not None)
        return RangeResult(view, [], False, total)
    found_list: list[tuple[KeyIndex, tuple[int, int, int]]] = []
    total = count(store, r.key, end, at) if fetch else None
    if total is not None:
        # The count is known: stop scanning once the page is full.
        for ki in key_indexes(store, r.key, end):
            found = ki.get(at)
            if found is not None:
                found_list.append((ki, found))
                if len(found_list) >= fetch:
                    break
    else:
        total = 0
        for ki in key_indexes(store, r.key, end):
            found = ki.get(at)
            if found is None:
                continue
            total += 1
            if not fetch or len(found_list) < fetch:
                found_list.append((ki, found))
    kvs = [key_value(store, ki, f) for ki, f in found_list]

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


def history(store: Store, key: bytes, end: bytes | None | bool, from_main: int, to_main: int,
            max_records: int) -> tuple[list[Event], int]:
    """Events on [key, end) with main revision in [from_main, to_main],
    in revision order, scanning at most about `max_records` stored
    records (whole revisions only).  Returns the events and the last main
    revision fully covered (from_main - 1 if none was)."""
    lo, hi = pack(from_main), pack(to_main + 1)
    if end is False:
        sids = [store.shard_map.shard_of(key)]
    elif end is not None and end <= key:
        return [], to_main
    else:
        sids = list(store.shard_map.shards_for(key, end))
    streams = [store.shards[sid].history(lo, hi) for sid in sids]
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


def fill_prev_kv(store: Store, ev: Event) -> None:
    """Set ev.prev_kv to the key's value just before the event, as etcd
    does (nothing when that revision is compacted or it is a create)."""
    if ev.prev_done:
        return
    ev.prev_done = True
    if ev.is_create():
        return
    at = ev.kv.mod_revision - 1
    if at < store.compact_rev or at <= 0:
        return
    ev.prev_kv = get_kv(store, ev.kv.key, at)
