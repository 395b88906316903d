"""The watch hub's bounds: --max-watchers-per-stream, and a stream whose
client does not read (paused) holds no events: its watchers fall back to
catch-up reads and get every event, in order, once it may send again."""

from __future__ import annotations

import threading

from brain.backend import MemoryBackend
from brain.mvcc.requests import PutRequest
from brain.mvcc.store import Store
from brain.mvcc.watch import ERR_TOO_MANY_WATCHERS, INVALID_WATCH_ID, WatchHub


def _hub(**kw):
    store = Store(MemoryBackend(2), [])
    store.collect_changes()
    return store, WatchHub(store, threading.Lock(), **kw)


def _put(store, hub, key: bytes, value: bytes) -> None:
    store.apply([PutRequest(key, value)])
    hub.route_committed(store.take_changes(), store.revision)


def test_a_create_beyond_max_watchers_per_stream_is_canceled():
    store, hub = _hub(max_watchers_per_stream=2)
    s = hub.open_stream(lambda: None)
    for _ in range(3):
        hub.create(s, b"k", b"", 0, 0)
    out = s.pop_all()
    assert [(r.watch_id, r.created, r.canceled) for r in out] == [(0, True, False), (1, True, False),
                                                                 (INVALID_WATCH_ID, True, True)]
    assert out[2].cancel_reason == ERR_TOO_MANY_WATCHERS == "mvcc: too many watchers on the WatchStream"
    assert hub.creates_refused == 1
    # another stream has its own count
    other = hub.open_stream(lambda: None)
    hub.create(other, b"k", b"", 0, 0)
    assert not other.pop_all()[0].canceled


def test_a_paused_stream_holds_no_events_and_catches_up_in_order():
    store, hub = _hub()
    s = hub.open_stream(lambda: None)
    hub.create(s, b"k", b"\x00", 0, 0)
    s.pop_all()
    hub.pause(s, True)
    for i in range(50):
        _put(store, hub, b"k%02d" % i, b"v" * 1000)
    assert not s.outbox and s.queued_events == 0
    assert hub.statistics() == (1, 1, 1)  # one watcher, unsynced, one stream
    assert hub.moved_to_catch_up == 1
    assert not hub.sync_step()  # paused: no catch-up reads either
    assert not s.outbox
    assert hub.pause(s, False)  # may send again: a watcher waits to catch up
    while hub.sync_step():
        pass
    got = [ev.kv.key for r in s.pop_all() for ev in r.events]
    assert got == [b"k%02d" % i for i in range(50)]
    _put(store, hub, b"k50", b"v")  # synced again: routed at once
    assert [ev.kv.key for r in s.pop_all() for ev in r.events] == [b"k50"]


def test_pop_bytes_takes_about_that_many_bytes():
    store, hub = _hub()
    s = hub.open_stream(lambda: None)
    for w in range(4):
        hub.create(s, b"k%d" % w, b"", 0, w)
    s.pop_all()
    for w in range(4):
        _put(store, hub, b"k%d" % w, b"v" * 1000)
    first = s.pop_bytes(1500)
    assert 1 <= len(first) <= 2 and s.outbox
    rest = s.pop_bytes(1 << 20)
    assert [r.watch_id for r in first + rest] == [0, 1, 2, 3]
    assert s.queued_events == 0
