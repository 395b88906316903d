"""The checkpoint meta: the one record that says what the value store holds.

It is written in the same atomic batch as the records of a checkpoint (by
the engine, and by restore when it builds a data directory) and read when
the engine opens the directory: recovery loads the value store as of
``revision`` and replays the journal after ``journal_index``.

On disk it is JSON under the backend meta key ``brain.checkpoint``::

    {"revision": 42, "compact_rev": 30, "compact_done_rev": 30,
     "journal_index": 17, "leases": [[id, ttl], ...], "epoch": 3, "leader_id": 7}

``compact_rev`` -1 means nothing was compacted (etcd's -1), and a
``compact_done_rev`` below ``compact_rev`` means physical compaction to
``compact_rev`` had not finished (it resumes on open).  Both are named
here instead: ``compact_revision`` None, ``compaction_finished`` False.
``epoch`` and ``leader_id`` (a replicated journal's last epoch record) are
written only when set; a checkpoint without them has neither.  ``auth``
(users, roles, auth on or off: brain.mvcc.auth's AuthState.to_record) is
written only once auth was used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..mvcc.auth import AuthState

META_CHECKPOINT = b"brain.checkpoint"

# etcd's "no compaction yet" in compact_rev, and "unfinished" in compact_done_rev
_NONE = -1


@dataclass(frozen=True, slots=True)
class CheckpointMeta:
    revision: int
    # The last journal record the checkpoint holds (0: none; a replica's
    # position in the shared journal, etcd's consistent index).
    journal_index: int = 0
    # None: nothing compacted yet.
    compact_revision: int | None = None
    # False: physical compaction to compact_revision was in progress; the
    # engine starts it again when it opens the directory.
    compaction_finished: bool = True
    leases: tuple[tuple[int, int], ...] = ()  # (lease ID, TTL), sorted
    epoch: int = 0
    leader_id: int = 0
    auth: AuthState | None = None  # None: auth never used (the initial state)

    def __post_init__(self) -> None:
        if self.compact_revision is None and not self.compaction_finished:
            raise ValueError("an unfinished compaction needs a compaction revision")

    def encode(self) -> bytes:
        compact = _NONE if self.compact_revision is None else self.compact_revision
        raw = {
            "revision": self.revision,
            "compact_rev": compact,
            "compact_done_rev": compact if self.compaction_finished else _NONE,
            "journal_index": self.journal_index,
            "leases": [list(lease) for lease in self.leases],
        }
        if self.epoch:
            raw["epoch"] = self.epoch
        if self.leader_id:
            raw["leader_id"] = self.leader_id
        if self.auth is not None and not self.auth.is_initial:
            raw["auth"] = self.auth.to_record()
        return json.dumps(raw).encode()

    @classmethod
    def decode(cls, data: bytes) -> "CheckpointMeta":
        raw = json.loads(data)
        compact = raw["compact_rev"]
        return cls(
            revision=raw["revision"],
            journal_index=raw["journal_index"],
            compact_revision=None if compact == _NONE else compact,
            compaction_finished=raw["compact_done_rev"] >= compact,
            leases=tuple((lease_id, ttl) for lease_id, ttl in raw["leases"]),
            epoch=raw.get("epoch", 0),
            leader_id=raw.get("leader_id", 0),
            auth=AuthState.from_record(raw["auth"]) if "auth" in raw else None,
        )

    @classmethod
    def read(cls, backend) -> "CheckpointMeta | None":
        """The checkpoint meta stored in ``backend``; None before the first."""
        data = backend.get_meta(META_CHECKPOINT)
        return None if data is None else cls.decode(data)

    def write_entry(self) -> dict[bytes, bytes]:
        """The meta entry of the batch that writes this checkpoint."""
        return {META_CHECKPOINT: self.encode()}

    @classmethod
    def of_cut(cls, cut, journal_index: int) -> "CheckpointMeta":
        """The meta of a store's checkpoint cut (brain.mvcc.checkpoint.CheckpointCut,
        which keeps the store's -1 conventions) holding the journal up to
        ``journal_index``."""
        return cls(
            revision=cut.revision,
            journal_index=journal_index,
            compact_revision=None if cut.compact_rev == _NONE else cut.compact_rev,
            compaction_finished=cut.compact_done_rev >= cut.compact_rev,
            leases=tuple(cut.leases),
            epoch=cut.epoch,
            leader_id=cut.leader_id,
            auth=cut.auth,
        )
