"""The etcdserverpb.Auth service: auth on and off, Authenticate, users and
roles, as etcd's server answers them.

Every call is rare and some hash or check a password (bcrypt at
``--bcrypt-cost``, about 60 ms at etcd's default 10), so all of them run
in the pool, not on the dispatch thread.  Changes are writes: hashed here
(as etcd's server hashes before proposing: no password reaches the
journal), sent with their caller (brain.api.authz) and decided by the
store in order with every other write (brain.mvcc.auth_apply), which
checks that the caller is root while auth is on.  AuthStatus and the
listings read the published auth state behind the read barrier (etcd
proposes them, which orders them after every write before them).

Authenticate is etcd's: the password is checked against this replica's
state, then the token is issued by a write, which tells every replica of
a simple token; if the auth revision moved meanwhile it starts again.
"""

from __future__ import annotations

import base64
import binascii
import time

import bcrypt

from brain.api import convert
from brain.api.authz import PUBLIC, Gate, authorized
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.rpc_table import Rpc, ServiceTable
from brain.api.unary import abort_with
from brain.engine.timeouts import REQUEST_TIMEOUT
from brain.mvcc import errors
from brain.mvcc.auth import ROOT
from brain.mvcc.auth_perms import PERM_READWRITE
from brain.mvcc import requests as core

DEFAULT_BCRYPT_COST = 10  # etcd's --bcrypt-cost and bcrypt.DefaultCost
MIN_BCRYPT_COST, MAX_BCRYPT_COST = 4, 31
AUTHENTICATE_ATTEMPTS = 8  # etcd retries while the auth revision moves; a bound keeps a call finite

# Go's bcrypt refuses longer passwords; etcd answers with its text (code Unknown).
ErrPasswordTooLong = errors.EtcdError("UNKNOWN", "bcrypt: password length exceeds 72 bytes")


def hash_password(password: str, cost: int) -> bytes:
    """A bcrypt hash as Go's bcrypt writes it ($2a$)."""
    data = password.encode()
    if len(data) > 72:
        raise ErrPasswordTooLong.fresh()
    return bcrypt.hashpw(data, bcrypt.gensalt(cost, prefix=b"2a"))


def password_matches(password: str, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password.encode(), hashed)
    except ValueError:  # a hash it cannot read, a password over 72 bytes
        return False


