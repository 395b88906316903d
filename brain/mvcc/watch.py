"""The watch hub: which watcher gets which event, in what order.

Every watcher is either *synced* (it has been handed every event up to the
hub's revision, and new events are routed to it as they commit) or
*unsynced* (it still has history to read, from `next_rev` on).  A new watcher
starting at an old revision begins unsynced; a synced watcher whose stream
has too many undelivered events (--watch-queue-events), or whose stream is
*paused* (the server cannot send to it: its client does not read), becomes
unsynced, so a slow consumer never holds up a commit or another watcher and
its memory stays bounded: it later catches up from the store's history
(records by revision, in memory and in the value store), exactly like a
watcher that started in the past, once its stream may send again.

A stream has at most --max-watchers-per-stream watchers; a create beyond
is refused as etcd refuses a create (created and canceled, watch_id -1),
with ``ERR_TOO_MANY_WATCHERS``.

Ordering invariants, per stream (a stream's responses leave in outbox order):
  * a watcher's events are queued in revision order, each revision's events
    of one Txn in one response;
  * a progress response (watch_id -1) at revision R is queued only when every
    watcher of the stream is synced, i.e. after every event <= R of every
    watcher is already in the outbox (a request that cannot be answered yet
    is answered as soon as it can, where etcd drops it).  So progress
    can never overtake an event (the bug of kine #731 / etcd #15220).

The hub does no I/O and starts no threads.  The engine calls it with the
hub lock held; store reads happen under `store_lock`, always taken after the
hub lock (lock order: hub -> store).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .requests import EVENT_DELETE, EVENT_PUT, Event

ERR_EMPTY_RANGE = "mvcc: watcher range is empty"
ERR_DUPLICATE_ID = "mvcc: duplicate watch ID provided on the WatchStream"
# brain's own (--max-watchers-per-stream; etcd has no such limit), worded as etcd's
ERR_TOO_MANY_WATCHERS = "mvcc: too many watchers on the WatchStream"
INVALID_WATCH_ID = -1
DEFAULT_MAX_WATCHERS_PER_STREAM = 10_000


@dataclass(slots=True)
class WatchResponse:
    watch_id: int
    revision: int
    events: list = field(default_factory=list)
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""
    fragment: bool = False  # the watcher asked for fragmenting (the api splits)
    prev_kv: bool = False  # the watcher asked for prev_kv on its events


class Watcher:
    __slots__ = ("id", "stream", "key", "end", "start_rev", "min_rev", "next_rev", "synced", "prev_kv",
                 "no_put", "no_delete", "progress_notify", "idle", "fragment", "group", "compacted")

    def __init__(self, wid, stream, key, end, start_rev, prev_kv, no_put, no_delete, progress_notify, fragment):
        self.id = wid
        self.stream = stream
        self.key = key
        self.end = end  # False: one key; None: no upper bound; bytes: exclusive end
        self.start_rev = start_rev  # as requested (0: from now on)
        self.min_rev = start_rev  # synced: first revision to deliver
        self.next_rev = start_rev  # unsynced: first revision not yet read
        self.synced = False
        self.prev_kv = prev_kv
        self.no_put = no_put
        self.no_delete = no_delete
        self.progress_notify = progress_notify
        self.idle = True  # no events sent since the last progress tick
        self.fragment = fragment
        self.group = (key, end)
        # Canceled by the server for compaction.  Like etcd, the stream keeps
        # the id until the client cancels it: a later Cancel is answered and
        # the id cannot be reused.  It gets no more events, so it does not
        # hold up progress responses.
        self.compacted = False

    def matches(self, key: bytes) -> bool:
        end = self.end
        if end is False:
            return key == self.key
        return key >= self.key and (end is None or key < end)

    def wants(self, ev: Event) -> bool:
        return not ((self.no_put and ev.type == EVENT_PUT) or (self.no_delete and ev.type == EVENT_DELETE))


class Stream:
    """One client Watch stream: its watchers and the outbox of responses.

    ``paused``: the server cannot send to it now (its transport queue is
    full: the client does not read); it is routed no events and its
    watchers do not catch up until it may send again."""

    __slots__ = ("watchers", "next_id", "outbox", "queued_events", "progress_pending", "closed", "wakeup", "paused")

    def __init__(self, wakeup) -> None:
        self.watchers: dict[int, Watcher] = {}
        self.next_id = 0
        self.outbox: deque[WatchResponse] = deque()
        self.queued_events = 0
        self.progress_pending = False
        self.closed = False
        self.paused = False
        self.wakeup = wakeup  # called (hub lock held) when the outbox gains items

    def push(self, resp: WatchResponse) -> None:
        self.outbox.append(resp)
        self.queued_events += len(resp.events)
        self.wakeup()

    def pop_all(self) -> list[WatchResponse]:
        items = list(self.outbox)
        self.outbox.clear()
        self.queued_events = 0
        return coalesce(items)

    def pop_bytes(self, max_bytes: int) -> list[WatchResponse]:
        """The oldest responses whose events' keys and values add up to
        ``max_bytes`` (at least one response), coalesced; the rest stay."""
        outbox = self.outbox
        if not outbox:
            return []
        items = []
        size = events = 0
        while outbox and (not items or size < max_bytes):
            r = outbox.popleft()
            items.append(r)
            events += len(r.events)
            size += RESPONSE_OVERHEAD + sum(event_size(ev) for ev in r.events)
        self.queued_events -= events
        return coalesce(items)


# What a response costs on the wire besides its events' keys and values
# (header, ids, framing): an estimate, for pop_bytes.
RESPONSE_OVERHEAD = 64


def event_size(ev: Event) -> int:
    """An event's keys and values, what its encoding grows with."""
    kv, prev = ev.kv, ev.prev_kv
    n = len(kv.key) + len(kv.value)
    if prev is not None:
        n += len(prev.key) + len(prev.value)
    return n


