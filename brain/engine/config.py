"""What the engine needs to know; the CLI builds it from etcd-style flags."""

from __future__ import annotations

from dataclasses import dataclass

from ..journal import DEFAULT_SEGMENT_BYTES
from ..mvcc.shard_map import DEFAULT_SHARDS
from ..mvcc.validation import DEFAULT_MAX_TXN_OPS
from ..mvcc.watch import DEFAULT_MAX_WATCHERS_PER_STREAM
from .limits import DEFAULT_MAX_LEASES

DEFAULT_QUOTA_BYTES = 2 << 30  # etcd's default --quota-backend-bytes


@dataclass
class EngineConfig:
    data_dir: str
    name: str = "default"
    shards: int = DEFAULT_SHARDS
    shard_boundaries: list[bytes] | None = None  # None: the Kubernetes-aware default
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    quota_backend_bytes: int = DEFAULT_QUOTA_BYTES
    auto_compaction_mode: str = "periodic"
    auto_compaction_retention: str = "0"
    backend: str = "lmdb"
    # Journal segments roll over at this size.
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    # A checkpoint moves the memtable into the value store and lets old
    # journal segments go; it starts when any of these is exceeded.
    checkpoint_interval_seconds: float = 60.0
    # 32 MiB: a memtable that comes and goes in smaller pieces leaves less
    # of the heap fragmented behind it (1M keys loaded: RSS 0.83 GB at
    # 128 MiB, 0.57 GB at 32 MiB), and a restart replays less journal.
    checkpoint_journal_bytes: int = 32 << 20
    checkpoint_memtable_records: int = 500_000
    # ... and when writes stopped for this long with at least this much
    # journaled since the last one: the memtable's memory goes back at the
    # end of a burst (a bulk load, a migration) instead of a minute later.
    checkpoint_idle_seconds: float = 2.0
    checkpoint_idle_bytes: int = 4 << 20
    # etcd's --watch-progress-notify-interval, in seconds.
    watch_progress_notify_interval: float = 600.0
    # Undelivered events one watch stream may hold; past it, its watchers
    # stop receiving live events and catch up from history instead.
    watch_queue_events: int = 20_000
    # Watchers one watch stream may have (brain's --max-watchers-per-stream).
    max_watchers_per_stream: int = DEFAULT_MAX_WATCHERS_PER_STREAM
    # Leases at once (brain's --max-leases); a grant beyond: ErrTooManyLeases.
    max_leases: int = DEFAULT_MAX_LEASES
    # Keys compacted, or folded into the packed index, per step between write batches.
    compaction_step_keys: int = 2000
    # Expire leases whose deadline passed.  Off for a mirror of another
    # store, whose grants and revokes come from that store.
    lease_expiry: bool = True
    # etcd's --auth-token-ttl: seconds a simple token lives unused.
    auth_token_ttl: float = 300.0
