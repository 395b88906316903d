"""Leases: which keys each lease holds, so revoke and expiry can delete them.

This is the pure bookkeeping half.  Time (deadlines, keep-alives, expiry
scans) belongs to the engine, which asks the store to revoke a lease through
the same batched write path as any other write, so an expiry is journaled
and emits delete events like a revoke.

Invariant: key_lease[k] == id  <=>  k in leases[id].keys, for every key whose
newest revision is a live put carrying a lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# etcd refuses TTLs above this many seconds (lease.MaxLeaseTTL).
MAX_LEASE_TTL = 9_000_000_000


@dataclass(slots=True)
class Lease:
    id: int
    ttl: int
    keys: set[bytes] = field(default_factory=set)


class Lessor:
    __slots__ = ("leases", "key_lease")

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.key_lease: dict[bytes, int] = {}

    def exists(self, lease_id: int) -> bool:
        return lease_id in self.leases

    def grant(self, lease_id: int, ttl: int) -> Lease:
        lease = Lease(lease_id, ttl)
        self.leases[lease_id] = lease
        return lease

    def remove(self, lease_id: int) -> Lease | None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            for k in lease.keys:
                if self.key_lease.get(k) == lease_id:
                    del self.key_lease[k]
        return lease

    def lease_of(self, key: bytes) -> int:
        return self.key_lease.get(key, 0)

    def set_key(self, key: bytes, lease_id: int) -> None:
        """Record that `key`'s newest put carries `lease_id` (0: none)."""
        old = self.key_lease.get(key, 0)
        if old == lease_id:
            return
        if old:
            lease = self.leases.get(old)
            if lease is not None:
                lease.keys.discard(key)
            del self.key_lease[key]
        if lease_id:
            lease = self.leases.get(lease_id)
            if lease is not None:
                lease.keys.add(key)
                self.key_lease[key] = lease_id

    def __len__(self) -> int:
        return len(self.leases)