# Most events one coalesced response carries (etcd batches at most 1000
# revisions per response when a watcher catches up), and most bytes of
# keys and values (a response is one gRPC message, written whole).
COALESCE_MAX_EVENTS = 1000
COALESCE_MAX_BYTES = 1 << 20


def coalesce(items: list[WatchResponse], max_events: int = COALESCE_MAX_EVENTS,
             max_bytes: int = COALESCE_MAX_BYTES) -> list[WatchResponse]:
    """Merge each watcher's event responses that wait in the outbox together.

    Routing makes one response per watcher per revision; when a stream is
    backlogged its outbox holds many per watcher, and every response costs
    a gRPC message (the dominant cost of a fan-out).  A watcher's later
    events are appended to its earlier response, whose header revision
    becomes the later one's, as when etcd sends a catching-up watcher many
    revisions at once.  Nothing moves across a response that is not plain
    events (created, canceled, progress): for example, with outbox

        [w1@5, w2@5, w1@6, progress@6, w1@7]

    the result is [w1@6 (events of 5 and 6), w2@5, progress@6, w1@7]: every
    event still precedes the progress response that vouches for it, and no
    event of revision 7 moves before it.
    """
    if len(items) < 2:
        return items
    out: list[WatchResponse] = []
    open_at: dict[int, int] = {}  # watch_id -> index in `out` that can take more events
    copied: set[int] = set()  # indexes of `out` that hold a private copy
    sizes: dict[int, int] = {}  # index in `out` -> its events' bytes
    for r in items:
        if not r.events or r.created or r.canceled or r.compact_revision or r.cancel_reason:
            open_at.clear()  # a barrier
            out.append(r)
            continue
        size = sum(event_size(ev) for ev in r.events)
        i = open_at.get(r.watch_id)
        if i is not None:
            m = out[i]
            if len(m.events) + len(r.events) <= max_events and sizes[i] + size <= max_bytes:
                if i not in copied:
                    m = out[i] = WatchResponse(m.watch_id, m.revision, list(m.events), fragment=m.fragment,
                                               prev_kv=m.prev_kv)
                    copied.add(i)
                m.events.extend(r.events)
                m.revision = r.revision
                sizes[i] += size
                continue
        open_at[r.watch_id] = len(out)
        sizes[len(out)] = size
        out.append(r)
    return out


