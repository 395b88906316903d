"""The auth state survives a restart: replayed from the journal after a
kill (no final checkpoint), loaded from the checkpoint after a clean
stop; calls are checked against the state of the last durable batch; a
restart forgets simple tokens (as etcd's members do)."""

from __future__ import annotations

import pytest

from brain.api.authz import authorized
from brain.mvcc.auth import AuthInfo
from brain.mvcc.auth_perms import PERM_READ
from brain.mvcc.requests import (
    AuthEnableRequest,
    AuthenticateRequest,
    RoleAddRequest,
    RoleGrantPermissionRequest,
    UserAddRequest,
    UserGrantRoleRequest,
)
from tests.support.engines import opened_engines


def _set_up(engine) -> None:
    def root(req):
        return engine.submit(authorized(req, AuthInfo("root", engine.auth.revision))).result()

    for req in (UserAddRequest("root", b"$2a$10$hash"), UserGrantRoleRequest("root", "root"),
                UserAddRequest("alice", b"$2a$10$other"), RoleAddRequest("ro"),
                RoleGrantPermissionRequest("ro", PERM_READ, b"/a/", b"/a0"), UserGrantRoleRequest("alice", "ro"),
                AuthEnableRequest()):
        root(req)
    engine.submit(AuthenticateRequest("alice", "tok.1")).result()


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal replay", "checkpoint"])
def test_users_roles_and_enabled_state_survive_a_restart(tmp_path, checkpoint):
    with opened_engines(tmp_path) as make:
        engine = make("e", shards=1)
        _set_up(engine)
        want = engine.auth
        assert want.enabled and engine.tokens.user_of("tok.1") == "alice"
        engine.close(checkpoint=checkpoint)
        again = make("e", shards=1)
        got = again.auth
        assert got == want and got.enabled and got.revision == want.revision
        assert got.users["alice"].password == b"$2a$10$other" and got.roles["ro"].perms == want.roles["ro"].perms
        assert again.tokens.user_of("tok.1") is None  # tokens are gone
        info = AuthInfo("alice", got.revision)
        got.check_read(info, b"/a/x")


def test_readers_see_the_auth_state_of_the_last_durable_batch(tmp_path):
    with opened_engines(tmp_path) as make:
        engine = make("e", shards=1)
        before = engine.auth
        engine.submit(UserAddRequest("u", b"h")).result()
        assert engine.auth is not before and "u" in engine.auth.users and "u" not in before.users
        assert engine.store.auth is engine.auth  # published once durable, the same version
