"""The requests and results the MVCC core speaks.

They mirror etcd's etcdserverpb messages field for field (same names, same
defaults) so the api layer converts with no interpretation, yet this package
never imports protobuf.  Enum values are etcd's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

# RangeRequest.SortOrder
SORT_NONE, SORT_ASCEND, SORT_DESCEND = 0, 1, 2
# RangeRequest.SortTarget
TARGET_KEY, TARGET_VERSION, TARGET_CREATE, TARGET_MOD, TARGET_VALUE = 0, 1, 2, 3, 4
# Compare.CompareResult
CMP_EQUAL, CMP_GREATER, CMP_LESS, CMP_NOT_EQUAL = 0, 1, 2, 3
# Compare.CompareTarget
CMP_VERSION, CMP_CREATE, CMP_MOD, CMP_VALUE, CMP_LEASE = 0, 1, 2, 3, 4


@dataclass(slots=True)
class KeyValue:
    key: bytes
    create_revision: int
    mod_revision: int
    version: int
    value: bytes
    lease: int


@dataclass(slots=True)
class RangeRequest:
    key: bytes
    range_end: bytes = b""
    limit: int = 0
    revision: int = 0
    sort_order: int = SORT_NONE
    sort_target: int = TARGET_KEY
    serializable: bool = False
    keys_only: bool = False
    count_only: bool = False
    min_mod_revision: int = 0
    max_mod_revision: int = 0
    min_create_revision: int = 0
    max_create_revision: int = 0


@dataclass(slots=True)
class PutRequest:
    key: bytes
    value: bytes = b""
    lease: int = 0
    prev_kv: bool = False
    ignore_value: bool = False
    ignore_lease: bool = False


@dataclass(slots=True)
class DeleteRangeRequest:
    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False


@dataclass(slots=True)
class Compare:
    """One Txn guard.  `union` names which target_union field the client set
    ("version", "create_revision", "mod_revision", "value", "lease" or None);
    etcd compares against zero / empty when it does not match `target`."""

    result: int
    target: int
    key: bytes
    range_end: bytes = b""
    union: str | None = None
    operand: int | bytes = 0


# A Txn branch entry; None stands for an empty RequestOp (no oneof set).
RequestOp = Union["RangeRequest", "PutRequest", "DeleteRangeRequest", "TxnRequest", None]


@dataclass(slots=True)
class TxnRequest:
    compare: list[Compare] = field(default_factory=list)
    success: list[RequestOp] = field(default_factory=list)
    failure: list[RequestOp] = field(default_factory=list)


@dataclass(slots=True)
class CompactRequest:
    revision: int
    physical: bool = False


@dataclass(slots=True)
class LeaseGrantRequest:
    ttl: int
    id: int = 0


@dataclass(slots=True)
class LeaseRevokeRequest:
    id: int


# --- results ---------------------------------------------------------------


@dataclass(slots=True)
class RangeResult:
    revision: int
    kvs: list[KeyValue]
    more: bool
    count: int


@dataclass(slots=True)
class RangeColumns:
    """A Range result in default key order, column by column: key i is
    (keys[i], create_revisions[i], mod_revisions[i], versions[i],
    values[i], leases[i]), revisions main only, as a KeyValue has them.

    What a list of many keys answers with (brain.mvcc.reads.range_columns):
    no object per key, and for keys_only (``values`` None, every lease 0:
    brain.mvcc.reads.index_only) no record read at all."""

    revision: int
    keys: list[bytes]
    create_revisions: list[int]
    mod_revisions: list[int]
    versions: list[int]
    values: list[bytes] | None
    leases: list[int]
    more: bool
    count: int

    @classmethod
    def of(cls, res: RangeResult) -> RangeColumns:
        """`res` column by column."""
        kvs = res.kvs
        return cls(res.revision, [kv.key for kv in kvs], [kv.create_revision for kv in kvs],
                   [kv.mod_revision for kv in kvs], [kv.version for kv in kvs], [kv.value for kv in kvs],
                   [kv.lease for kv in kvs], res.more, res.count)

    def key_values(self) -> list[KeyValue]:
        values = self.values if self.values is not None else [b""] * len(self.keys)
        return list(map(KeyValue, self.keys, self.create_revisions, self.mod_revisions, self.versions, values,
                        self.leases))


@dataclass(slots=True)
class PutResult:
    revision: int
    prev_kv: KeyValue | None = None


@dataclass(slots=True)
class DeleteRangeResult:
    revision: int
    deleted: int
    prev_kvs: list[KeyValue] = field(default_factory=list)


@dataclass(slots=True)
class TxnResult:
    revision: int
    succeeded: bool
    responses: list["OpResult"]


@dataclass(slots=True)
class EmptyResult:
    """The response to an empty RequestOp: a ResponseOp with no oneof set."""


@dataclass(slots=True)
class CompactResult:
    revision: int


@dataclass(slots=True)
class LeaseGrantResult:
    revision: int
    id: int
    ttl: int


@dataclass(slots=True)
class LeaseRevokeResult:
    revision: int


EVENT_PUT, EVENT_DELETE = 0, 1


class Event:
    """One change, as a watcher sees it: etcd's mvccpb.Event.

    A delete's kv carries only the key and the deleting revision.  prev_kv is
    filled lazily (only watchers asking for it need the lookup) and shared by
    every watcher receiving the event; `wire` lets the api layer cache the
    encoded form so a fan-out encodes each event once."""

    __slots__ = ("type", "kv", "prev_kv", "prev_done", "wire")

    def __init__(self, type: int, kv: KeyValue) -> None:
        self.type = type
        self.kv = kv
        self.prev_kv: KeyValue | None = None
        self.prev_done = False
        self.wire = None

    def is_create(self) -> bool:
        return self.type == EVENT_PUT and self.kv.create_revision == self.kv.mod_revision

    def __repr__(self) -> str:
        return f"Event({'PUT' if self.type == EVENT_PUT else 'DELETE'}, {self.kv!r})"


OpResult = Union[RangeResult, PutResult, DeleteRangeResult, TxnResult, EmptyResult]


# --- auth (etcd's Auth service; decided in brain.mvcc.auth_apply) ----------
#
# Auth requests are writes: they are decided in order with every other
# write and journaled as their effects.  Passwords arrive here hashed (the
# api hashes them, as etcd's server does before proposing), so no journal
# record ever holds one.


@dataclass(slots=True)
class AuthEnableRequest:
    pass


@dataclass(slots=True)
class AuthDisableRequest:
    pass


@dataclass(slots=True)
class AuthenticateRequest:
    """A password already checked by the api; ``token`` the simple token to
    assign (b"" when tokens are JWTs, which need no record)."""

    name: str
    token: str = ""


@dataclass(slots=True)
class UserAddRequest:
    name: str
    password_hash: bytes = b""
    no_password: bool = False


@dataclass(slots=True)
class UserDeleteRequest:
    name: str


@dataclass(slots=True)
class UserChangePasswordRequest:
    name: str
    password_hash: bytes = b""


@dataclass(slots=True)
class UserGrantRoleRequest:
    user: str
    role: str


@dataclass(slots=True)
class UserRevokeRoleRequest:
    name: str
    role: str


@dataclass(slots=True)
class RoleAddRequest:
    name: str


@dataclass(slots=True)
class RoleDeleteRequest:
    role: str


@dataclass(slots=True)
class RoleGrantPermissionRequest:
    """``perm_type`` None: the request carried no permission."""

    name: str
    perm_type: int | None
    key: bytes = b""
    range_end: bytes = b""


@dataclass(slots=True)
class RoleRevokePermissionRequest:
    role: str
    key: bytes = b""
    range_end: bytes = b""


@dataclass(slots=True)
class AuthResult:
    """An auth request's outcome: the store's revision (for the header) and
    the auth revision after it."""

    revision: int
    auth_revision: int


@dataclass(slots=True)
class Authorized:
    """A write with who sent it: etcd's RequestHeader username and auth
    revision (the caller's token's; 0: no user).  The store checks the
    caller's permissions when it decides the write, with the auth state
    of that moment (brain.mvcc.auth_apply).  ``system``: the server's own
    write (a lease expiry), never refused, as etcd's WithRoot."""

    request: object
    user: str = ""
    auth_revision: int = 0
    system: bool = False


def unwrapped(request):
    """The write itself, without who sent it (for code that looks at its kind)."""
    return request.request if type(request) is Authorized else request


AUTH_REQUESTS = (AuthEnableRequest, AuthDisableRequest, AuthenticateRequest, UserAddRequest, UserDeleteRequest,
                 UserChangePasswordRequest, UserGrantRoleRequest, UserRevokeRoleRequest, RoleAddRequest,
                 RoleDeleteRequest, RoleGrantPermissionRequest, RoleRevokePermissionRequest)

WriteRequest = Union[PutRequest, DeleteRangeRequest, TxnRequest, CompactRequest, LeaseGrantRequest, LeaseRevokeRequest,
                     Authorized]
