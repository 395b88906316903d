"""What etcd's auth applier does when a write is decided: auth requests
turned into effects on the auth state (its auth store's rules, store.go),
and the permission checks of every other write (its apply/auth.go).

Both run on the store's auth state as of the moment the write is decided,
in order with every other write, which is what makes a check and a change
of permissions exclude each other.  A refused request raises etcd's
error and changes nothing.
"""

from __future__ import annotations

from bisect import bisect_left

from . import errors
from .auth import ROLE_DELETE, ROLE_PUT, ROOT, STATUS, USER_DELETE, USER_PUT, AuthInfo, AuthState, Permission, Role, User
from .auth_perms import valid_permission_range
from .lease import Lessor
from .requests import (
    AuthDisableRequest,
    AuthEnableRequest,
    AuthenticateRequest,
    Authorized,
    DeleteRangeRequest,
    LeaseRevokeRequest,
    PutRequest,
    RangeRequest,
    RoleAddRequest,
    RoleDeleteRequest,
    RoleGrantPermissionRequest,
    RoleRevokePermissionRequest,
    TxnRequest,
    UserAddRequest,
    UserChangePasswordRequest,
    UserDeleteRequest,
    UserGrantRoleRequest,
    UserRevokeRoleRequest,
)

# Token effects: what the engine's token table learns from a decided batch
# (never part of the auth state: tokens live in memory, as in etcd).
TOKEN_ASSIGN, TOKENS_OF_USER_DROPPED, TOKENS_DROPPED = 1, 2, 3


class Decision:
    """What an auth request decided: its effects on the state, and on the
    tokens (``token_effects``)."""

    __slots__ = ("effects", "token_effects")

    def __init__(self, effects=(), token_effects=()) -> None:
        self.effects = list(effects)
        self.token_effects = list(token_effects)


def _bumped(state: AuthState, *effects, enabled: bool | None = None) -> list:
    """``effects`` and the revision moved on (etcd's commitRevision)."""
    return [*effects, (STATUS, state.enabled if enabled is None else enabled, state.revision + 1)]


def decide(state: AuthState, req) -> Decision:
    """The effects of auth request ``req`` on ``state`` (raises EtcdError)."""
    return _DECIDE[type(req)](state, req)


def _enable(state: AuthState, _req) -> Decision:
    if state.enabled:
        return Decision()  # etcd: "already enabled; ignored"
    root = state.users.get(ROOT)
    if root is None:
        raise errors.ErrRootUserNotExist.fresh()
    if not root.is_root:
        raise errors.ErrRootRoleNotExist.fresh()
    # enabling keeps the revision (etcd's AuthEnable does not commit one)
    return Decision([(STATUS, True, state.revision)])


def _disable(state: AuthState, _req) -> Decision:
    if not state.enabled:
        return Decision()
    return Decision(_bumped(state, enabled=False), [(TOKENS_DROPPED,)])


def _authenticate(state: AuthState, req: AuthenticateRequest) -> Decision:
    if not state.enabled:
        raise errors.ErrAuthNotEnabled.fresh()
    user = state.users.get(req.name)
    if user is None or user.no_password:
        raise errors.ErrAuthFailed.fresh()
    return Decision((), [(TOKEN_ASSIGN, req.token, req.name)] if req.token else ())


def _user_add(state: AuthState, req: UserAddRequest) -> Decision:
    if not req.name:
        raise errors.ErrUserEmpty.fresh()
    if req.name in state.users:
        raise errors.ErrUserAlreadyExist.fresh()
    password = b"" if req.no_password else req.password_hash
    return Decision(_bumped(state, (USER_PUT, User(req.name, password, (), req.no_password))))


def _user_delete(state: AuthState, req: UserDeleteRequest) -> Decision:
    if state.enabled and req.name == ROOT:
        raise errors.ErrInvalidAuthMgmt.fresh()
    if req.name not in state.users:
        raise errors.ErrUserNotFound.fresh()
    return Decision(_bumped(state, (USER_DELETE, req.name)), [(TOKENS_OF_USER_DROPPED, req.name)])


