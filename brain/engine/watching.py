"""Watch plumbing around the pure hub: locks, the catch-up thread, the
progress-notify ticker, and stream handles the api layer reads from.

Lock order: the hub lock, then the store lock (inside the hub).  The
committer calls `publish_committed` after it has released the store lock.
"""

from __future__ import annotations

import threading
import time

from ..mvcc.watch import DEFAULT_MAX_WATCHERS_PER_STREAM, WatchHub, WatchResponse
from ..thread_names import name_os_thread

DEFAULT_PROGRESS_INTERVAL = 600.0  # etcd's --watch-progress-notify-interval


class WatchStreamHandle:
    """One client stream, as the api layer sees it."""

    def __init__(self, manager: "WatchManager", wakeup=None) -> None:
        self._m = manager
        self._cond = threading.Condition(manager.lock)
        notify = self._cond.notify_all
        if wakeup is not None:
            # An event-driven reader (no thread blocked in get): ``wakeup()``
            # is called with the hub lock held, possibly on the committer
            # thread, whenever responses are ready; it must only schedule
            # a non-blocking ``get(0)``, never take the hub lock itself.
            def notify() -> None:
                self._cond.notify_all()
                wakeup()
        with manager.lock:
            self._stream = manager.hub.open_stream(notify)

    def create(self, key: bytes, range_end: bytes = b"", start_revision: int = 0, watch_id: int = 0,
               prev_kv: bool = False, no_put: bool = False, no_delete: bool = False,
               progress_notify: bool = False, fragment: bool = False) -> None:
        with self._m.lock:
            if self._stream.closed:
                return
            self._m.hub.create(self._stream, key, range_end, start_revision, watch_id, prev_kv,
                               no_put, no_delete, progress_notify, fragment)
            if self._m.hub.unsynced:
                self._m.kick()

    def refuse(self, reason: str) -> None:
        """Answer a create request with a cancel (WatchHub.refuse)."""
        with self._m.lock:
            if not self._stream.closed:
                self._m.hub.refuse(self._stream, reason)

    def cancel(self, watch_id: int) -> None:
        with self._m.lock:
            if not self._stream.closed:
                self._m.hub.cancel(self._stream, watch_id)

    def request_progress(self) -> None:
        with self._m.lock:
            if not self._stream.closed:
                self._m.hub.request_progress(self._stream)

    def get(self, timeout: float | None = None, max_bytes: int | None = None) -> list[WatchResponse] | None:
        """Wait for responses; None once the stream is closed.  ``max_bytes``:
        take only the oldest ones, about that many bytes of keys and values
        (at least one); the rest wait for the next call."""
        with self._m.lock:
            s = self._stream
            if not s.outbox and not s.closed:
                self._cond.wait(timeout)
            if s.closed:
                return None
            items = s.pop_all() if max_bytes is None else s.pop_bytes(max_bytes)
            if items and self._m.hub.consumed(s):
                self._m.kick()
            return items

    def pending(self) -> bool:
        """Responses are waiting to be taken."""
        with self._m.lock:
            return bool(self._stream.outbox)

    def pause(self, paused: bool) -> None:
        """The reader cannot send now (its client does not read): route the
        stream nothing until it can again (brain.mvcc.watch, "paused")."""
        with self._m.lock:
            if self._stream.closed:
                return
            if self._m.hub.pause(self._stream, paused):
                self._m.kick()

    def close(self) -> None:
        with self._m.lock:
            if not self._stream.closed:
                self._m.hub.close_stream(self._stream)


class WatchManager:
    def __init__(self, store, store_lock, *, progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
                 max_queued_events: int = 20_000, max_watchers_per_stream: int = DEFAULT_MAX_WATCHERS_PER_STREAM) -> None:
        self.lock = threading.Lock()
        self.hub = WatchHub(store, store_lock, max_queued_events=max_queued_events,
                            max_watchers_per_stream=max_watchers_per_stream)
        self.progress_interval = progress_interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="brain-watch-sync", daemon=True)
        self._thread.start()

    def open_stream(self, wakeup=None) -> WatchStreamHandle:
        return WatchStreamHandle(self, wakeup)

    def publish_committed(self, events, new_rev: int) -> None:
        """The committer's entry: a committed batch's events routed by the
        hub, and the catch-up thread woken when a watcher fell behind."""
        with self.lock:
            self.hub.route_committed(events, new_rev)
            pending = bool(self.hub.unsynced)
        if pending:
            self.kick()

    def kick(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        name_os_thread()  # else it keeps the OS name of the thread that started it
        next_tick = time.monotonic() + self.progress_interval
        while not self._stop.is_set():
            now = time.monotonic()
            with self.lock:
                busy = bool(self.hub.unsynced)
            self._wake.wait(min(0.05 if busy else 1.0, max(0.0, next_tick - now)))
            self._wake.clear()
            if self._stop.is_set():
                return
            more = True
            while more and not self._stop.is_set():
                with self.lock:
                    more = self.hub.sync_step()
            if time.monotonic() >= next_tick:
                with self.lock:
                    self.hub.progress_tick()
                next_tick = time.monotonic() + self.progress_interval

    def statistics(self) -> tuple[int, int, int]:
        with self.lock:
            return self.hub.statistics()

    def limit_statistics(self) -> dict[str, int]:
        """Events waiting in the streams' outboxes, and the limits hit:
        creates refused (--max-watchers-per-stream), watchers moved to
        catch-up reads (their stream full, or not read)."""
        with self.lock:
            hub = self.hub
            return {"pending_events": hub.pending_events(), "creates_refused": hub.creates_refused,
                    "moved_to_catch_up": hub.moved_to_catch_up}

    def close_streams(self) -> None:
        """End every open stream (their RPCs return); used on shutdown so
        clients move on at once instead of waiting out the grace period."""
        with self.lock:
            for s in list(self.hub.streams):
                self.hub.close_stream(s)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        with self.lock:
            for s in list(self.hub.streams):
                self.hub.close_stream(s)
