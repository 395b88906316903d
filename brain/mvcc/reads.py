"""Reads: etcd's Range at a revision (a list in columns, range_columns;
KeyValue objects, execute_range), counts without a scan, the history a
watch catches up from, and an event's prev_kv.

Nothing here changes the store.  Every read names the main revision it
sees: a Range is checked against the `view` the engine passes (the newest
durable revision) and the compaction revision; a write transaction reads at
its own `Write.read_rev` (brain.mvcc.txn), so its Ranges see its writes.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from . import errors
from .packed import KeyHistory
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
    RangeColumns,
    RangeRequest,
    RangeResult,
)
from .revision import SUB_BITS, main_of, pack
from .shard import Shard
from .store_core import StoreCore
from .visibility import Found

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


def key_indexes(store: StoreCore, key: bytes, end: bytes | None | bool) -> Iterator[KeyHistory]:
    """The history of every key in [key, end) in key order (end False: just key)."""
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


def count(store: StoreCore, key: bytes, end: bytes | None | bool, at: int) -> int | None:
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


def key_value(store: StoreCore, ki: KeyHistory, found: tuple[int, int, int]) -> KeyValue:
    """The KeyValue of what ``ki.get`` found (its record read from the shard)."""
    mod, created, version = found
    rec = store.shard_for_key(ki.key).record(mod)
    return KeyValue(ki.key, main_of(created), main_of(mod), version, rec[1], rec[4])


def get_kv(store: StoreCore, key: bytes, at: int) -> KeyValue | None:
    ki = store.shard_for_key(key).get(key)
    if ki is None:
        return None
    found = ki.get(at)
    return None if found is None else key_value(store, ki, found)


def _check_read_rev(store: StoreCore, rev: int, view: int) -> int:
    if rev > view:
        raise errors.ErrFutureRev.fresh()
    if rev <= 0:
        rev = view
    if rev < store.compact_rev:
        raise errors.ErrCompacted.fresh()
    return rev


def _limited_walk(r: RangeRequest) -> bool:
    """etcd applies the limit while it walks the index (limit+1 keys in key
    order, sorted afterwards if a sort target asks) unless the request
    names a sort order or a revision filter."""
    default_order = r.sort_order == SORT_NONE or (r.sort_target == TARGET_KEY and r.sort_order == SORT_ASCEND)
    return default_order and not (r.min_mod_revision or r.max_mod_revision or r.min_create_revision
                                  or r.max_create_revision)


def is_columnar(r: RangeRequest) -> bool:
    """A Range that range_columns reads column by column: in key order, no
    sort, no revision filters (every list the apiserver makes).  Sort
    order NONE with another target sorts too (etcd makes it ascending)."""
    return r.sort_target == TARGET_KEY and _limited_walk(r)


def index_only(r: RangeRequest) -> bool:
    """etcd 3.7's FastKeysOnly: a keys_only Range not sorted by value is
    answered from the key index alone, which holds each key's revisions and
    version but neither its value nor its lease, so its KeyValues carry no
    lease (etcd 3.4 and 3.6 read every record and return the lease: see
    tests/differential/ETCD_BEHAVIOUR.md).  The one rule for every Range:
    unary, inside a Txn and each chunk of a RangeStream."""
    return r.keys_only and r.sort_target != TARGET_VALUE


def range_columns(store: StoreCore, r: RangeRequest, view: int, with_count: bool = True) -> RangeColumns:
    """execute_range answered as columns.  A columnar request
    (``is_columnar``) is read so: no object per key, and for keys_only
    (``index_only``) no record read at all; any other is execute_range's
    result, transposed."""
    if not is_columnar(r):
        return RangeColumns.of(execute_range(store, r, view, with_count))
    rev = _check_read_rev(store, r.revision, view)
    end = range_end_bound(r.range_end)
    if r.count_only:
        return RangeColumns(view, [], [], [], [], None, [], False, _count_at(store, r.key, end, rev))
    return _columns(store, r.key, end, rev, view, r.limit if r.limit > 0 else 0, with_count, not index_only(r))


def _count_at(store: StoreCore, key: bytes, end: bytes | None | bool, at: int) -> int:
    total = count(store, key, end, at)
    if total is None:
        total = sum(1 for ki in key_indexes(store, key, end) if ki.get(at) is not None)
    return total


def _columns(store: StoreCore, key: bytes, end: bytes | None | bool, at: int, view: int, limit: int, with_count: bool,
             values: bool, cut: bool = True) -> RangeColumns:
    """The keys of [key, end) that exist at ``at``, up to ``limit`` (0:
    all), with ``more`` and the count (``with_count`` False: the keys
    collected, as for a RangeStream chunk).  Values and leases are read
    from the records only if ``values``; else the index alone answers
    (``index_only``): no value, and lease 0.  ``cut`` False keeps the one
    key past the limit (read to know ``more``) for a caller that sorts
    before it cuts."""
    fetch = limit + 1 if limit else 0
    total = count(store, key, end, at) if fetch and with_count else None
    # The count known or not wanted: stop once the page is full.  Else
    # every key is collected, to count them.
    room = fetch if (total is not None or not with_count) else 0
    parts: list[tuple[Shard, Found]] = []
    if end is False:
        shard = store.shard_for_key(key)
        found = Found()
        ki = shard.get(key)
        if ki is not None:
            found.add_history(ki, at)
        parts.append((shard, found))
    elif end is None or key < end:
        collected = 0
        for sid in store.shard_map.shards_for(key, end):
            shard, found = store.shards[sid], Found()
            shard.visible(key, end, at, found, room - collected if room else 0)
            parts.append((shard, found))
            collected += len(found.keys)
            if room and collected >= room:
                break
    n = sum(len(f.keys) for _, f in parts)
    if total is None:
        total = n
    more = bool(limit) and n > limit
    keys: list[bytes] = []
    mods: list[int] = []
    created: list[int] = []
    versions: list[int] = []
    leases: list[int] = []
    vals: list[bytes] | None = [] if values else None
    left = (limit if cut else limit + 1) if limit else n
    for shard, f in parts:
        if left <= 0:
            break
        taken = min(left, len(f.keys))
        left -= taken
        keys += f.keys[:taken]
        part_mods = f.mods[:taken]
        mods += part_mods
        created += f.created[:taken]
        versions += f.versions[:taken]
        if vals is not None:
            part_values, part_leases = shard.values_and_leases(part_mods)
            vals += part_values
            leases += part_leases
    if vals is None:
        leases = [0] * len(keys)
    return RangeColumns(view, keys, [c >> SUB_BITS for c in created], [m >> SUB_BITS for m in mods], versions,
                        vals, leases, more, total)


def execute_range(store: StoreCore, r: RangeRequest, view: int, with_count: bool = True) -> RangeResult:
    """etcd's executeRange over the view at revision `view` (the request
    already validated).

    ``with_count`` False is etcd's read without a total count (one chunk of
    a RangeStream): a limited range then stops after limit+1 keys, so it
    costs O(limit) however far the range goes on, and the result's count is
    the number of keys it collected, as etcd's index walk reports it.
    """
    if is_columnar(r):
        cols = range_columns(store, r, view, with_count)
        return RangeResult(cols.revision, cols.key_values(), cols.more, cols.count)
    rev = _check_read_rev(store, r.revision, view)
    end = range_end_bound(r.range_end)
    if r.count_only:
        return RangeResult(view, [], False, _count_at(store, r.key, end, rev))
    # Sorted or filtered: the keys of the range (with the limit, limit+1 of
    # them if etcd limits its walk), then filtered, sorted and cut to the
    # limit; a keys_only range reads records only to sort by value.
    cols = _columns(store, r.key, end, rev, view, r.limit if (_limited_walk(r) and r.limit > 0) else 0,
                    with_count, not index_only(r), cut=False)
    kvs = cols.key_values()
    total = cols.count

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


def history(store: StoreCore, key: bytes, end: bytes | None | bool, from_main: int, to_main: int,
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


def fill_prev_kv(store: StoreCore, ev: Event) -> None:
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
