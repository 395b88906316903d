"""Calls the native front took and has not answered yet: what a graceful
stop waits for (brain.api.native_front.NativeFront.stop)."""

from __future__ import annotations

import threading
import time


class InFlight:
    """Calls taken and not answered yet: what a graceful stop waits for."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = threading.Condition(threading.Lock())

    def begin(self, n: int = 1) -> None:
        with self.idle:
            self.count += n

    def end(self, n: int) -> None:
        with self.idle:
            self.count -= n
            if not self.count:
                self.idle.notify_all()

    def wait(self, grace: float | None) -> None:
        """Until none is left, for at most ``grace`` seconds (None or 0: not at all)."""
        deadline = time.monotonic() + (grace or 0.0)
        with self.idle:
            while self.count and grace:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.idle.wait(left)
