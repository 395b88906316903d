"""Automatic compaction, with etcd's two modes and timings.

periodic (retention a duration, e.g. "1h", "30m", or a bare number of hours):
  the revision is sampled every min(retention, 1h)/10; once `retention` has
  passed, the server compacts to the oldest sample still in the window (the
  revision current `retention` ago), then again every min(retention, 1h).
revision (retention a count): every 5 minutes, compact to current - retention.

Retention "0" turns it off.  The compactor only decides *what* to compact;
the compaction itself is an ordinary Compact request through the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from .. import go_duration
from ..mvcc import errors
from ..mvcc.requests import CompactRequest
from ..thread_names import name_os_thread

log = logging.getLogger("brain.compactor")

REVISION_MODE_INTERVAL = 300.0


def parse_retention(mode: str, retention: str) -> float:
    """Seconds (periodic) or a revision count (revision); 0 disables.
    The one parser of --auto-compaction-retention: brain.config checks the
    flag with it, the engine parses it once when it starts."""
    text = retention
    retention = retention.strip()
    if mode == "revision":
        try:
            n = int(retention)
        except ValueError:
            raise ValueError(f"--auto-compaction-retention {text!r}: revision mode needs a whole number") from None
        if n < 0:
            raise ValueError(f"--auto-compaction-retention must not be negative, got {text!r}")
        return n
    if mode != "periodic":
        raise ValueError(f"unknown --auto-compaction-mode {mode!r} (periodic or revision)")
    try:
        return float(int(retention)) * 3600.0  # a bare number means hours, as in etcd
    except ValueError:
        pass
    try:
        seconds = go_duration.seconds(retention)
    except go_duration.DurationError as e:
        raise ValueError(f"invalid --auto-compaction-retention {text!r}: {e}") from None
    if seconds < 0:
        raise ValueError(f"--auto-compaction-retention must not be negative, got {text!r}")
    return seconds


class PeriodicPlanner:
    """The periodic mode's decisions, driven by explicit times (testable)."""

    def __init__(self, period: float, now: float) -> None:
        self.period = period
        self.compact_every = min(period, 3600.0)
        self.tick = self.compact_every / 10
        self.samples: deque[int] = deque(maxlen=int(period / self.tick) + 1)
        self.last_success = now
        self.base = period
        self.last_rev = 0

    def sample(self, rev: int) -> None:
        self.samples.append(rev)

    def due(self, now: float) -> int | None:
        if not self.samples:
            return None
        rev = self.samples[0]
        if now - self.last_success < self.base or rev == self.last_rev:
            return None
        return rev

    def done(self, rev: int, now: float) -> None:
        self.base = self.compact_every
        self.last_rev = rev
        self.last_success = now


class Compactor:
    def __init__(self, mode: str, amount: float, current_revision: Callable[[], int],
                 compact: Callable[[CompactRequest], object]) -> None:
        """``amount``: the retention as parse_retention gives it."""
        self.mode = mode
        self.amount = amount
        self._rev = current_revision
        self._compact = compact
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.amount > 0

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._loop, name="brain-compactor", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop deciding compactions; ``wait``: until the thread is gone (not
        from a thread its compaction request may be waiting for)."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join()

    def _try(self, rev: int) -> bool:
        started = time.monotonic()
        try:
            self._compact(CompactRequest(rev))
        except errors.EtcdError as e:
            if e != errors.ErrCompacted:
                log.warning("auto compaction at revision %d failed: %s", rev, e.message)
                return False
        log.info("auto compaction (%s) at revision %d took %.3fs", self.mode, rev, time.monotonic() - started)
        return True

    def _loop(self) -> None:
        name_os_thread()  # else it keeps the OS name of the thread that started it
        if self.mode == "revision":
            last = 0
            while not self._stop.wait(REVISION_MODE_INTERVAL):
                rev = self._rev() - int(self.amount)
                if rev > 0 and rev != last and self._try(rev):
                    last = rev
            return
        planner = PeriodicPlanner(self.amount, time.monotonic())
        while True:
            planner.sample(self._rev())
            if self._stop.wait(planner.tick):
                return
            rev = planner.due(time.monotonic())
            if rev is not None and self._try(rev):
                planner.done(rev, time.monotonic())
