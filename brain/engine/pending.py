"""A queued write and where its outcome goes.

Every write a caller hands the committer becomes a ``Pending``, settled
exactly once with a result or an EtcdError.  Its outcome goes to a *sink*:
a Future per request (``submit``, callers on their own thread) or one
callback per commit batch (``submit_batch``, the batching gRPC front, which
wants no Future, lock or closure per request).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from ..mvcc import errors
from ..mvcc.requests import CompactRequest

log = logging.getLogger("brain.engine")


class FutureSink:
    """Where a ``submit`` call's outcomes go: a Future per request."""

    __slots__ = ("futures",)

    def __init__(self, n: int) -> None:
        self.futures = [Future() for _ in range(n)]

    def add(self, slot: int, result, exc) -> bool:
        f = self.futures[slot]
        if exc is not None:
            # result() raises it: a shared EtcdError would collect tracebacks
            f.set_exception(errors.raisable(exc))
        else:
            f.set_result(result)
        return False  # nothing to flush


class BatchSink:
    """Where a ``submit_batch`` call's outcomes go: collected while the
    committer settles a commit batch, then handed to ``callback`` in one
    call."""

    __slots__ = ("callback", "items")

    def __init__(self, callback) -> None:
        self.callback = callback
        self.items: list = []

    def add(self, slot: int, result, exc) -> bool:
        self.items.append((slot, result, exc))
        return len(self.items) == 1  # first item: flush this sink later

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            try:
                self.callback(items)
            except Exception:  # noqa: BLE001 - a caller's bug must not stop the committer
                log.exception("write completion callback failed")


class Pending:
    """A queued write: settled exactly once, with a result or an EtcdError.

    ``slot``: its place among the requests its sink was handed (the index
    a ``submit_batch`` callback reports), not a journal index.
    ``local``: decided here or nowhere: a write forwarded to this replica by
    another one, or a lease expiry, is never forwarded on (a replica that
    is no longer the leader answers ErrNotLeader and the sender retries).
    ``wire``: the client's bytes of ``request`` when it is a plain
    TxnRequest (a follower forwards them as they are), else None."""

    __slots__ = ("request", "sink", "slot", "wait_compact", "result", "settled", "local", "deadline", "wire")

    def __init__(self, request, sink, slot: int, local: bool = False, wire: bytes | None = None) -> None:
        self.request = request
        self.sink = sink
        self.slot = slot
        self.wait_compact = (request.revision if isinstance(request, CompactRequest) and request.physical
                             else 0)
        self.result = None
        self.settled = False
        self.local = local
        self.deadline = 0.0  # set when first forwarded to a leader
        self.wire = wire
