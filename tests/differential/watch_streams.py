"""Client side of the watch/lease differential harness: one server's stubs
and its Watch streams, each read by a thread that timestamps every response.

A ``WatchStream`` never interprets responses; it records them (in arrival
order) so the harness can wait for a particular one (``wait_for``) or for the
stream to fall silent (``Side.last_activity``).
"""

from __future__ import annotations

import queue
import threading
import time

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.servers import Stubs, kv_stub


class WatchStream:
    def __init__(self, channel: grpc.Channel, name: str, response_filter=None) -> None:
        self.name = name
        self.response_filter = response_filter  # tests: tamper with responses
        self._requests: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self.responses: list[rpc_pb2.WatchResponse] = []
        self.arrivals: list[float] = []
        self.error: str | None = None  # the stream ended with this gRPC error
        self.ended = False
        self.last_time = time.monotonic()
        self._closing = False
        self._call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(self._requests.get, None))
        self._thread = threading.Thread(target=self._pump, name=f"watch-{name}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for resp in self._call:
                if self.response_filter is not None:
                    resp = self.response_filter(resp)
                now = time.monotonic()
                with self._cond:
                    self.responses.append(resp)
                    self.arrivals.append(now)
                    self.last_time = now
                    self._cond.notify_all()
        except grpc.RpcError as e:
            if not self._closing:
                code = e.code()
                self.error = f"{code.name if code else 'UNKNOWN'}: {e.details()}"
        finally:
            with self._cond:
                self.ended = True
                self.last_time = time.monotonic()
                self._cond.notify_all()

    # -- requests ------------------------------------------------------------
    def send(self, request: rpc_pb2.WatchRequest) -> int:
        """Queue a request; returns the number of responses received so far
        (responses to this request can only come at or after that index)."""
        with self._cond:
            n = len(self.responses)
        self._requests.put(request)
        return n

    # -- waiting -------------------------------------------------------------
    def wait_for(self, start: int, predicate, timeout: float) -> int | None:
        """Index of the first response at or after ``start`` satisfying
        ``predicate``, waiting up to ``timeout`` seconds; None if none came."""
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.responses):
                    if predicate(self.responses[i]):
                        return i
                    i += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.ended:
                    return None
                self._cond.wait(remaining)

    def snapshot(self, start: int = 0) -> list[rpc_pb2.WatchResponse]:
        with self._cond:
            return list(self.responses[start:])

    def count(self) -> int:
        with self._cond:
            return len(self.responses)

    def close(self) -> None:
        self._closing = True
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(timeout=5)


class Side:
    """One server under comparison: its stubs, watch streams and lease-id map."""

    def __init__(self, endpoint: str, label: str, n_streams: int, response_filter=None) -> None:
        self.endpoint = endpoint
        self.label = label
        self.stubs: Stubs = kv_stub(endpoint)
        self.streams = [WatchStream(self.stubs.channel, f"{label}#{i}", response_filter)
                        for i in range(n_streams)]
        self.last_action = time.monotonic()

    @property
    def kv(self):
        return self.stubs.kv

    @property
    def lease(self):
        return self.stubs.lease

    def touch(self) -> None:
        self.last_action = time.monotonic()

    def last_activity(self) -> float:
        return max([self.last_action] + [s.last_time for s in self.streams])

    def close(self) -> None:
        for s in self.streams:
            s.close()
        self.stubs.close()


def quiesce(sides, quiet: float, max_wait: float = 20.0) -> bool:
    """Wait until no side received a watch response (nor was sent anything)
    for ``quiet`` seconds.  False if that did not happen within ``max_wait``."""
    deadline = time.monotonic() + max_wait
    while True:
        now = time.monotonic()
        last = max(s.last_activity() for s in sides)
        if now - last >= quiet:
            return True
        if now >= deadline:
            return False
        time.sleep(min(quiet - (now - last) + 0.005, max(0.0, deadline - now)))
