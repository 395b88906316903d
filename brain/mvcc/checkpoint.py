"""The checkpoint cut: the state a checkpoint writes to the value store,
taken under the store lock in time proportional to the shard count and then
encoded and written without it.

Life of a cut: cut() freezes every shard's active memtable (new writes go
to a fresh one) and takes the pending record deletes, the leases and the
revisions; the engine writes the frozen records and deletes outside the
lock, while reads still find them in `frozen`.  Then exactly one of: done
(the value store holds them now, so the frozen memtables go and the
memtable floor rises to the cut's revision) or abort (the write failed:
the frozen records merge back into the active memtable and the deletes wait
for the next cut).  One cut at a time.
"""

from __future__ import annotations

from .codec import encode_record
from .store_core import StoreCore


class CheckpointCut:
    __slots__ = ("revision", "compact_rev", "compact_done_rev", "frozen", "deletes", "leases", "epoch", "leader_id",
                 "auth")

    def __init__(self, revision, compact_rev, compact_done_rev, frozen, deletes, leases, epoch=0,
                 leader_id=0, auth=None) -> None:
        self.revision = revision
        self.compact_rev = compact_rev
        self.compact_done_rev = compact_done_rev
        self.frozen = frozen
        self.deletes = deletes
        self.leases = leases
        self.epoch = epoch
        self.leader_id = leader_id
        self.auth = auth  # the store's AuthState (immutable: a reference is a copy)

    def records(self):
        """(shard, revision bytes, encoded record) for every frozen record."""
        for sid, table in enumerate(self.frozen):
            for rev, rec in table.items():
                yield sid, rev.to_bytes(16, "big"), encode_record(rec)

    def deleted(self):
        for sid, revs in enumerate(self.deletes):
            for rev in revs:
                yield sid, rev.to_bytes(16, "big")


def cut(store: StoreCore) -> CheckpointCut:
    """Freeze the memtables; the returned cut describes exactly the state
    as of now and can be encoded and written without the store lock."""
    frozen = []
    deletes = []
    for shard in store.shards:
        records, owed = shard.freeze()
        frozen.append(records)
        deletes.append(owed)
    leases = sorted((lease.id, lease.ttl) for lease in store.lessor.leases.values())
    return CheckpointCut(store.revision, store.compact_rev, store.compact_done_rev if not store.compacting else -1,
                         frozen, deletes, leases, store.epoch, store.leader_id, store.auth)


def done(store: StoreCore) -> None:
    """The cut is in the value store: the shards drop their frozen
    memtables (Store.checkpoint_done then raises its memtable floor)."""
    for shard in store.shards:
        shard.release_frozen()


def abort(store: StoreCore, cut: CheckpointCut) -> None:
    """The cut was not written: serve its records from memory again and
    keep its deletes for the next checkpoint."""
    for shard, deletes in zip(store.shards, cut.deletes):
        shard.thaw(deletes)
