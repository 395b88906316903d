"""CommitterCore: what replication sees of the committer.

The Committer (brain.engine.committer) holds a Replication
(brain.engine.replication) and hands it the turns' delivered records,
forwarded answers and confirmations; Replication works on the committer
through what this protocol lists: its state (the store, the revision and
journal index readers see, the term, the role), its queue and inboxes,
settling, publishing a batch, and the changes of role.  Typed as this
protocol, replication imports nothing of the committer, so the two modules
import one way only (the committer imports replication).

A leaf of brain.engine: it imports no other module of it but for type
checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ..mvcc import errors
    from ..mvcc.store import Store
    from .pending import Pending


class CommitterCore(Protocol):
    store: Store
    committed_rev: int  # the newest revision readers see
    applied_index: int  # the journal record holding it
    term: int  # the journal's epoch this replica last saw
    member_id: int

    # -- the role

    @property
    def is_leader(self) -> bool: ...

    @property
    def failed(self) -> errors.EtcdError | None:
        """The error writes are refused with until restart, if any."""

    @property
    def forwarder(self):
        """Where a follower's writes go (brain.cluster's), None on a single node."""

    @property
    def read_lease(self) -> Callable[[], bool] | None: ...

    def lead(self) -> None: ...

    def follow_leader(self) -> None: ...

    def role_changed(self) -> None: ...

    def fail(self, err: errors.EtcdError, reason: str) -> None: ...

    # -- the queue and the inboxes

    def requeue(self, pending: list[Pending]) -> None: ...

    def post(self, item) -> None:
        """(any thread) Hand ``item`` (one of brain.engine.items) to the next turn."""

    def take_posted(self, kind: type) -> list: ...

    def has_posted(self, kind: type) -> bool: ...

    def wake(self) -> None: ...

    # -- settling

    def settle(self, p: Pending, result, exc=None) -> None: ...

    def settle_results(self, admitted: list[Pending], results: list) -> None: ...

    def settle_decided(self, admitted: list[Pending], results: list) -> None:
        """Answer outcomes decided without a record, behind the batches in flight."""

    def flush_sinks(self) -> None: ...

    def await_compaction(self, p: Pending, result) -> None: ...

    def release_compaction_waiters(self) -> None: ...

    # -- the store and what readers see of it

    def publish(self, revision: int, index: int, events: list) -> None: ...

    def apply_epoch(self, payload: bytes, index: int) -> None: ...

    def replace_store(self, store: Store) -> None: ...
