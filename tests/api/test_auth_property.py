"""No user ever reads, watches or writes outside its permissions.

Random users and roles with random permissions (single keys, ranges,
prefixes, from-key), then random operations as random users: Ranges,
Puts, DeleteRanges, Txns with compares and nested Txns in both branches,
watches on ranges from the first revision, revocations of permissions and
roles.  They run through the api's own checks (brain.api.authz: the
guards of the KV rows, the watch create check) and the store's (writes
checked when decided), on an engine, and every outcome is held against a
model of what each user may see, key by key:

* every key a Range or a Txn's Range returns is readable by the caller;
* every key a successful write changed is writable by the caller;
* every event a watch delivers is on a key its user could read when the
  watch was made (etcd checks a watch once, when it is created);
* a request inside one permission of the caller is never refused, so the
  checks are not trivially "deny everything".

HYPOTHESIS_AUTH_EXAMPLES (default 25) sets how many random worlds run.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.api.authz import Gate, authorized
from brain.api.kv import KVService
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.unary import Deferred
from brain.api.watch import WatchService
from brain.engine import Engine
from brain.mvcc import errors
from brain.mvcc.auth import AuthInfo
from brain.mvcc.auth_perms import PERM_READ, PERM_READWRITE, PERM_WRITE
from brain.mvcc.requests import (
    AuthEnableRequest,
    PutRequest,
    RangeRequest,
    RoleAddRequest,
    RoleGrantPermissionRequest,
    RoleRevokePermissionRequest,
    UserAddRequest,
    UserGrantRoleRequest,
    UserRevokeRoleRequest,
)
from tests.support.engines import cfg
from tests.support.servers import tmp_parent

EXAMPLES = int(os.environ.get("HYPOTHESIS_AUTH_EXAMPLES", "25"))

KEYS = [b"a", b"a1", b"a2", b"ab", b"b", b"b1", b"c", b"c\x00", b"d", b"z"]
USERS = ["u0", "u1", "u2"]
ROLES = ["r0", "r1", "r2"]

keys = st.sampled_from(KEYS)


@st.composite
def perm(draw):
    kind = draw(st.sampled_from(["key", "range", "prefix", "from"]))
    key = draw(keys)
    if kind == "key":
        end = b""
    elif kind == "range":
        end = draw(keys.filter(lambda k: k > key))
    elif kind == "prefix":
        end = key[:-1] + bytes((key[-1] + 1,))
    else:
        end = b"\x00"
    return draw(st.sampled_from([PERM_READ, PERM_WRITE, PERM_READWRITE])), key, end


@st.composite
def key_range(draw):
    key = draw(keys)
    end = draw(st.sampled_from([b"", b"", b"\x00", b"\x00", *(k for k in KEYS if k > key)]))
    return key, end


def op_strategy(depth: int = 2):
    leaf = st.one_of(
        st.tuples(st.just("range"), key_range()),
        st.tuples(st.just("put"), keys),
        st.tuples(st.just("delete"), key_range()),
    )
    if depth == 0:
        return leaf
    return st.one_of(leaf, leaf, st.tuples(st.just("txn"), st.lists(keys, max_size=2),
                                     st.lists(op_strategy(depth - 1), max_size=3),
                                     st.lists(op_strategy(depth - 1), max_size=3)))


_op_action = st.tuples(st.just("op"), st.sampled_from(USERS), op_strategy())
actions = st.one_of(
    _op_action, _op_action, _op_action, _op_action, _op_action,
    st.tuples(st.just("watch"), st.sampled_from(USERS), key_range()),
    st.tuples(st.just("revoke_perm"), st.sampled_from(ROLES)),
    st.tuples(st.just("revoke_role"), st.sampled_from(USERS), st.sampled_from(ROLES)),
)


@dataclass
class World:
    engine: Engine
    gate: Gate
    kv: KVService
    watch: WatchService
    grants: dict = field(default_factory=dict)  # role -> [(type, key, end)]
    roles: dict = field(default_factory=dict)  # user -> set(role)
    watches: list = field(default_factory=list)  # (user, handle, readable keys at creation)
    allowed_ops: int = 0

    def refresh(self) -> None:
        """The model's users and permissions, as the server holds them now
        (which permissions a grant or revoke leaves is etcd's bookkeeping,
        compared in tests/differential; judged here is what they allow)."""
        auth = self.engine.auth
        self.grants = {r.name: [(p.perm_type, p.key, p.range_end) for p in r.perms] for r in auth.roles.values()}
        self.roles = {u.name: set(u.roles) for u in auth.users.values()}

    def root(self, req):
        """``req`` as root (before auth is on, as anybody)."""
        return self.engine.submit(authorized(req, AuthInfo("root", self.engine.auth.revision))).result()

    # -- the model ----------------------------------------------------------------

    def may(self, user: str, kind: int, key: bytes) -> bool:
        for role in self.roles.get(user, ()):
            for t, k, e in self.grants.get(role, ()):
                if kind == PERM_READ and t == PERM_WRITE or kind == PERM_WRITE and t == PERM_READ:
                    continue
                if (not e and key == k) or (e == b"\x00" and key >= k) or (e and e != b"\x00" and k <= key < e):
                    return True
        return False

    def inside_one_permission(self, user: str, kind: int, key: bytes, end: bytes) -> bool:
        """[key, end) lies inside a single permission of the user (then etcd
        must allow it, whatever else it grants)."""
        for role in self.roles.get(user, ()):
            for t, k, e in self.grants.get(role, ()):
                if kind == PERM_READ and t == PERM_WRITE or kind == PERM_WRITE and t == PERM_READ:
                    continue
                if not end:
                    if (not e and key == k) or (e == b"\x00" and key >= k) or (e and e != b"\x00" and k <= key < e):
                        return True
                elif end == b"\x00":
                    if e == b"\x00" and key >= k:
                        return True
                elif key < end and ((e == b"\x00" and key >= k) or (e and e != b"\x00" and k <= key and end <= e)):
                    return True
        return False


def _world(tmp_path, grants, user_roles) -> World:
    # a small journal segment: every example opens an engine (64 MiB each would fill a disk)
    engine = Engine.open(cfg(tmp_path / "e", 1, backend="memory", segment_bytes=1 << 20))
    gate = Gate(engine, tokens=None)
    w = World(engine, gate, KVService(engine, gate=gate), WatchService(engine, gate=gate))
    w.root(UserAddRequest("root", b"x"))
    w.root(UserGrantRoleRequest("root", "root"))
    for user in USERS:
        w.root(UserAddRequest(user, b"x"))
    for role, perms in grants.items():
        w.root(RoleAddRequest(role))
        for t, k, e in perms:
            w.root(RoleGrantPermissionRequest(role, t, k, e))
    for user, roles in user_roles.items():
        for role in roles:
            w.root(UserGrantRoleRequest(user, role))
    for k in KEYS:
        w.engine.put(PutRequest(k, b"v0"))
    w.root(AuthEnableRequest())
    w.refresh()
    return w


def _request_op(op) -> rpc_pb2.RequestOp:
    kind = op[0]
    if kind == "range":
        return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=op[1][0], range_end=op[1][1]))
    if kind == "put":
        return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=op[1], value=b"w"))
    if kind == "delete":
        return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=op[1][0], range_end=op[1][1]))
    return rpc_pb2.RequestOp(request_txn=_txn(op))


def _txn(op) -> rpc_pb2.TxnRequest:
    _, compares, success, failure = op
    return rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=k, target=rpc_pb2.Compare.VERSION, result=rpc_pb2.Compare.GREATER, version=0)
                 for k in compares],
        success=[_request_op(o) for o in success], failure=[_request_op(o) for o in failure])


def _run(w: World, user: str, op):
    """The op through the KV service's step as the fronts run it while auth is
    on: (response or None, error or None)."""
    kv, gate = w.kv, w.gate
    info = AuthInfo(user, w.engine.auth.revision)  # a simple token names the current revision
    kind = op[0]
    if kind == "range":
        m, step, guard = rpc_pb2.RangeRequest(key=op[1][0], range_end=op[1][1]), kv.range, kv.rpc_table().rpcs[0].guard
        parse = rpc_pb2.RangeResponse
    elif kind == "put":
        m, step, guard, parse = rpc_pb2.PutRequest(key=op[1], value=b"w"), kv.put, None, rpc_pb2.PutResponse
    elif kind == "delete":
        m, step, guard = rpc_pb2.DeleteRangeRequest(key=op[1][0], range_end=op[1][1]), kv.delete_range, None
        parse = rpc_pb2.DeleteRangeResponse
    else:
        m, step, guard, parse = _txn(op), kv.txn, kv.rpc_table().rpcs[4].guard, rpc_pb2.TxnResponse
    try:
        out = gate.step(step, guard, m, info)
        if type(out) is Deferred:
            out = out.finish(w.engine.submit(out.request).result())
        return parse.FromString(out.SerializeToString()), None
    except errors.EtcdError as e:
        return None, e


def _state(w: World) -> dict:
    return {kv.key: (kv.mod_revision, kv.value) for kv in w.engine.range(RangeRequest(b"\x00", b"\x00")).kvs}


def _ranges_in(resp) -> list:
    """Every key a Txn response's Ranges returned, nested ones included."""
    out = []
    for r in resp.responses:
        which = r.WhichOneof("response")
        if which == "response_range":
            out += [kv.key for kv in r.response_range.kvs]
        elif which == "response_txn":
            out += _ranges_in(r.response_txn)
    return out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.data_too_large])
