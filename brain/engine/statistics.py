"""A snapshot of an engine's counters and state, for metrics, /status and
``brain status`` (brain.engine.engine.Engine.statistics)."""

from __future__ import annotations

from dataclasses import dataclass

from .roles import LEADER


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    revision: int
    committed_revision: int
    compact_revision: int
    keys_total: int
    keys_live: int
    memtable_records: int
    batches: int
    requests: int
    checkpoints: int
    last_checkpoint_seconds: float
    journal_bytes_since_checkpoint: int
    backend_size_bytes: int
    backend_in_use_bytes: int
    leases: int
    failed: str | None
    leases_expired: int = 0  # revoked by expiry since this replica began leading
    role: str = LEADER
    applied_index: int = 0
    leader_id: int = 0
    epoch: int = 0
    pending_writes: int = 0  # queued for the committer's next turn
    writes_refused: int = 0  # ErrTooManyRequests (brain.engine.limits)
    grants_refused: int = 0  # ErrTooManyLeases (--max-leases)


def statistics_of(c, leader_id: int) -> EngineStatistics:
    """``c``'s (brain.engine.committer.Committer) figures, read under its
    lock so that they belong to one moment."""
    with c.lock:
        s, cp = c.store, c.checkpointer
        return EngineStatistics(
            revision=s.revision, committed_revision=c.committed_rev, compact_revision=s.compact_rev,
            keys_total=s.keys_total(), keys_live=s.keys_live, memtable_records=s.memtable_entries(),
            batches=c.batches, requests=c.requests, checkpoints=cp.checkpoints,
            last_checkpoint_seconds=cp.last_seconds, journal_bytes_since_checkpoint=cp.journal_bytes,
            backend_size_bytes=cp.backend_size, backend_in_use_bytes=cp.backend_in_use,
            leases=len(s.lessor), failed=c.failed_reason,
            leases_expired=c.role.leases_expired(), role=c.role.name,
            applied_index=c.applied_index, leader_id=leader_id, epoch=s.epoch,
            pending_writes=c.pending_writes, writes_refused=c.limits.writes_refused,
            grants_refused=c.limits.grants_refused)
