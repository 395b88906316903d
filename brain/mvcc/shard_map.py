"""The shard map: which key-range shard holds a key, the one check of a
shard layout (`layout_problem`) and the default layout.

Shard i holds keys in [boundaries[i-1], boundaries[i]), with the first
shard open below and the last open above.  Shards are contiguous and
ordered, so a range that spans several is their concatenation in shard
order: no k-way merge is needed.  For example, boundaries [b"f", b"p"]
make three shards: b"a" is in shard 0, b"f" and b"m" in shard 1, b"p" and
b"z" in shard 2, and the range [b"c", b"q") is shards 0, 1 and 2 in turn.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Sequence


def layout_problem(shards: int | None, boundaries: Sequence[bytes]) -> str | None:
    """What makes a shard layout unusable, in the words of the flags that
    give it (--shards, --shard-boundaries), or None when it is usable.

    The one check of a layout: the server's flags, the engine, and every
    command that builds a data directory ask it, and each raises its own
    error with the text.  ``shards`` None: the count follows from the
    boundaries."""
    if any(not key for key in boundaries):
        return "--shard-boundaries: a boundary key must not be empty"
    if any(a >= b for a, b in zip(boundaries, boundaries[1:])):
        return "--shard-boundaries: keys must be strictly increasing (bytewise)"
    if shards is not None and shards != len(boundaries) + 1:
        return f"--shards {shards} needs {shards - 1} boundary keys, --shard-boundaries gives {len(boundaries)}"
    return None


class ShardMap:
    """Which shard holds a key, and which shards a range spans."""

    __slots__ = ("boundaries",)

    def __init__(self, boundaries: list[bytes]) -> None:
        problem = layout_problem(None, boundaries)
        if problem is not None:
            raise ValueError(problem)
        self.boundaries = list(boundaries)

    def __len__(self) -> int:
        return len(self.boundaries) + 1

    def shard_of(self, key: bytes) -> int:
        return bisect_right(self.boundaries, key)

    def shards_for(self, key: bytes, end: bytes | None) -> range:
        """Shard ids that can hold keys in [key, end)."""
        first = bisect_right(self.boundaries, key)
        last = len(self.boundaries) if end is None else bisect_left(self.boundaries, end)
        return range(first, max(first, last) + 1)


# Where the default shard boundaries go, most valuable split first.  Each is
# the start of one Kubernetes resource prefix, so a list of one resource
# never crosses a shard.  Kubernetes' write load is dominated by Events
# (high churn, lease-expired), Leases (node heartbeats: a quarter of the
# lease duration per node) and Pods (status updates); giving each its own
# shard keeps their indexes, record tables and compaction walks apart from
# the quiet bulk of the keyspace.  See docs/architecture.md.
KUBERNETES_SPLIT_PRIORITY = (
    b"/registry/events/",
    b"/registry/leases/",
    b"/registry/pods/",
    b"/registry/configmaps/",
    b"/registry/secrets/",
    b"/registry/minions/",
    b"/registry/services/",
    b"/registry/replicasets/",
    b"/registry/serviceaccounts/",
    b"/registry/endpointslices/",
    b"/registry/deployments/",
    b"/registry/namespaces/",
    b"/registry/jobs/",
    b"/registry/persistentvolumeclaims/",
    b"/registry/roles/",
)

DEFAULT_SHARDS = 4


def default_boundaries(shards: int) -> list[bytes]:
    """Boundaries for `shards` shards, taken from KUBERNETES_SPLIT_PRIORITY."""
    if shards < 1:
        raise ValueError("--shards must be at least 1")
    if shards - 1 > len(KUBERNETES_SPLIT_PRIORITY):
        raise ValueError(
            f"--shards {shards} needs explicit --shard-boundaries "
            f"(the default table has {len(KUBERNETES_SPLIT_PRIORITY) + 1} shards at most)"
        )
    return sorted(KUBERNETES_SPLIT_PRIORITY[: shards - 1])