def _user_change_password(state: AuthState, req: UserChangePasswordRequest) -> Decision:
    user = state.users.get(req.name)
    if user is None:
        raise errors.ErrUserNotFound.fresh()
    password = b"" if user.no_password else req.password_hash
    return Decision(_bumped(state, (USER_PUT, User(user.name, password, user.roles, user.no_password))),
                    [(TOKENS_OF_USER_DROPPED, req.name)])


def _user_grant_role(state: AuthState, req: UserGrantRoleRequest) -> Decision:
    user = state.users.get(req.user)
    if user is None:
        raise errors.ErrUserNotFound.fresh()
    if req.role != ROOT and req.role not in state.roles:
        raise errors.ErrRoleNotFound.fresh()
    if req.role in user.roles:
        return Decision()  # etcd: ignored, no new revision
    roles = tuple(sorted((*user.roles, req.role)))
    return Decision(_bumped(state, (USER_PUT, User(user.name, user.password, roles, user.no_password))))


def _user_revoke_role(state: AuthState, req: UserRevokeRoleRequest) -> Decision:
    if state.enabled and req.name == ROOT and req.role == ROOT:
        raise errors.ErrInvalidAuthMgmt.fresh()
    user = state.users.get(req.name)
    if user is None:
        raise errors.ErrUserNotFound.fresh()
    roles = tuple(r for r in user.roles if r != req.role)
    if len(roles) == len(user.roles):
        raise errors.ErrRoleNotGranted.fresh()
    return Decision(_bumped(state, (USER_PUT, User(user.name, user.password, roles, user.no_password))))


def _role_add(state: AuthState, req: RoleAddRequest) -> Decision:
    if not req.name:
        raise errors.ErrRoleEmpty.fresh()
    if req.name in state.roles:
        raise errors.ErrRoleAlreadyExist.fresh()
    return Decision(_bumped(state, (ROLE_PUT, Role(req.name))))


def _role_delete(state: AuthState, req: RoleDeleteRequest) -> Decision:
    if state.enabled and req.role == ROOT:
        raise errors.ErrInvalidAuthMgmt.fresh()
    if req.role not in state.roles:
        raise errors.ErrRoleNotFound.fresh()
    effects: list = [(ROLE_DELETE, req.role)]
    for name in sorted(state.users):
        user = state.users[name]
        if req.role in user.roles:
            roles = tuple(r for r in user.roles if r != req.role)
            effects.append((USER_PUT, User(user.name, user.password, roles, user.no_password)))
    return Decision(_bumped(state, *effects))


def _role_grant_permission(state: AuthState, req: RoleGrantPermissionRequest) -> Decision:
    if req.perm_type is None:
        raise errors.ErrPermissionNotGiven.fresh()
    if not valid_permission_range(req.key, req.range_end):
        raise errors.ErrInvalidAuthMgmt.fresh()
    role = state.roles.get(req.name)
    if role is None:
        raise errors.ErrRoleNotFound.fresh()
    perms = list(role.perms)
    # etcd looks only at the first permission whose key is not below the new
    # one's: an equal key and range end there is updated, anything else added
    i = bisect_left([p.key for p in perms], req.key)
    if i < len(perms) and perms[i].key == req.key and perms[i].range_end == req.range_end:
        perms[i] = Permission(req.perm_type, req.key, req.range_end)
    else:
        perms.append(Permission(req.perm_type, req.key, req.range_end))
        perms.sort(key=lambda p: p.key)  # stable, like Go's sort for the few a role holds
    return Decision(_bumped(state, (ROLE_PUT, Role(role.name, tuple(perms)))))


def _role_revoke_permission(state: AuthState, req: RoleRevokePermissionRequest) -> Decision:
    role = state.roles.get(req.role)
    if role is None:
        raise errors.ErrRoleNotFound.fresh()
    perms = tuple(p for p in role.perms if p.key != req.key or p.range_end != req.range_end)
    if len(perms) == len(role.perms):
        raise errors.ErrPermissionNotGranted.fresh()
    return Decision(_bumped(state, (ROLE_PUT, Role(role.name, perms))))


