"""Who calls, and what etcd checks before it serves a call.

While auth is off (``Gate.enabled``, one attribute of the engine's
published auth state) nothing here runs: the fronts test that flag and
call the step as before.  While it is on, every call of etcd's services
but Authenticate names its caller as etcd's AuthInfoFromCtx does: the
``token`` metadata (else ``authorization``, "Bearer " stripped), resolved
by the token provider (brain.api.auth_tokens), else with
``--client-cert-auth`` the verified client certificate's common name; a
token that resolves to nobody is ``ErrInvalidAuthToken``.  Then:

* a read is checked by its row's guard (the permission etcd's server
  checks for it), run, and refused with ``ErrAuthOldRevision`` when the
  auth state moved past the caller's token meanwhile (etcd's doSerialize);
* a write is checked by its guard (what etcd checks before proposing:
  a user given for lease calls, root for Compact) and travels as an
  ``Authorized`` request, checked again when the store decides it, with
  the auth state of that moment (brain.mvcc.auth_apply);
* the pool's calls (Maintenance, Cluster, Auth's reads) and streams ask
  ``require_admin`` / ``require_user`` / ``caller_of_context`` with their
  context: grpcio's, or the native pool's, which carries the event's.

Guards take (auth state, AuthInfo or None, protobuf request) and raise
etcd's error.  ``PUBLIC`` marks a row that names no caller (Authenticate,
the health service).
"""

from __future__ import annotations

import grpc

from brain.api.grpc_stats import GO_CODE_NAMES
from brain.api.unary import Deferred, abort_with
from brain.mvcc import auth_apply, errors, validation
from brain.mvcc.auth import AuthInfo
from brain.mvcc.requests import AUTH_REQUESTS, Authorized, DeleteRangeRequest, LeaseRevokeRequest, PutRequest, TxnRequest


def PUBLIC(_auth, _info, _request) -> None:  # noqa: N802 - a marker, compared by identity
    """The row names no caller (etcd's Authenticate; health)."""


# The writes the store checks when it decides them: they travel with their caller.
CHECKED_WHEN_DECIDED = frozenset((PutRequest, DeleteRangeRequest, TxnRequest, LeaseRevokeRequest, *AUTH_REQUESTS))


def authorized(request, info: AuthInfo | None):
    """``request`` with its caller, for the store's check (no caller: as
    etcd's empty header, which the store refuses with ErrUserEmpty)."""
    if type(request) not in CHECKED_WHEN_DECIDED:
        return request
    if info is None:
        return Authorized(request)
    return Authorized(request, info.user, info.revision)


