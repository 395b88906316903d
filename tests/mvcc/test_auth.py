"""The auth store in the core: etcd's rules for users, roles and auth on/off
(its server/auth/store.go), its permission checks (isOpPermitted, the
merged ranges of range_perm_cache.go, apply/auth.go's Txn and lease
checks), and that every change is journaled as effects a replay, a
checkpoint and the cluster codec carry whole."""

from __future__ import annotations

import pytest

from brain.backend.memory import MemoryBackend
from brain.engine.checkpoint_meta import CheckpointMeta
from brain.mvcc import errors
from brain.mvcc.auth import AuthInfo, AuthState
from brain.mvcc.auth_perms import PERM_READ, PERM_READWRITE, PERM_WRITE, KeyRanges, UserPermissions
from brain.mvcc.codec import decode_batch
from brain.mvcc.requests import (
    AuthDisableRequest,
    AuthenticateRequest,
    AuthEnableRequest,
    AuthResult,
    Authorized,
    Compare,
    DeleteRangeRequest,
    LeaseGrantRequest,
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
from brain.mvcc.store import Store


def _store() -> Store:
    s = Store(MemoryBackend(1))
    s.collect_changes()
    return s


def _one(s: Store, req):
    (res,), _ = s.apply([req])
    return res


def _as(s: Store, user: str, req):
    return _one(s, Authorized(req, user, s.auth.revision))


def _enabled(s: Store) -> Store:
    for req in (UserAddRequest("root", b"h"), UserGrantRoleRequest("root", "root"), AuthEnableRequest()):
        assert isinstance(_one(s, req), AuthResult)
    assert s.auth.enabled
    return s


def test_new_store_is_at_auth_revision_1_and_off():
    s = _store()
    assert (s.auth.enabled, s.auth.revision) == (False, 1)
    assert s.auth.is_initial


def test_enable_needs_root_user_with_root_role():
    s = _store()
    assert _one(s, AuthEnableRequest()) == errors.ErrRootUserNotExist
    _one(s, UserAddRequest("root", b"h"))
    assert _one(s, AuthEnableRequest()) == errors.ErrRootRoleNotExist
    # the root role need not exist to be granted (etcd's UserGrantRole)
    assert isinstance(_one(s, UserGrantRoleRequest("root", "root")), AuthResult)
    rev = s.auth.revision
    assert _one(s, AuthEnableRequest()) == AuthResult(1, rev)  # enabling keeps the revision
    assert _one(s, AuthEnableRequest()) == errors.ErrUserEmpty  # on now: only root may
    assert _as(s, "root", AuthEnableRequest()) == AuthResult(1, rev)  # again: ignored


def test_revisions_move_as_etcds():
    s = _store()
    steps = [(UserAddRequest("a", b"h"), 2), (RoleAddRequest("r"), 3), (UserGrantRoleRequest("a", "r"), 4),
             (UserGrantRoleRequest("a", "r"), 4),  # granted already: no new revision
             (RoleGrantPermissionRequest("r", PERM_READ, b"k"), 5), (UserRevokeRoleRequest("a", "r"), 6)]
    for req, rev in steps:
        assert _one(s, req).auth_revision == rev, req


def test_management_errors():
    s = _store()
    assert _one(s, UserAddRequest("")) == errors.ErrUserEmpty
    assert _one(s, RoleAddRequest("")) == errors.ErrRoleEmpty
    _one(s, UserAddRequest("a", b"h"))
    assert _one(s, UserAddRequest("a", b"h")) == errors.ErrUserAlreadyExist
    assert _one(s, UserDeleteRequest("x")) == errors.ErrUserNotFound
    assert _one(s, UserGrantRoleRequest("x", "r")) == errors.ErrUserNotFound
    assert _one(s, UserGrantRoleRequest("a", "r")) == errors.ErrRoleNotFound
    assert _one(s, UserRevokeRoleRequest("a", "r")) == errors.ErrRoleNotGranted
    assert _one(s, UserChangePasswordRequest("x", b"h")) == errors.ErrUserNotFound
    _one(s, RoleAddRequest("r"))
    assert _one(s, RoleAddRequest("r")) == errors.ErrRoleAlreadyExist
    assert _one(s, RoleDeleteRequest("x")) == errors.ErrRoleNotFound
    assert _one(s, RoleGrantPermissionRequest("r", None, b"k")) == errors.ErrPermissionNotGiven
    assert _one(s, RoleGrantPermissionRequest("r", PERM_READ, b"")) == errors.ErrInvalidAuthMgmt
    assert _one(s, RoleGrantPermissionRequest("r", PERM_READ, b"b", b"a")) == errors.ErrInvalidAuthMgmt
    assert _one(s, RoleGrantPermissionRequest("x", PERM_READ, b"k")) == errors.ErrRoleNotFound
    assert _one(s, RoleRevokePermissionRequest("r", b"k")) == errors.ErrPermissionNotGranted
    assert _one(s, RoleRevokePermissionRequest("x", b"k")) == errors.ErrRoleNotFound
    assert _one(s, AuthenticateRequest("a")) == errors.ErrAuthNotEnabled


def test_root_is_protected_only_while_auth_is_on():
    s = _enabled(_store())
    _as(s, "root", RoleAddRequest("root"))
    root = AuthInfo("root", s.auth.revision)
    assert _as(s, "root", UserDeleteRequest("root")) == errors.ErrInvalidAuthMgmt
    assert _as(s, "root", UserRevokeRoleRequest("root", "root")) == errors.ErrInvalidAuthMgmt
    assert _as(s, "root", RoleDeleteRequest("root")) == errors.ErrInvalidAuthMgmt
    assert _as(s, "root", AuthDisableRequest()).auth_revision == root.revision + 1
    assert not s.auth.enabled
    assert isinstance(_one(s, UserRevokeRoleRequest("root", "root")), AuthResult)
    assert isinstance(_one(s, UserDeleteRequest("root")), AuthResult)


def test_admin_requests_need_root_while_on():
    s = _enabled(_store())
    _as(s, "root", UserAddRequest("bob", b"h"))
    assert _one(s, RoleAddRequest("r")) == errors.ErrUserEmpty  # no credential at all
    assert _as(s, "bob", RoleAddRequest("r")) == errors.ErrPermissionDenied
    assert _as(s, "nobody", RoleAddRequest("r")) == errors.ErrUserNotFound
    assert isinstance(_as(s, "root", RoleAddRequest("r")), AuthResult)
    # Authenticate needs no credential
    assert _one(s, AuthenticateRequest("bob", "tok.1")) == AuthResult(1, s.auth.revision)
    assert _one(s, AuthenticateRequest("ghost")) == errors.ErrAuthFailed


def test_authenticate_refuses_a_user_without_password_and_tokens_are_effects():
    s = _enabled(_store())
    _as(s, "root", UserAddRequest("np", no_password=True))
    assert s.auth.users["np"].password == b""
    assert _one(s, AuthenticateRequest("np", "t.1")) == errors.ErrAuthFailed
    s.take_auth()
    _one(s, AuthenticateRequest("root", "t.2"))
    _as(s, "root", UserChangePasswordRequest("root", b"h2"))
    _as(s, "root", AuthDisableRequest())
    state, tokens = s.take_auth()
    assert tokens == [(1, "t.2", "root"), (2, "root"), (3,)]


def test_key_permissions_read_write_prefix_and_from_key():
    s = _enabled(_store())
    for req in (UserAddRequest("u", b"h"), RoleAddRequest("r"), UserGrantRoleRequest("u", "r"),
                RoleGrantPermissionRequest("r", PERM_READ, b"/p/", b"/p0"),
                RoleGrantPermissionRequest("r", PERM_WRITE, b"/w"),
                RoleGrantPermissionRequest("r", PERM_READWRITE, b"/z", b"\x00")):
        assert isinstance(_as(s, "root", req), AuthResult), req
    st = s.auth
    u = AuthInfo("u", st.revision)
    st.check_read(u, b"/p/x")
    st.check_read(u, b"/p/", b"/p0")
    st.check_read(u, b"/p/a", b"/p/b")
    with pytest.raises(errors.EtcdError) as e:
        st.check_read(u, b"/p/", b"/p1")
    assert e.value == errors.ErrPermissionDenied
    with pytest.raises(errors.EtcdError):
        st.check_write(u, b"/p/x")
    st.check_write(u, b"/w")
    with pytest.raises(errors.EtcdError):
        st.check_read(u, b"/w")
    with pytest.raises(errors.EtcdError):
        st.check_write(u, b"/w", b"/x")  # more than the one key
    st.check_read(u, b"/zz", b"\x00")
    st.check_write(u, b"/z", b"\x00")
    with pytest.raises(errors.EtcdError):
        st.check_read(u, b"/y", b"\x00")
    with pytest.raises(errors.EtcdError) as e:
        st.check_read(AuthInfo("u", st.revision - 1), b"/p/x")
    assert e.value == errors.ErrAuthOldRevision
    with pytest.raises(errors.EtcdError) as e:
        st.check_read(AuthInfo("", 0), b"/p/x")
    assert e.value == errors.ErrUserEmpty
    with pytest.raises(errors.EtcdError) as e:
        st.check_read(AuthInfo("ghost", st.revision), b"/p/x")
    assert e.value == errors.ErrPermissionDenied
    st.check_read(AuthInfo("root", st.revision), b"anything", b"\x00")


def test_merged_ranges_count_touching_permissions_as_one():
    r = KeyRanges([(b"a", b"c"), (b"c", b"e"), (b"x", b"x\x00")])
    assert r.covers(b"a", b"e") and r.covers(b"b", b"d") and r.covers(b"x")
    assert not r.covers(b"a", b"f") and not r.covers(b"x", b"y") and not r.covers(b"e")
    # an empty or reversed request range is covered when its key is
    assert r.covers(b"b", b"b") and r.covers(b"d", b"a") and not r.covers(b"f", b"a")
    open_end = KeyRanges([(b"m", None)])
    assert open_end.covers(b"m", b"\x00") and open_end.covers(b"zzz", b"zzzz") and not open_end.covers(b"l")
    assert not KeyRanges([(b"m", b"n")]).covers(b"m", b"\x00")


def test_user_permissions_split_read_and_write():
    class P:
        def __init__(self, t, k, e=b""):
            self.perm_type, self.key, self.range_end = t, k, e
    perms = UserPermissions([P(PERM_READ, b"a"), P(PERM_WRITE, b"b"), P(PERM_READWRITE, b"c", b"d")])
    assert perms.read.covers(b"a") and not perms.write.covers(b"a")
    assert perms.write.covers(b"b") and not perms.read.covers(b"b")
    assert perms.read.covers(b"c", b"d") and perms.write.covers(b"c\xff")


def _user_with(s: Store, *grants) -> None:
    for req in (UserAddRequest("u", b"h"), RoleAddRequest("r"), UserGrantRoleRequest("u", "r"),
                *(RoleGrantPermissionRequest("r", *g) for g in grants)):
        assert isinstance(_as(s, "root", req), AuthResult), req


def test_writes_are_checked_when_decided():
    s = _enabled(_store())
    _user_with(s, (PERM_READWRITE, b"a", b"b"), (PERM_WRITE, b"w"))
    assert _as(s, "u", PutRequest(b"a1", b"v")).revision == 2
    assert _as(s, "u", PutRequest(b"b", b"v")) == errors.ErrPermissionDenied
    assert _as(s, "u", PutRequest(b"w", b"v")).revision == 3
    assert _as(s, "u", PutRequest(b"w", b"v", prev_kv=True)) == errors.ErrPermissionDenied  # prev_kv reads
    assert _as(s, "u", DeleteRangeRequest(b"a", b"b")).deleted == 1
    assert _as(s, "u", DeleteRangeRequest(b"a", b"c")) == errors.ErrPermissionDenied
    assert _one(s, PutRequest(b"a2", b"v")) == errors.ErrUserEmpty  # a bare write, no credential
    assert _one(s, Authorized(PutRequest(b"a2", b"v"), "u", s.auth.revision - 1)) == errors.ErrAuthOldRevision


def test_a_txn_is_checked_whole_both_branches_and_nested():
    s = _enabled(_store())
    _user_with(s, (PERM_READWRITE, b"a", b"b"))
    ok = TxnRequest([Compare(0, 0, b"a1", union="version", operand=5)], [PutRequest(b"a1", b"v")],
                    [RangeRequest(b"a2")])
    assert _as(s, "u", ok).succeeded is False
    for bad in (TxnRequest([Compare(0, 0, b"x")], [], []),
                TxnRequest([], [PutRequest(b"a1", b"v")], [RangeRequest(b"x")]),  # the branch not taken
                TxnRequest([], [TxnRequest([], [], [DeleteRangeRequest(b"x")])], []),
                TxnRequest([], [TxnRequest([], [TxnRequest([], [RangeRequest(b"a", b"c")], [])], [])], [])):
        assert _as(s, "u", bad) == errors.ErrPermissionDenied, bad


def test_lease_revoke_and_put_need_write_on_every_key_of_the_lease():
    s = _enabled(_store())
    _user_with(s, (PERM_READWRITE, b"a", b"b"))
    _one(s, Authorized(LeaseGrantRequest(60, 7), "root", s.auth.revision))
    assert _as(s, "root", PutRequest(b"z", b"v", lease=7)).revision > 0
    assert _as(s, "u", PutRequest(b"a1", b"v", lease=7)) == errors.ErrPermissionDenied
    assert _as(s, "u", LeaseRevokeRequest(7)) == errors.ErrPermissionDenied
    assert _one(s, Authorized(LeaseRevokeRequest(7), system=True)).revision > 0  # expiry, as the server


def test_effects_replay_to_the_same_state():
    s = _enabled(_store())
    payloads = []
    for req in (UserAddRequest("u", b"hash"), UserAddRequest("np", no_password=True), RoleAddRequest("r"),
                RoleGrantPermissionRequest("r", PERM_READ, b"a", b"\x00"),
                RoleGrantPermissionRequest("r", PERM_WRITE, b"k"), UserGrantRoleRequest("u", "r"),
                UserGrantRoleRequest("np", "r"), RoleRevokePermissionRequest("r", b"k"), RoleAddRequest("gone"),
                RoleDeleteRequest("gone"), UserAddRequest("x", b"h"), UserDeleteRequest("x"), AuthDisableRequest()):
        (res,), payload = s.apply([Authorized(req, "root", s.auth.revision)])
        assert isinstance(res, AuthResult), (req, res)
        payloads.append(payload)
    assert all(p[:2] == b"V\x02" for p in payloads)
    r = Store(MemoryBackend(1))
    r.apply([UserAddRequest("root", b"h"), UserGrantRoleRequest("root", "root"), AuthEnableRequest()])
    for p in payloads:
        r.replay(p)
    assert r.auth == s.auth
    assert s.auth.roles["r"].perms == r.auth.roles["r"].perms
    assert r.auth.users["u"].roles == ("r",)


def test_a_batch_without_auth_entries_keeps_format_version_1():
    s = _store()
    _, payload = s.apply([PutRequest(b"a", b"b")])
    assert payload[:2] == b"V\x01"
    assert decode_batch(payload)[0][0] == "T"


def test_checkpoint_meta_carries_the_auth_state():
    s = _enabled(_store())
    _as(s, "root", UserAddRequest("u", b"\x00\xffhash"))
    _as(s, "root", RoleAddRequest("r"))
    _as(s, "root", RoleGrantPermissionRequest("r", PERM_READWRITE, b"\x00k", b"\x00"))
    _as(s, "root", UserGrantRoleRequest("u", "r"))
    meta = CheckpointMeta(revision=1, auth=s.auth)
    back = CheckpointMeta.decode(meta.encode())
    assert back.auth == s.auth
    assert b'"auth"' not in CheckpointMeta(revision=1, auth=AuthState()).encode()
    r = Store(MemoryBackend(1))
    r.load_checkpoint(1, [], compact_rev=-1, compaction_finished=True, auth=back.auth)
    assert r.auth == s.auth and r.auth.enabled
