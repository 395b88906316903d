"""StoreCore: what the store's helpers see of a Store.

The Store (brain.mvcc.store) is split as etcd splits its kvstore: the Store
holds the state and the entry points, and its helpers, reads.py, txn.py,
compaction.py, replay.py and checkpoint.py, do the work on it.  They are
handed the Store itself, but type it as a StoreCore: its state as
read-only properties, and the methods through which they change it.  So a
helper reads the revisions, the shards and the lessor, and every change it
makes to the store's own fields is a Store method: `put_at` and `delete_at`
(the two mutations of a key's history), `finish_revision` (a write
transaction or a replayed revision is complete), `start_compaction` and
`compaction_step`, `set_epoch`, `set_auth`.  The shards and the lessor are objects of
their own and change through their own methods.

A leaf of brain.mvcc: it imports no other module of it but for type checks,
so every helper can import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .auth import AuthState
    from .lease import Lessor
    from .shard import Shard
    from .shard_map import ShardMap


class StoreCore(Protocol):
    @property
    def shards(self) -> list[Shard]: ...

    @property
    def shard_map(self) -> ShardMap: ...

    @property
    def backend(self): ...  # the value store (brain.backend.protocol)

    @property
    def lessor(self) -> Lessor: ...

    @property
    def max_txn_ops(self) -> int: ...

    @property
    def revision(self) -> int:
        """The newest main revision whose changes are all applied."""

    @property
    def index_rev(self) -> int:
        """The newest main revision in the key indexes (ahead of `revision`
        while a Txn is half applied)."""

    @property
    def compact_rev(self) -> int: ...

    @property
    def compact_done_rev(self) -> int: ...

    @property
    def compacting(self) -> bool: ...

    @property
    def memtable_floor(self) -> int:
        """Every record above this main revision is in a memtable."""

    @property
    def epoch(self) -> int: ...

    @property
    def leader_id(self) -> int: ...

    @property
    def auth(self) -> AuthState:
        """Users, roles, auth on or off (an immutable version)."""

    def shard_for_key(self, key: bytes) -> Shard: ...

    def put_at(self, rev: int, key: bytes, value: bytes, lease: int) -> None: ...

    def delete_at(self, rev: int, key: bytes) -> None: ...

    def finish_revision(self, main: int) -> None: ...

    def start_compaction(self, rev: int) -> None: ...

    def compaction_step(self, budget: int = 1000) -> bool: ...

    def set_epoch(self, epoch: int, leader_id: int) -> None: ...

    def set_auth(self, state: AuthState, token_effects=()) -> None: ...
