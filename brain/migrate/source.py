"""What `brain mirror` and `brain snapshot save` ask of a running etcd, as
plain values: the face between the migration code and the gRPC client that
answers it (brain.api.etcd_client.EtcdClient, the only implementation; the
mirror's tests script another).

The client lives in brain/api because api is the only package that imports
grpc and the generated protobuf code; this module keeps the mirror free of
both, so it can be driven by any source that keeps the contract below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, Protocol

from ..mvcc.requests import Event


class SourceError(Exception):
    """The source cannot be read (the message says why).  Every method of a
    Source raises it, and only it, for a source that is unreachable or
    refuses; the mirror retries on it."""


@dataclass
class WatchBatch:
    """One watch response: events (whole revisions, in order) and etcd's
    revision when it sent them; `compacted` set when etcd canceled the
    watch because the revision asked for is compacted."""

    revision: int
    events: list[Event] = field(default_factory=list)
    compacted: int = 0


class SourceWatch(Protocol):
    """A watch over every key: iterate for WatchBatch values (SourceError
    when the watch breaks); close() ends it from any thread."""

    def __iter__(self) -> Iterator[WatchBatch]: ...

    def close(self) -> None: ...


class Source(Protocol):
    def revision(self) -> int:
        """The source's current revision (a linearizable read)."""

    def leases(self) -> list[int]:
        """The IDs of the leases the source holds now."""

    def lease_ttl(self, lease_id: int) -> tuple[int, int] | None:
        """(granted TTL, remaining TTL), or None when the lease is gone."""

    def compact_revision(self, floor: int) -> int:
        """The source's compaction revision if above `floor`, else `floor`."""

    def snapshot(self, f: BinaryIO, progress: Callable[[int, int], None] | None = None) -> int:
        """Write the source's snapshot (database, then its sha256) to `f`,
        calling progress(bytes so far, bytes in all); returns the size of
        the database.  SourceError when the digest does not match."""

    def watch_all(self, start_revision: int) -> SourceWatch:
        """Every change from `start_revision` on."""
