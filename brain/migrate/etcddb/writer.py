"""Writing an etcd database: the buckets and meta keys etcd 3.6 writes, so
`etcdctl snapshot status`, `etcdutl snapshot restore` and etcd itself take
the file as one of their own (see schema.py for what each holds).

The key bucket streams in (revision key, KeyValue bytes) pairs in revision
order and goes straight to pages; the other buckets are small.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable

from brain.etcd_version import ETCD_CLUSTER_VERSION, STORAGE_VERSION

from ..bbolt import BoltWriter
from . import schema
from .proto import Auth, Lease, encode_lease, encode_role, encode_user


@dataclass(frozen=True)
class Member:
    id: int
    name: str
    client_urls: list[str] = field(default_factory=list)
    peer_urls: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        """etcd's membership.Member as it stores it (Go's field order)."""
        d = {"id": self.id, "peerURLs": list(self.peer_urls)}
        if self.name:
            d["name"] = self.name
        if self.client_urls:
            d["clientURLs"] = list(self.client_urls)
        return json.dumps(d, separators=(",", ":")).encode()


@dataclass(frozen=True)
class DbMeta:
    consistent_index: int  # 0: not written (etcd never stores 0)
    term: int
    compact_revision: int  # -1: never compacted
    members: list[Member]
    cluster_version: str = ETCD_CLUSTER_VERSION
    storage_version: str = STORAGE_VERSION


def write_etcd_db(f: BinaryIO, revisions: Iterable[tuple[bytes, bytes]], leases: Iterable[Lease],
                  meta: DbMeta, auth: Auth = Auth()) -> int:
    """Write a database to `f` (seekable, empty): `revisions` are the key
    bucket's (revision key, encoded KeyValue) pairs in increasing order;
    `auth` the auth buckets' content.  Returns its size in bytes."""
    w = BoltWriter(f)
    key_bucket = w.bucket(revisions)
    meta_items = {
        schema.META_CONF_STATE: json.dumps({"voters": [x.id for x in meta.members], "auto_leave": False},
                                           separators=(",", ":")).encode(),
        schema.META_STORAGE_VERSION: meta.storage_version.encode(),
    }
    if meta.consistent_index:
        meta_items[schema.META_CONSISTENT_INDEX] = schema.u64(meta.consistent_index)
        meta_items[schema.META_TERM] = schema.u64(max(1, meta.term))
    if meta.compact_revision > 0:
        rev = schema.rev_key(meta.compact_revision)
        meta_items[schema.META_SCHEDULED_COMPACT] = rev
        meta_items[schema.META_FINISHED_COMPACT] = rev
    lease_items = sorted((schema.lease_key(lease.id), encode_lease(lease)) for lease in leases)
    members = sorted((f"{x.id:x}".encode(), x.to_json()) for x in meta.members)
    buckets = {
        schema.KEY: key_bucket,
        schema.META: w.bucket(sorted(meta_items.items())),
        schema.LEASE: w.bucket(lease_items),
        schema.ALARM: w.bucket([]),
        schema.CLUSTER: w.bucket([(schema.CLUSTER_VERSION, meta.cluster_version.encode())]),
        schema.MEMBERS: w.bucket(members),
        schema.MEMBERS_REMOVED: w.bucket([]),
        # authEnabled once there is anything to guard (etcd writes it when auth is switched)
        schema.AUTH: w.bucket(sorted([(schema.AUTH_REVISION, schema.u64(auth.revision)),
                                      *([(schema.AUTH_ENABLED, b"\x01" if auth.enabled else b"\x00")]
                                        if auth.enabled or auth.users or auth.roles else [])])),
        schema.AUTH_USERS: w.bucket(sorted((u.name, encode_user(u)) for u in auth.users)),
        schema.AUTH_ROLES: w.bucket(sorted((r.name, encode_role(r)) for r in auth.roles)),
    }
    return w.finish(sorted(buckets.items()))
