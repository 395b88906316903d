"""etcd's client-visible errors, as (status code name, exact text).

Clients (etcd's clientv3, kube-apiserver) match on the exact message text, so
these strings are part of the wire contract.  The code is a name of a gRPC
status code; only the api layer turns it into a grpc.StatusCode, which keeps
this package free of grpc.
"""

from __future__ import annotations


class EtcdError(Exception):
    """A request failed the way etcd would fail it."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EtcdError) and (self.code, self.message) == (other.code, other.message)

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def __repr__(self) -> str:
        return f"EtcdError({self.code}, {self.message!r})"

    def fresh(self) -> "EtcdError":
        """A new instance equal to this one.  The module's errors are shared
        instances; raising one again and again would chain every raise's
        traceback onto it (and keep those frames alive), so code that
        raises them raises a fresh copy: ``raise errors.ErrCompacted.fresh()``."""
        return EtcdError(self.code, self.message)


def raisable(exc: BaseException) -> BaseException:
    """``exc`` ready to raise: a fresh copy when it is an EtcdError (which may
    be one of the shared instances below, passed along as a value)."""
    return exc.fresh() if isinstance(exc, EtcdError) else exc


def _e(code: str, message: str) -> EtcdError:
    return EtcdError(code, message)


ErrEmptyKey = _e("INVALID_ARGUMENT", "etcdserver: key is not provided")
ErrKeyNotFound = _e("INVALID_ARGUMENT", "etcdserver: key not found")
ErrValueProvided = _e("INVALID_ARGUMENT", "etcdserver: value is provided")
ErrLeaseProvided = _e("INVALID_ARGUMENT", "etcdserver: lease is provided")
ErrTooManyOps = _e("INVALID_ARGUMENT", "etcdserver: too many operations in txn request")
ErrDuplicateKey = _e("INVALID_ARGUMENT", "etcdserver: duplicate key given in txn request")
ErrInvalidSortOption = _e("INVALID_ARGUMENT", "etcdserver: invalid sort option")
ErrRequestTooLarge = _e("INVALID_ARGUMENT", "etcdserver: request is too large")
ErrCompacted = _e("OUT_OF_RANGE", "etcdserver: mvcc: required revision has been compacted")
ErrFutureRev = _e("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision")
ErrLeaseNotFound = _e("NOT_FOUND", "etcdserver: requested lease not found")
ErrLeaseExist = _e("FAILED_PRECONDITION", "etcdserver: lease already exists")
ErrLeaseTTLTooLarge = _e("OUT_OF_RANGE", "etcdserver: too large lease TTL")
ErrNoSpace = _e("RESOURCE_EXHAUSTED", "etcdserver: mvcc: database space exceeded")
ErrTooManyRequests = _e("RESOURCE_EXHAUSTED", "etcdserver: too many requests")
# brain's own (--max-leases; etcd has no such limit), worded as etcd's
ErrTooManyLeases = _e("RESOURCE_EXHAUSTED", "etcdserver: too many leases")
ErrStopped = _e("UNAVAILABLE", "etcdserver: server stopped")
ErrTimeout = _e("UNAVAILABLE", "etcdserver: request timed out")
ErrNoLeader = _e("UNAVAILABLE", "etcdserver: no leader")
ErrNotLeader = _e("FAILED_PRECONDITION", "etcdserver: not leader")
ErrLeaderChanged = _e("UNAVAILABLE", "etcdserver: leader changed")
ErrTimeoutDueToLeaderFail = _e("UNAVAILABLE", "etcdserver: request timed out, possibly due to previous leader failure")
ErrCorrupt = _e("DATA_LOSS", "etcdserver: corrupt cluster")

# Auth (etcd's api/v3rpc/rpctypes, as its auth store's errors map to them).
ErrRootUserNotExist = _e("FAILED_PRECONDITION", "etcdserver: root user does not exist")
ErrRootRoleNotExist = _e("FAILED_PRECONDITION", "etcdserver: root user does not have root role")
ErrUserAlreadyExist = _e("FAILED_PRECONDITION", "etcdserver: user name already exists")
ErrUserEmpty = _e("INVALID_ARGUMENT", "etcdserver: user name is empty")
ErrUserNotFound = _e("FAILED_PRECONDITION", "etcdserver: user name not found")
ErrRoleAlreadyExist = _e("FAILED_PRECONDITION", "etcdserver: role name already exists")
ErrRoleNotFound = _e("FAILED_PRECONDITION", "etcdserver: role name not found")
ErrRoleEmpty = _e("INVALID_ARGUMENT", "etcdserver: role name is empty")
ErrAuthFailed = _e("INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password")
ErrPermissionNotGiven = _e("INVALID_ARGUMENT", "etcdserver: permission not given")
ErrPermissionDenied = _e("PERMISSION_DENIED", "etcdserver: permission denied")
ErrRoleNotGranted = _e("FAILED_PRECONDITION", "etcdserver: role is not granted to the user")
ErrPermissionNotGranted = _e("FAILED_PRECONDITION", "etcdserver: permission is not granted to the role")
ErrAuthNotEnabled = _e("FAILED_PRECONDITION", "etcdserver: authentication is not enabled")
ErrInvalidAuthToken = _e("UNAUTHENTICATED", "etcdserver: invalid auth token")
ErrInvalidAuthMgmt = _e("INVALID_ARGUMENT", "etcdserver: invalid auth management")
ErrAuthOldRevision = _e("INVALID_ARGUMENT", "etcdserver: revision of auth store is old")
# Not in etcd's error map, so its server answers them with code Unknown and
# its auth store's own text.
ErrNoPasswordUser = _e("UNKNOWN", "auth: authentication failed, password was given for no password user")
