"""What etcd keeps in its bbolt database (etcd 3.4, 3.5 and 3.6 agree on all
of it except the meta keys each version added).

Buckets:
    key        every stored revision: key = revision bytes (below), value =
               mvccpb.KeyValue (a tombstone's holds only the key)
    meta       consistent_index (u64 BE: the raft index applied), term (3.5+),
               scheduledCompactRev / finishedCompactRev (revision bytes of
               (rev, 0)), confState (3.5+, JSON), storageVersion (3.6+, "3.6.0")
    lease      lease ID (u64 BE) -> leasepb.Lease
    alarm      alarm records; cluster: clusterVersion, downgrade
    members, members_removed: member ID (hex) -> JSON
    auth, authUsers, authRoles: authentication (authEnabled, authRevision)

Revision bytes: main (u64 BE), b"_", sub (u64 BE) = 17 bytes, plus a b"t"
for a tombstone (18 bytes).  Big-endian makes byte order revision order, so
the key bucket is the history in the order it happened.

Example: a Txn at revision 5 that puts a and b holds two keys,
00..05 _ 00..00 (a) and 00..05 _ 00..01 (b); deleting a at 6 adds
00..06 _ 00..00 t with KeyValue{key: a}.
"""

from __future__ import annotations

import struct

KEY = b"key"
META = b"meta"
LEASE = b"lease"
ALARM = b"alarm"
CLUSTER = b"cluster"
MEMBERS = b"members"
MEMBERS_REMOVED = b"members_removed"
AUTH = b"auth"
AUTH_USERS = b"authUsers"
AUTH_ROLES = b"authRoles"
ALL_BUCKETS = (KEY, META, LEASE, ALARM, CLUSTER, MEMBERS, MEMBERS_REMOVED, AUTH, AUTH_USERS, AUTH_ROLES)

META_CONSISTENT_INDEX = b"consistent_index"
META_TERM = b"term"
META_SCHEDULED_COMPACT = b"scheduledCompactRev"
META_FINISHED_COMPACT = b"finishedCompactRev"
META_CONF_STATE = b"confState"
META_STORAGE_VERSION = b"storageVersion"
CLUSTER_VERSION = b"clusterVersion"
AUTH_ENABLED = b"authEnabled"
AUTH_REVISION = b"authRevision"

_REV = struct.Struct(">QcQ")
REV_BYTES = _REV.size  # 17
TOMBSTONE_MARK = b"t"
_U64 = struct.Struct(">Q")


def rev_key(main: int, sub: int = 0, tombstone: bool = False) -> bytes:
    b = _REV.pack(main, b"_", sub)
    return b + TOMBSTONE_MARK if tombstone else b


def parse_rev_key(k: bytes) -> tuple[int, int, bool]:
    """(main, sub, tombstone); ValueError for anything else."""
    n = len(k)
    if n not in (REV_BYTES, REV_BYTES + 1) or k[8:9] != b"_":
        raise ValueError(f"not a revision key: {k.hex()}")
    main, _, sub = _REV.unpack_from(k)
    if main >> 63 or sub >> 63:
        raise ValueError(f"negative revision in key {k.hex()}")
    return main, sub, n == REV_BYTES + 1 and k[-1:] == TOMBSTONE_MARK


def u64(n: int) -> bytes:
    return _U64.pack(n)


def lease_key(lease_id: int) -> bytes:
    """A lease's key in the lease bucket: its int64 ID big-endian, a
    negative one (etcd grants them) in two's complement, as etcd writes it."""
    return _U64.pack(lease_id & 0xFFFF_FFFF_FFFF_FFFF)


def parse_u64(b: bytes) -> int:
    if len(b) != 8:
        raise ValueError(f"expected 8 bytes, got {len(b)}")
    return _U64.unpack(b)[0]