@given(grants=st.fixed_dictionaries({r: st.lists(perm(), min_size=1, max_size=3) for r in ROLES}),
       user_roles=st.fixed_dictionaries({u: st.lists(st.sampled_from(ROLES), max_size=2, unique=True)
                                         for u in USERS}),
       script=st.lists(actions, min_size=5, max_size=30))
def test_no_user_reads_watches_or_writes_outside_its_permissions(grants, user_roles, script):
    with tempfile.TemporaryDirectory(prefix="brain-auth-", dir=tmp_parent()) as where:
        _play(Path(where), grants, user_roles, script)


def _play(where: Path, grants, user_roles, script) -> None:
    w = _world(where, grants, user_roles)
    try:
        for action in script:
            kind = action[0]
            if kind == "op":
                _check_op(w, action[1], action[2])
            elif kind == "watch":
                _watch(w, action[1], *action[2])
            elif kind == "revoke_perm":
                perms = w.grants.get(action[1]) or []
                if perms:
                    w.root(RoleRevokePermissionRequest(action[1], perms[0][1], perms[0][2]))
                    w.refresh()
            else:
                user, role = action[1], action[2]
                if role in w.roles.get(user, ()):
                    w.root(UserRevokeRoleRequest(user, role))
                    w.refresh()
        _check_watches(w)
    finally:
        w.engine.close()