class WatchHub:
    def __init__(self, store, store_lock, *, max_queued_events: int = 20_000, sync_batch_records: int = 5_000,
                 max_watchers_per_stream: int = DEFAULT_MAX_WATCHERS_PER_STREAM) -> None:
        self.store = store
        self.store_lock = store_lock
        self.max_queued_events = max_queued_events
        self.max_watchers_per_stream = max_watchers_per_stream
        # limits hit (metrics): creates refused, watchers moved to catch-up
        # because their stream was full or paused
        self.creates_refused = 0
        self.moved_to_catch_up = 0
        self.resume_below = max_queued_events // 2
        self.sync_batch_records = sync_batch_records
        self.rev = store.revision  # every event <= rev has been routed
        self.keyed: dict[bytes, set[Watcher]] = {}
        self.ranged: dict[tuple, set[Watcher]] = {}
        self.unsynced: set[Watcher] = set()
        self.streams: set[Stream] = set()
        self.events_routed = 0

    # ------------------------------------------------------------------
    # membership

    def open_stream(self, wakeup) -> Stream:
        s = Stream(wakeup)
        self.streams.add(s)
        return s

    def close_stream(self, s: Stream) -> None:
        for w in list(s.watchers.values()):
            self._remove(w)
        s.watchers.clear()
        s.closed = True
        s.outbox.clear()
        self.streams.discard(s)
        s.wakeup()

    def _add_synced(self, w: Watcher) -> None:
        w.synced = True
        if w.end is False:
            self.keyed.setdefault(w.key, set()).add(w)
        else:
            self.ranged.setdefault(w.group, set()).add(w)

    def _remove_synced(self, w: Watcher) -> None:
        table, k = (self.keyed, w.key) if w.end is False else (self.ranged, w.group)
        ws = table.get(k)
        if ws is not None:
            ws.discard(w)
            if not ws:
                del table[k]
        w.synced = False

    def _remove(self, w: Watcher) -> None:
        if w.synced:
            self._remove_synced(w)
        else:
            self.unsynced.discard(w)

    def refuse(self, s: Stream, reason: str) -> None:
        """A create request refused before it became a watcher (etcd's
        permission check): created and canceled at once, with the reason."""
        s.push(WatchResponse(INVALID_WATCH_ID, self.rev, created=True, canceled=True, cancel_reason=reason))

    def create(self, s: Stream, key: bytes, range_end: bytes, start_rev: int, watch_id: int,
               prev_kv: bool = False, no_put: bool = False, no_delete: bool = False,
               progress_notify: bool = False, fragment: bool = False) -> None:
        """Add a watcher; its `created` response is queued first."""
        if not key:
            key = b"\x00"
        end: bytes | None | bool
        if not range_end:
            end = False
        elif range_end == b"\x00":
            end = None
        else:
            end = range_end
            if key >= end:
                s.push(WatchResponse(INVALID_WATCH_ID, self.rev, created=True, canceled=True,
                                     cancel_reason=ERR_EMPTY_RANGE))
                return
        if watch_id == 0:  # etcd's AutoWatchID
            while s.next_id in s.watchers:
                s.next_id += 1
            watch_id = s.next_id
            s.next_id += 1
        elif watch_id in s.watchers:
            s.push(WatchResponse(INVALID_WATCH_ID, self.rev, created=True, canceled=True,
                                 cancel_reason=ERR_DUPLICATE_ID))
            return
        if len(s.watchers) >= self.max_watchers_per_stream:
            self.creates_refused += 1
            s.push(WatchResponse(INVALID_WATCH_ID, self.rev, created=True, canceled=True,
                                 cancel_reason=ERR_TOO_MANY_WATCHERS))
            return
        w = Watcher(watch_id, s, key, end, start_rev, prev_kv, no_put, no_delete, progress_notify, fragment)
        s.watchers[watch_id] = w
        s.push(WatchResponse(watch_id, self.rev, created=True, fragment=fragment))
        if start_rev == 0 or start_rev > self.rev or 0 > start_rev >= self.store.compact_rev:
            # A negative start that is not below the compaction revision
            # reads no history and gets every new event (etcd 3.4-3.6).
            w.min_rev = max(start_rev, self.rev + 1)
            self._add_synced(w)
        else:
            w.next_rev = start_rev
            self.unsynced.add(w)

    def cancel(self, s: Stream, watch_id: int) -> bool:
        w = s.watchers.pop(watch_id, None)
        if w is None:
            return False  # etcd answers nothing for an unknown id
        self._remove(w)
        s.push(WatchResponse(watch_id, self.rev, canceled=True))
        self._maybe_progress(s)
        return True

    # ------------------------------------------------------------------
    # progress

    def request_progress(self, s: Stream) -> None:
        s.progress_pending = True
        self._maybe_progress(s)

    def _maybe_progress(self, s: Stream) -> None:
        if not s.progress_pending:
            return
        rev = self.rev
        for w in s.watchers.values():
            if not w.synced and not w.compacted:  # a compacted watcher gets no more events
                return
        s.progress_pending = False
        s.push(WatchResponse(INVALID_WATCH_ID, rev))

    def progress_tick(self) -> None:
        """The --watch-progress-notify-interval tick: an empty response to every
        progress_notify watcher that got no events since the last tick."""
        rev = self.rev
        for s in self.streams:
            if s.paused:
                continue  # optional, and it could not be sent: none piles up
            for w in s.watchers.values():
                if not w.progress_notify:
                    continue
                if w.idle and w.synced:
                    s.push(WatchResponse(w.id, rev))
                w.idle = True

    # ------------------------------------------------------------------
    # routing committed events

    def _deliver(self, w: Watcher, rev: int, events: list[Event]) -> None:
        if w.prev_kv:
            with self.store_lock:
                for ev in events:
                    if not ev.prev_done:
                        self.store.fill_prev_kv(ev)
        w.idle = False
        self.events_routed += len(events)
        w.stream.push(WatchResponse(w.id, rev, events, fragment=w.fragment, prev_kv=w.prev_kv))

    def route_committed(self, events: list[Event], new_rev: int) -> None:
        """Route the events of revisions (self.rev, new_rev], all committed,
        to the synced watchers that want them; one too far behind becomes
        unsynced, to catch up from history."""
        i, n = 0, len(events)
        while i < n:
            rev = events[i].kv.mod_revision
            j = i
            while j < n and events[j].kv.mod_revision == rev:
                j += 1
            per: dict[Watcher, list[Event]] = {}
            for ev in events[i:j]:
                key = ev.kv.key
                ws = self.keyed.get(key)
                if ws:
                    for w in ws:
                        if w.wants(ev):
                            per.setdefault(w, []).append(ev)
                for (start, end), ws in self.ranged.items():
                    if key >= start and (end is None or key < end):
                        for w in ws:
                            if w.wants(ev):
                                per.setdefault(w, []).append(ev)
            for w, evs in per.items():
                if rev < w.min_rev:
                    continue
                s = w.stream
                if s.paused or s.queued_events >= self.max_queued_events:
                    # Too far behind, or not read: stop routing, read from
                    # history later.
                    self._remove_synced(w)
                    w.next_rev = rev
                    self.unsynced.add(w)
                    self.moved_to_catch_up += 1
                    continue
                self._deliver(w, rev, evs)
            i = j
        self.rev = new_rev
        for s in self.streams:
            if s.progress_pending:
                self._maybe_progress(s)

    # ------------------------------------------------------------------
    # catching up

    def sync_step(self) -> bool:
        """Advance unsynced watchers by at most one history batch each.
        Returns True when work remains that can proceed now."""
        if not self.unsynced:
            return False
        more = False
        store = self.store
        for w in list(self.unsynced):
            s = w.stream
            if s.paused or s.queued_events > self.resume_below:
                continue  # its consumer is still behind; try again later
            with self.store_lock:
                compact = store.compact_rev
                if w.next_rev < compact:
                    self.unsynced.discard(w)
                    w.compacted = True
                    s.push(WatchResponse(w.id, 0, compact_revision=compact, canceled=True))
                    continue
                events, covered = store.history(w.key, w.end, w.next_rev, self.rev, self.sync_batch_records)
                events = [ev for ev in events if w.wants(ev)]
                if w.prev_kv:
                    for ev in events:
                        store.fill_prev_kv(ev)
            if events:
                w.idle = False
                self.events_routed += len(events)
                s.push(WatchResponse(w.id, self.rev, events, fragment=w.fragment, prev_kv=w.prev_kv))
            w.next_rev = covered + 1
            if w.next_rev > self.rev:
                self.unsynced.discard(w)
                self._add_synced(w)
                self._maybe_progress(s)
            else:
                more = True
        return more

    def pause(self, s: Stream, paused: bool) -> bool:
        """The stream cannot send (``paused``), or can again; True when it
        can and a watcher of it is waiting to catch up (the engine then
        runs sync_step)."""
        s.paused = paused
        return not paused and self.consumed(s)

    def consumed(self, s: Stream) -> bool:
        """The stream's consumer drained its outbox; True if a watcher of it
        is waiting to catch up (the engine then runs sync_step)."""
        return any(not w.synced for w in s.watchers.values())

    def statistics(self) -> tuple[int, int, int]:
        """(watchers, unsynced watchers, streams)."""
        synced = sum(len(v) for v in self.keyed.values()) + sum(len(v) for v in self.ranged.values())
        return synced + len(self.unsynced), len(self.unsynced), len(self.streams)

    def pending_events(self) -> int:
        """Events queued on every stream and not yet taken by its reader."""
        return sum(s.queued_events for s in self.streams)