class Gate:
    """Caller resolution and checks for one engine's services."""

    def __init__(self, engine, tokens, client_cert_auth: bool = False) -> None:
        self.engine = engine
        self.tokens = tokens  # brain.api.auth_tokens: SimpleTokens or JwtTokens
        self.client_cert_auth = client_cert_auth

    @property
    def enabled(self) -> bool:
        return self.engine.auth.enabled

    # -- who calls ------------------------------------------------------------

    def caller(self, token: str | None, common_name: str | None) -> AuthInfo | None:
        """etcd's AuthInfoFromCtx then AuthInfoFromTLS (None: no credential,
        or auth off)."""
        auth = self.engine.auth
        if not auth.enabled:
            return None
        if token is not None:
            info = self.tokens.info(token.removeprefix("Bearer "), auth.revision)
            if info is None:
                raise errors.ErrInvalidAuthToken.fresh()
            return info
        if common_name and self.client_cert_auth:
            return AuthInfo(common_name, auth.revision)
        return None

    def caller_of(self, who) -> AuthInfo | None:
        """The caller of a native transport event: its last item, the
        common name or (common name, token)."""
        if type(who) is tuple:
            return self.caller(who[1], who[0])
        return self.caller(None, who)

    def caller_of_context(self, context) -> AuthInfo | None:
        """The caller of a grpcio call, or of a native pool call (its
        PoolContext answers the same two questions)."""
        if not self.enabled:
            return None
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == "token":
                token = value
                break
            if key == "authorization" and token is None:
                token = value
        names = (context.auth_context() or {}).get("x509_common_name") or ()
        cn = names[0].decode() if names and isinstance(names[0], bytes) else (names[0] if names else None)
        return self.caller(token, cn)

    # -- checks ---------------------------------------------------------------

    def require_admin(self, context) -> None:
        """etcd's AuthAdmin.isPermitted: a root user, while auth is on."""
        if self.enabled:
            info = self.caller_of_context(context)
            self.engine.auth.check_admin(info)

    def require_user(self, context) -> AuthInfo | None:
        """etcd's requireAuthInfo: some credential, while auth is on."""
        if not self.enabled:
            return None
        info = self.caller_of_context(context)
        self.engine.auth.check_user_given(info)
        return info

    def watch_refusal(self, caller, key: bytes, range_end: bytes) -> str:
        """Why a watch on [key, range_end) is refused for ``caller()`` (the
        cancel reason etcd's Watch answers), or "" (also while auth is off)."""
        if not self.enabled:
            return ""
        try:
            self.engine.auth.check_read(caller(), key, range_end)
        except errors.EtcdError as e:
            if e not in (errors.ErrInvalidAuthToken, errors.ErrAuthOldRevision, errors.ErrUserEmpty):
                e = errors.ErrPermissionDenied
            # etcd's reason is the gRPC error's text, code and all
            return f"rpc error: code = {GO_CODE_NAMES[grpc.StatusCode[e.code]]} desc = {e.message}"
        return ""

    def check_renew(self, info: AuthInfo | None, lease_id: int) -> None:
        """etcd's checkLeaseRenew: a user given; root, or write permission on
        every key of the lease."""
        auth = self.engine.auth
        if not auth.enabled:
            return
        auth.check_user_given(info)
        if auth.is_admin(info):
            return
        for key in self.engine.lease_keys(lease_id):
            auth.check_write(info, key)
        self.engine.auth.check_unchanged(info)

    def step(self, step, guard, request, info: AuthInfo | None):
        """Run a unary step for ``info`` while auth is on: its guard, then
        the step; a write leaves with its caller, a read is refused if the
        auth state moved past the caller's token while it ran."""
        if guard is not None:
            guard(self.engine.auth, info, request)
        out = step(request)
        if type(out) is Deferred:
            return Deferred(authorized(out.request, info), out.finish)
        self.engine.auth.check_unchanged(info)
        return out


def checked_call(gate, call, check, method: str):
    """A servicer method (a pool call or a server stream) that, while auth is
    on, first runs ``check(gate, request, context)`` (raising etcd's error,
    answered as its status)."""
    if gate is None:
        return call

    def run(request, context):
        if gate.enabled:
            try:
                check(gate, request, context)
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                abort_with(context, e, method)
        return call(request, context)

    return run


def needs_admin(gate, _request, context) -> None:
    gate.require_admin(context)


def needs_user(gate, _request, context) -> None:
    gate.require_user(context)


# -- guards the services' rows share -------------------------------------------


def user_given(auth, info, _request) -> None:
    """etcd's requireAuthInfo (3.7: lease calls, Status, MemberList)."""
    auth.check_user_given(info)


def admin(auth, info, _request) -> None:
    """etcd's AuthAdmin.isPermitted: root only."""
    auth.check_admin(info)


def range_guard(convert_range):
    """KV.Range: etcd validates the request, then checks read permission on
    its range."""
    def guard(auth, info, m) -> None:
        validation.check_range(convert_range(m))
        auth.check_read(info, m.key, m.range_end)
    return guard


def txn_guard(convert_txn, is_readonly, max_txn_ops: int):
    """KV.Txn: a read-only Txn is validated and checked whole here (etcd's
    CheckTxnAuth before serving it); any other is checked when decided."""
    def guard(auth, info, m) -> None:
        if not is_readonly(m):
            return
        t = convert_txn(m)
        validation.check_txn(t, max_txn_ops)
        auth_apply.check_txn(auth, None, info, t)
    return guard


__all__ = ["CHECKED_WHEN_DECIDED", "Gate", "PUBLIC", "admin", "authorized", "checked_call", "needs_admin",
           "needs_user", "range_guard", "txn_guard", "user_given"]
