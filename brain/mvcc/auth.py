"""The auth state: users, roles, whether auth is on, the auth revision; and
the permission checks etcd's auth store makes against it.

An ``AuthState`` is never changed in place: a change makes a new one
(``changed``), so the engine can hand readers the state of the last
durable batch (brain.engine.committer publishes it with the committed
revision) while the committer decides the next one, and a reader needs no
lock.  Changes come as *effects*, the records etcd's auth store writes to
its buckets: a user or a role put whole, a user or a role deleted, the
enabled flag with the revision.  brain.mvcc.auth_apply decides requests
into effects; the journal carries them (brain.mvcc.codec) and replay
applies the same effects, so a follower's state equals the leader's.

The auth revision counts changes (etcd's: 1 in a new store, moved by
every change but enabling auth).  A token names the revision it was
issued at; a request whose token is older than the state is refused with
``ErrAuthOldRevision`` (the client authenticates again).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import NamedTuple

from . import errors
from .auth_perms import UserPermissions

ROOT = "root"  # the root user and the root role, as etcd names them


@dataclass(frozen=True, slots=True)
class Permission:
    perm_type: int  # brain.mvcc.auth_perms PERM_READ, PERM_WRITE, PERM_READWRITE
    key: bytes
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: bytes = b""  # the bcrypt hash; b"" for a user without a password
    roles: tuple[str, ...] = ()  # sorted, as etcd keeps them
    no_password: bool = False

    @property
    def is_root(self) -> bool:
        """Has the root role (etcd's hasRootRole)."""
        return ROOT in self.roles


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    perms: tuple[Permission, ...] = ()  # sorted by key, as etcd keeps them


# Effects, as journaled (brain.mvcc.codec) and replayed: (USER_PUT, User),
# (USER_DELETE, name), (ROLE_PUT, Role), (ROLE_DELETE, name), (STATUS,
# enabled, revision).
USER_PUT, USER_DELETE, ROLE_PUT, ROLE_DELETE, STATUS = 1, 2, 3, 4, 5
Effect = tuple


class AuthInfo(NamedTuple):
    """Who calls: etcd's AuthInfo, a user name and the auth revision its
    credential stands for (0: no user).  A tuple: one is made per call."""

    user: str
    revision: int


class AuthState:
    """One version of the auth state (never changed once made)."""

    __slots__ = ("enabled", "revision", "users", "roles", "_perms")

    def __init__(self, enabled: bool = False, revision: int = 1, users: dict | None = None,
                 roles: dict | None = None) -> None:
        self.enabled = enabled
        self.revision = revision
        self.users: dict[str, User] = users if users is not None else {}
        self.roles: dict[str, Role] = roles if roles is not None else {}
        self._perms: dict[str, UserPermissions] = {}  # a cache, filled on first use per user

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AuthState) and (self.enabled, self.revision, self.users, self.roles)
                == (other.enabled, other.revision, other.users, other.roles))

    def __repr__(self) -> str:
        return (f"AuthState(enabled={self.enabled}, revision={self.revision}, users={sorted(self.users)}, "
                f"roles={sorted(self.roles)})")

    @property
    def is_initial(self) -> bool:
        """Nothing was ever set: a store that never used auth (no record
        of it needs to be kept)."""
        return not self.enabled and self.revision == 1 and not self.users and not self.roles

    def changed(self, effects: list[Effect]) -> AuthState:
        """A new state with ``effects`` applied in order (self unchanged)."""
        if not effects:
            return self
        users, roles = dict(self.users), dict(self.roles)
        enabled, revision = self.enabled, self.revision
        for effect in effects:
            kind = effect[0]
            if kind == USER_PUT:
                users[effect[1].name] = effect[1]
            elif kind == USER_DELETE:
                users.pop(effect[1], None)
            elif kind == ROLE_PUT:
                roles[effect[1].name] = effect[1]
            elif kind == ROLE_DELETE:
                roles.pop(effect[1], None)
            elif kind == STATUS:
                enabled, revision = effect[1], effect[2]
            else:
                raise ValueError(f"unknown auth effect {kind}")
        return AuthState(enabled, revision, users, roles)

    def effects(self) -> list[Effect]:
        """The effects that rebuild this state from the initial one (a
        checkpoint's or a snapshot's record of it)."""
        out: list[Effect] = [(USER_PUT, self.users[n]) for n in sorted(self.users)]
        out += [(ROLE_PUT, self.roles[n]) for n in sorted(self.roles)]
        out.append((STATUS, self.enabled, self.revision))
        return out

    def to_record(self) -> dict:
        """The state as plain JSON values (bytes in base64): what a
        checkpoint stores (brain.engine.checkpoint_meta)."""
        b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
        return {
            "enabled": self.enabled,
            "revision": self.revision,
            "users": [{"name": u.name, "password": b64(u.password), "roles": list(u.roles),
                       "no_password": u.no_password} for u in sorted(self.users.values(), key=lambda u: u.name)],
            "roles": [{"name": r.name, "perms": [[p.perm_type, b64(p.key), b64(p.range_end)] for p in r.perms]}
                      for r in sorted(self.roles.values(), key=lambda r: r.name)],
        }

    @classmethod
    def from_record(cls, raw: dict) -> AuthState:
        unb64 = base64.b64decode
        users = {u["name"]: User(u["name"], unb64(u["password"]), tuple(u["roles"]), u["no_password"])
                 for u in raw["users"]}
        roles = {r["name"]: Role(r["name"], tuple(Permission(t, unb64(k), unb64(e)) for t, k, e in r["perms"]))
                 for r in raw["roles"]}
        return cls(raw["enabled"], raw["revision"], users, roles)

    # ------------------------------------------------------------------
    # permission checks (etcd's isOpPermitted, IsAdminPermitted)

    def permissions(self, name: str) -> UserPermissions:
        perms = self._perms.get(name)
        if perms is None:
            user = self.users.get(name)
            roles = user.roles if user is not None else ()
            perms = UserPermissions(p for r in roles if (role := self.roles.get(r)) is not None for p in role.perms)
            self._perms[name] = perms
        return perms

    def _check_user(self, info: AuthInfo | None) -> User | None:
        """The checks before a key permission: a user given, its token not
        older than this state; None for a root user (allowed everything)."""
        if info is None or info.revision == 0:
            raise errors.ErrUserEmpty.fresh()
        if info.revision < self.revision:
            raise errors.ErrAuthOldRevision.fresh()
        user = self.users.get(info.user)
        if user is None:
            raise errors.ErrPermissionDenied.fresh()
        return None if user.is_root else user

    def check_read(self, info: AuthInfo | None, key: bytes, range_end: bytes = b"") -> None:
        """etcd's IsRangePermitted (raises; nothing when auth is off)."""
        if not self.enabled:
            return
        user = self._check_user(info)
        if user is not None and not self.permissions(user.name).read.covers(key, range_end):
            raise errors.ErrPermissionDenied.fresh()

    def check_write(self, info: AuthInfo | None, key: bytes, range_end: bytes = b"") -> None:
        """etcd's IsPutPermitted (range_end b"") and IsDeleteRangePermitted."""
        if not self.enabled:
            return
        user = self._check_user(info)
        if user is not None and not self.permissions(user.name).write.covers(key, range_end):
            raise errors.ErrPermissionDenied.fresh()

    def check_admin(self, info: AuthInfo | None) -> None:
        """etcd's IsAdminPermitted: the caller has the root role (no
        revision check, as in etcd)."""
        if not self.enabled:
            return
        if info is None or not info.user:
            raise errors.ErrUserEmpty.fresh()
        user = self.users.get(info.user)
        if user is None:
            raise errors.ErrUserNotFound.fresh()
        if not user.is_root:
            raise errors.ErrPermissionDenied.fresh()

    def is_admin(self, info: AuthInfo | None) -> bool:
        try:
            self.check_admin(info)
        except errors.EtcdError:
            return False
        return True

    def has_role(self, name: str, role: str) -> bool:
        user = self.users.get(name)
        return user is not None and role in user.roles

    def check_user_given(self, info: AuthInfo | None) -> None:
        """etcd's requireAuthInfo: with auth on, some credential is needed."""
        if self.enabled and info is None:
            raise errors.ErrUserEmpty.fresh()

    def check_unchanged(self, info: AuthInfo | None) -> None:
        """After a read (etcd's doSerialize): refuse it when the state moved
        past the caller's token meanwhile."""
        if info is not None and info.revision and info.revision != self.revision:
            raise errors.ErrAuthOldRevision.fresh()