_DECIDE = {
    AuthEnableRequest: _enable,
    AuthDisableRequest: _disable,
    AuthenticateRequest: _authenticate,
    UserAddRequest: _user_add,
    UserDeleteRequest: _user_delete,
    UserChangePasswordRequest: _user_change_password,
    UserGrantRoleRequest: _user_grant_role,
    UserRevokeRoleRequest: _user_revoke_role,
    RoleAddRequest: _role_add,
    RoleDeleteRequest: _role_delete,
    RoleGrantPermissionRequest: _role_grant_permission,
    RoleRevokePermissionRequest: _role_revoke_permission,
}

# The auth requests only a root user may make while auth is on (etcd's
# needAdminPermission); Authenticate needs no credential.
_ADMIN_ONLY = frozenset(_DECIDE) - {AuthenticateRequest}


# ----------------------------------------------------------------------
# the checks of every write (etcd's authApplierV3)


def admit(state: AuthState, lessor: Lessor, req):
    """The request to run, once the caller may make it (raises the error
    etcd answers with otherwise).  ``req`` is an Authorized write, or a bare
    one (sent by a replica that saw auth off: checked as from no user)."""
    if type(req) is Authorized:
        if req.system or not state.enabled:
            return req.request
        info = AuthInfo(req.user, req.auth_revision)
        req = req.request
    else:
        if not state.enabled:
            return req
        info = AuthInfo("", 0)
    kind = type(req)
    if kind is PutRequest:
        check_put(state, lessor, info, req)
    elif kind is DeleteRangeRequest:
        check_delete(state, info, req)
    elif kind is TxnRequest:
        check_txn(state, lessor, info, req)
    elif kind is LeaseRevokeRequest:
        check_lease_puts(state, lessor, info, req.id)
    elif kind in _ADMIN_ONLY:
        state.check_admin(info)
    return req


def check_put(state: AuthState, lessor: Lessor, info: AuthInfo, p: PutRequest) -> None:
    state.check_write(info, p.key)
    # a lease already holding keys the caller may not write cannot be
    # revoked by it, so it may not attach more to it either
    check_lease_puts(state, lessor, info, p.lease)
    if p.prev_kv:
        state.check_read(info, p.key)


def check_delete(state: AuthState, info: AuthInfo, d: DeleteRangeRequest) -> None:
    state.check_write(info, d.key, d.range_end)
    if d.prev_kv:
        state.check_read(info, d.key, d.range_end)


def check_txn(state: AuthState, lessor: Lessor, info: AuthInfo, t: TxnRequest) -> None:
    """Every compare and every op of both branches, nested Txns included
    (etcd's checkTxnPermission), whichever branch will run."""
    for c in t.compare:
        state.check_read(info, c.key, c.range_end)
    for ops in (t.success, t.failure):
        for op in ops:
            kind = type(op)
            if kind is RangeRequest:
                state.check_read(info, op.key, op.range_end)
            elif kind is PutRequest:
                check_put(state, lessor, info, op)
            elif kind is DeleteRangeRequest:
                # etcd checks a nested delete's prev_kv read before its write
                if op.prev_kv:
                    state.check_read(info, op.key, op.range_end)
                state.check_write(info, op.key, op.range_end)
            elif kind is TxnRequest:
                check_txn(state, lessor, info, op)


def check_lease_puts(state: AuthState, lessor: Lessor, info: AuthInfo, lease_id: int) -> None:
    """Write permission on every key the lease holds (etcd's
    checkLeasePuts), unless the caller is root or the lease is unknown."""
    lease = lessor.leases.get(lease_id) if lease_id and lessor is not None else None
    if lease is None or state.is_admin(info):
        return
    for key in sorted(lease.keys):
        state.check_write(info, key)


def check_lease_reads(state: AuthState, info: AuthInfo, keys) -> None:
    """Read permission on each of ``keys`` (etcd's LeaseTimeToLive with keys
    and LeaseLeases), unless the caller is root."""
    if state.is_admin(info):
        return
    for key in keys:
        state.check_read(info, key)
