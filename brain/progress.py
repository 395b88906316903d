"""Progress lines for long operations (import, export, mirror catch-up).

A `Progress` is fed absolute counters (items and bytes done) as work goes
on and prints at most one line per `interval` seconds, plus a last line
when done:

    import: 412,000 revisions, 180.2 MB of 410.0 MB (44%), 61.5 MB/s, 140,620 revisions/s, 4s left
    import: done: 936,114 revisions, 410.0 MB in 6.8s (60.3 MB/s, 137,664 revisions/s)

The time left comes from the byte rate since the start when a byte total is
known, else from the item rate when an item total is known.  Output goes to
a callable (a logger or a stream's write), so the engine layer can report
without knowing where lines end up.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable


SI_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def human_bytes(n: float, *, etcdctl: bool = False) -> str:
    """A size in SI units (1 kB = 1000 B), rounded half up to a tenth as
    go-humanize rounds the sizes etcd's tools print.  Progress lines keep
    the tenth in every unit but bytes; ``etcdctl=True`` prints a size the
    way etcdctl and etcdutl do (go-humanize's Bytes): the tenth only below
    10, so 165,208,064 is "165 MB" there and "165.2 MB" in a progress line.
    """
    exponent = 0
    while abs(n) >= 1000 and exponent < len(SI_UNITS) - 1:
        n /= 1000
        exponent += 1
    if exponent == 0:
        return f"{math.floor(n + 0.5)} B"
    tenths = math.floor(n * 10 + 0.5) / 10
    digits = 0 if etcdctl and tenths >= 10 else 1
    return f"{tenths:.{digits}f} {SI_UNITS[exponent]}"


def human_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    def __init__(self, what: str, *, unit: str | None = "keys", total_items: int | None = None,
                 total_bytes: int | None = None, out: Callable[[str], None] | None = None,
                 interval: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.unit = unit
        self.total_items = total_items
        self.total_bytes = total_bytes
        self.out = out or _stderr_line
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self._next = self.started + interval
        self.items = 0
        self.bytes = 0
        self.lines = 0

    def update(self, items: int | None = None, nbytes: int | None = None, *, force: bool = False) -> None:
        if items is not None:
            self.items = items
        if nbytes is not None:
            self.bytes = nbytes
        now = self.clock()
        if force or now >= self._next:
            self._next = now + self.interval
            self.out(f"{self.what}: {self.describe(now)}")
            self.lines += 1

    def describe(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        parts = []
        if self.unit:
            total = f" of {self.total_items:,}" if self.total_items else ""
            parts.append(f"{self.items:,}{total} {self.unit}")
        if self.bytes or self.total_bytes:
            b = human_bytes(self.bytes)
            if self.total_bytes:
                b += f" of {human_bytes(self.total_bytes)} ({min(100, 100 * self.bytes // max(1, self.total_bytes))}%)"
            parts.append(b)
        if self.bytes:
            parts.append(f"{human_bytes(self.bytes / elapsed)}/s")
        if self.unit:
            parts.append(f"{self.items / elapsed:,.0f} {self.unit}/s")
        left = self.seconds_left(elapsed)
        if left is not None:
            parts.append(f"{human_seconds(left)} left")
        return ", ".join(parts)

    def seconds_left(self, elapsed: float) -> float | None:
        if self.total_bytes and self.bytes:
            return max(0.0, (self.total_bytes - self.bytes) * elapsed / self.bytes)
        if self.total_items and self.items:
            return max(0.0, (self.total_items - self.items) * elapsed / self.items)
        return None

    def done(self, summary: str = "") -> float:
        """Print the last line; returns the elapsed seconds."""
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = [f"{self.items / elapsed:,.0f} {self.unit}/s"] if self.unit else []
        done = [f"{self.items:,} {self.unit}"] if self.unit else []
        if self.bytes:
            rate.insert(0, f"{human_bytes(self.bytes / elapsed)}/s")
            done.append(human_bytes(self.bytes))
        self.out(f"{self.what}: done: {', '.join(done)} in {elapsed:.1f}s ({', '.join(rate)})"
                 + (f"; {summary}" if summary else ""))
        self.lines += 1
        return elapsed