def _check_op(w: World, user: str, op) -> None:
    before = _state(w)
    resp, err = _run(w, user, op)
    after = _state(w)
    if err is not None:
        assert err in (errors.ErrPermissionDenied, errors.ErrDuplicateKey), (user, op, err)
        assert before == after, (user, op, "a refused write changed something")
        kind = op[0]
        if kind in ("range", "delete"):
            perm_kind = PERM_READ if kind == "range" else PERM_WRITE
            assert not w.inside_one_permission(user, perm_kind, *op[1]), (user, op, "refused inside a permission")
        elif kind == "put":
            assert not w.inside_one_permission(user, PERM_WRITE, op[1], b""), (user, op, "refused inside")
        return
    w.allowed_ops += 1
    if op[0] == "range":
        for kv in resp.kvs:
            assert w.may(user, PERM_READ, kv.key), (user, op, kv.key)
    elif op[0] == "txn":
        for key in _ranges_in(resp):
            assert w.may(user, PERM_READ, key), (user, op, key)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    for key in changed:
        assert w.may(user, PERM_WRITE, key), (user, op, key)


def _watch(w: World, user: str, key: bytes, end: bytes) -> None:
    handle = w.engine.watch_stream()
    refusal = w.watch.refusal_for(lambda: AuthInfo(user, w.engine.auth.revision))
    req = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key, range_end=end, start_revision=1))
    w.watch.apply(handle, req, refusal)
    readable = {k for k in KEYS if w.may(user, PERM_READ, k)}
    if w.inside_one_permission(user, PERM_READ, key, end) and (not end or end == b"\x00" or key < end):
        created = handle.get(1.0)
        assert created and created[0].created and not created[0].canceled, (user, key, end, created)
        w.watches.append((user, handle, readable, created[1:]))
    else:
        w.watches.append((user, handle, readable, []))


def _check_watches(w: World) -> None:
    for user, handle, readable, early in w.watches:
        items = list(early)
        while True:
            got = handle.get(0.2)
            if not got:
                break
            items += got
        for resp in items:
            for ev in resp.events:
                assert ev.kv.key in readable, (user, ev.kv.key, readable)
        handle.close()