class AuthService:
    def __init__(self, engine, gate: Gate, bcrypt_cost: int = DEFAULT_BCRYPT_COST) -> None:
        self.engine = engine
        self.gate = gate
        self.header = convert.Header.of(engine)
        # etcd: a cost outside bcrypt's range means the default
        self.bcrypt_cost = bcrypt_cost if MIN_BCRYPT_COST <= bcrypt_cost <= MAX_BCRYPT_COST else DEFAULT_BCRYPT_COST

    # -- plumbing ----------------------------------------------------------

    def _write(self, context, request, response_cls, method: str):
        """Submit an auth change for the caller; its response, with the
        header of the revision it was decided at, once this replica applied
        it (as an etcd member answers once it applied the entry)."""
        try:
            info = self.gate.caller_of_context(context)
            res = self.engine.submit(authorized(request, info)).result()
            self._until(lambda: self.engine.auth.revision >= res.auth_revision)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, method)
        resp = response_cls()
        self.header.fill(resp.header, self.engine.committed_rev)
        return resp

    def _until(self, applied) -> None:
        """Wait until ``applied()``: a write a follower forwarded comes back
        when the leader decided it, and an auth change makes no key
        revision for the follower to wait on, so the api waits for its
        effect (the auth revision, a token) before answering."""
        deadline = time.monotonic() + REQUEST_TIMEOUT
        while not applied():
            if time.monotonic() > deadline:
                raise errors.ErrTimeout.fresh()
            time.sleep(0.002)

    def _read(self, context, method: str):
        """(the auth state, the caller) once a linearizable read may be
        answered; the caller resolved as a write's would be."""
        try:
            info = self.gate.caller_of_context(context)
            self.engine.wait_linearizable()
            return self.engine.auth, info
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, method)

    def _read_as_root(self, context, method: str):
        """The auth state, as ``_read``, for a caller that must be root."""
        auth, info = self._read(context, method)
        try:
            auth.check_admin(info)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, method)
        return auth

    def _header(self, resp):
        self.header.fill(resp.header, self.engine.committed_rev)
        return resp

    # -- on and off --------------------------------------------------------

    def AuthEnable(self, request, context):
        return self._write(context, core.AuthEnableRequest(), rpc_pb2.AuthEnableResponse, "AuthEnable")

    def AuthDisable(self, request, context):
        return self._write(context, core.AuthDisableRequest(), rpc_pb2.AuthDisableResponse, "AuthDisable")

    def AuthStatus(self, request, context):
        auth, _ = self._read(context, "AuthStatus")
        resp = rpc_pb2.AuthStatusResponse(enabled=auth.enabled, authRevision=auth.revision)
        return self._header(resp)

    def Authenticate(self, request, context):
        tokens = self.gate.tokens
        try:
            self.engine.wait_linearizable()
            for _ in range(AUTHENTICATE_ATTEMPTS):
                checked = self._check_password(request.name, request.password)
                token = tokens.new_token()
                res = self.engine.submit(core.AuthenticateRequest(request.name, token)).result()
                if res.auth_revision == checked:
                    if token:  # a simple token: usable here once this replica applied it
                        self._until(lambda: tokens.info(token, 0) is not None)
                    break
            else:
                raise errors.ErrAuthOldRevision.fresh()
            token = tokens.issue(token, request.name, res.auth_revision)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Authenticate")
        return self._header(rpc_pb2.AuthenticateResponse(token=token))

    def _check_password(self, name: str, password: str) -> int:
        """etcd's CheckPassword: the auth revision the password was good at."""
        auth = self.engine.auth
        if not auth.enabled:
            raise errors.ErrAuthNotEnabled.fresh()
        user = auth.users.get(name)
        if user is None:
            raise errors.ErrAuthFailed.fresh()
        if user.no_password:
            raise errors.ErrNoPasswordUser.fresh()
        if not password_matches(password, user.password):
            raise errors.ErrAuthFailed.fresh()
        return auth.revision

    # -- users -------------------------------------------------------------

    def UserAdd(self, request, context):
        no_password = request.HasField("options") and request.options.no_password
        try:
            hashed = b"" if no_password else hash_password(request.password, self.bcrypt_cost)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "UserAdd")
        return self._write(context, core.UserAddRequest(request.name, hashed, no_password),
                           rpc_pb2.AuthUserAddResponse, "UserAdd")

    def UserDelete(self, request, context):
        return self._write(context, core.UserDeleteRequest(request.name), rpc_pb2.AuthUserDeleteResponse,
                           "UserDelete")

    def UserChangePassword(self, request, context):
        try:
            # etcd hashes a password given; without one the request's
            # hashedPassword stands (empty: a password nothing matches)
            if request.password:
                hashed = hash_password(request.password, self.bcrypt_cost)
            else:
                hashed = base64.b64decode(request.hashedPassword, validate=True)
        except binascii.Error:
            hashed = b""
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "UserChangePassword")
        return self._write(context, core.UserChangePasswordRequest(request.name, hashed),
                           rpc_pb2.AuthUserChangePasswordResponse, "UserChangePassword")

    def UserGrantRole(self, request, context):
        return self._write(context, core.UserGrantRoleRequest(request.user, request.role),
                           rpc_pb2.AuthUserGrantRoleResponse, "UserGrantRole")

    def UserRevokeRole(self, request, context):
        return self._write(context, core.UserRevokeRoleRequest(request.name, request.role),
                           rpc_pb2.AuthUserRevokeRoleResponse, "UserRevokeRole")

    def UserGet(self, request, context):
        auth, info = self._read(context, "UserGet")
        try:
            # etcd: root, or the user asking about itself
            if not auth.is_admin(info) and (info is None or request.name != info.user):
                auth.check_admin(info)
            user = auth.users.get(request.name)
            if user is None:
                raise errors.ErrUserNotFound.fresh()
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "UserGet")
        return self._header(rpc_pb2.AuthUserGetResponse(roles=list(user.roles)))

    def UserList(self, request, context):
        auth = self._read_as_root(context, "UserList")
        return self._header(rpc_pb2.AuthUserListResponse(users=sorted(auth.users, key=str.encode)))

    # -- roles -------------------------------------------------------------

    def RoleAdd(self, request, context):
        return self._write(context, core.RoleAddRequest(request.name), rpc_pb2.AuthRoleAddResponse, "RoleAdd")

    def RoleDelete(self, request, context):
        return self._write(context, core.RoleDeleteRequest(request.role), rpc_pb2.AuthRoleDeleteResponse,
                           "RoleDelete")

    def RoleGrantPermission(self, request, context):
        perm = request.perm if request.HasField("perm") else None
        req = core.RoleGrantPermissionRequest(request.name, None if perm is None else perm.permType,
                                              b"" if perm is None else perm.key,
                                              b"" if perm is None else perm.range_end)
        return self._write(context, req, rpc_pb2.AuthRoleGrantPermissionResponse, "RoleGrantPermission")

    def RoleRevokePermission(self, request, context):
        req = core.RoleRevokePermissionRequest(request.role, request.key, request.range_end)
        return self._write(context, req, rpc_pb2.AuthRoleRevokePermissionResponse, "RoleRevokePermission")

    def RoleGet(self, request, context):
        auth, info = self._read(context, "RoleGet")
        try:
            # etcd: root, or a user that has the role
            if not auth.is_admin(info) and not (info is not None and auth.has_role(info.user, request.role)):
                auth.check_admin(info)
            role = auth.roles.get(request.role)
            if role is None:
                raise errors.ErrRoleNotFound.fresh()
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "RoleGet")
        resp = rpc_pb2.AuthRoleGetResponse()
        if role.name == ROOT:  # etcd shows the root role as read-write on every key
            resp.perm.add(permType=PERM_READWRITE, key=b"", range_end=b"\x00")
        else:
            for p in role.perms:
                resp.perm.add(permType=p.perm_type, key=p.key, range_end=p.range_end)
        return self._header(resp)

    def RoleList(self, request, context):
        auth = self._read_as_root(context, "RoleList")
        return self._header(rpc_pb2.AuthRoleListResponse(roles=sorted(auth.roles, key=str.encode)))

    def rpc_table(self) -> ServiceTable:
        rows = [("AuthEnable", "AuthEnable"), ("AuthDisable", "AuthDisable"), ("AuthStatus", "AuthStatus"),
                ("Authenticate", "Authenticate"), ("UserAdd", "AuthUserAdd"), ("UserGet", "AuthUserGet"),
                ("UserList", "AuthUserList"), ("UserDelete", "AuthUserDelete"),
                ("UserChangePassword", "AuthUserChangePassword"), ("UserGrantRole", "AuthUserGrantRole"),
                ("UserRevokeRole", "AuthUserRevokeRole"), ("RoleAdd", "AuthRoleAdd"), ("RoleGet", "AuthRoleGet"),
                ("RoleList", "AuthRoleList"), ("RoleDelete", "AuthRoleDelete"),
                ("RoleGrantPermission", "AuthRoleGrantPermission"),
                ("RoleRevokePermission", "AuthRoleRevokePermission")]
        return ServiceTable("etcdserverpb.Auth", tuple(
            Rpc(name, getattr(rpc_pb2, f"{msg}Request"), getattr(rpc_pb2, f"{msg}Response"), getattr(self, name),
                guard=PUBLIC)
            for name, msg in rows))


__all__ = ["AuthService", "DEFAULT_BCRYPT_COST", "hash_password", "password_matches"]
