"""Auth on a brain cluster: users, roles and auth on are journaled, so a
follower enforces what was set through the leader; a simple token issued
through one replica is honoured by the others (its Authenticate is a
journal record every replica applies, as each etcd member applies the
raft entry); a restarted replica keeps the auth state (checkpoint and
journal) and forgets the tokens (as etcd's members do)."""

from __future__ import annotations

import time

import grpc
import pytest

from brain.api.pb.authpb import auth_pb2
from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.differential.auth_session import AS_USERS, CN_SESSION, KNOWN_36_DIFFERENCES, SETUP, run_session
from tests.support.brain_cluster import BrainCluster
from tests.support.etcd_cluster import EtcdCluster
from tests.support.etcd_tools import etcd_tool
from tests.support.servers import grpc_channel


class Client:
    def __init__(self, endpoint: str) -> None:
        self.channel = grpc_channel(endpoint)
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.auth = rpc_pb2_grpc.AuthStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def _md(token: str | None):
    return (("token", token),) if token else ()


def _code(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def _eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, grpc.RpcError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def brain_cluster(nats1):
    c = BrainCluster(3, nats1, lifetime=600.0)
    c.start()
    yield c
    c.cleanup()


def test_a_follower_enforces_auth_set_through_the_leader_and_honours_any_replicas_token(brain_cluster):
    c = brain_cluster
    leader = c.wait_leader()
    f1, f2 = [m for m in c.members if m is not leader]
    lc, c1, c2 = Client(leader.endpoint), Client(f1.endpoint), Client(f2.endpoint)
    try:
        a = lc.auth
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="apw"))
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="pfx"))
        a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
            name="pfx", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"/a/",
                                                 range_end=b"/a0")))
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="pfx"))
        a.AuthEnable(rpc_pb2.AuthEnableRequest())

        # a follower knows auth is on (linearizable: it applied everything above)
        assert c1.auth.AuthStatus(rpc_pb2.AuthStatusRequest()).enabled
        assert _code(c1.kv.Range, rpc_pb2.RangeRequest(key=b"/a/x")) == (
            grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")

        # a token issued by follower 1 works there at once (it answers once it
        # applied the token's record) ...
        token = c1.auth.Authenticate(rpc_pb2.AuthenticateRequest(name="alice", password="apw")).token
        c1.kv.Put(rpc_pb2.PutRequest(key=b"/a/x", value=b"0"), metadata=_md(token))
        # ... and through follower 2 once that one applied it: writes (checked
        # by the leader) and reads
        _eventually(lambda: c2.kv.Put(rpc_pb2.PutRequest(key=b"/a/x", value=b"1"), metadata=_md(token)))
        got = _eventually(lambda: c2.kv.Range(rpc_pb2.RangeRequest(key=b"/a/x"), metadata=_md(token)))
        assert [kv.value for kv in got.kvs] == [b"1"]
        for cl in (c1, c2, lc):
            assert _code(cl.kv.Range, rpc_pb2.RangeRequest(key=b"/b"), metadata=_md(token)) == (
                grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
            assert _code(cl.kv.Put, rpc_pb2.PutRequest(key=b"/b", value=b"1"), metadata=_md(token)) == (
                grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
        assert _code(c2.kv.Range, rpc_pb2.RangeRequest(key=b"/a/x"), metadata=_md("bogus.1")) == (
            grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")

        # a revocation through the leader is enforced by the followers
        root = lc.auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw")).token
        lc.auth.RoleRevokePermission(rpc_pb2.AuthRoleRevokePermissionRequest(role="pfx", key=b"/a/",
                                                                               range_end=b"/a0"),
                                     metadata=_md(root))
        for cl in (c1, c2):
            assert _eventually(lambda cl=cl: _code(cl.kv.Range, rpc_pb2.RangeRequest(key=b"/a/x", serializable=True),
                                                   metadata=_md(token))
                               if _code(cl.auth.AuthStatus, rpc_pb2.AuthStatusRequest(), metadata=_md(root))[0]
                               == grpc.StatusCode.OK else None) == (
                grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")

        # a restarted follower keeps users, roles and auth on; its tokens are gone
        c1.close()
        f1.restart()
        c1 = Client(f1.endpoint)
        assert _eventually(lambda: c1.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), metadata=_md(
            c1.auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw")).token)).enabled)
        assert _code(c1.kv.Range, rpc_pb2.RangeRequest(key=b"/a/x"), metadata=_md(token)) == (
            grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
        assert _code(c1.kv.Range, rpc_pb2.RangeRequest(key=b"/a/x")) == (
            grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
    finally:
        for cl in (lc, c1, c2):
            cl.close()


def test_etcd_members_each_honour_a_simple_token_issued_through_another(etcd_cluster_factory):
    """What brain does (above) is what etcd 3.6 does: its Authenticate is a
    raft entry every member applies, assigning the token there too."""
    c = etcd_cluster_factory(3)
    first, second = c.members[0], c.members[1]
    a, b = Client(first.endpoint), Client(second.endpoint)
    try:
        a.auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
        a.auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
        a.auth.AuthEnable(rpc_pb2.AuthEnableRequest())
        token = a.auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw")).token
        _eventually(lambda: b.kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=_md(token)))
        assert [kv.value for kv in b.kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=_md(token)).kvs] == [b"v"]
        assert _code(b.kv.Range, rpc_pb2.RangeRequest(key=b"k"), metadata=_md("bogus.1")) == (
            grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
    finally:
        a.close()
        b.close()


def _leader_first(cluster) -> list[str]:
    """The members' endpoints, the leader's first: a step's member is then
    the leader or a follower alike on brain and on etcd (etcdctl
    move-leader answers according to whether its endpoint leads)."""
    leader = cluster.wait_leader()
    return [leader.endpoint, *(m.endpoint for m in cluster.members if m is not leader)]


# Where an etcd 3.6.16 cluster answers the session otherwise than a 3.7
# cluster (and brain's): AuthStatus without a user (KNOWN_36_DIFFERENCES),
# and alice's txn refused with "permission denied" by the follower it went
# through (its success branch reads /other) is applied by the leader and the
# other follower all the same, so root's listing through that other
# follower shows /app/z while the follower that refused has none: 3.6's
# members diverge; 3.7's refuse it on every member, as brain's replicas do.
CLUSTER_36_DIFFERENCES = [*KNOWN_36_DIFFERENCES, ["--user=root:rootpw", "get", "", "--prefix", "--keys-only"]]


def test_the_etcdctl_auth_session_on_a_cluster_answers_as_an_etcd_cluster(nats_cluster_factory, etcd36_bin):
    """The auth session of tests/differential/test_auth_vs_etcd.py on brain x3
    (NATS x3), etcd 3.7 x3 and etcd 3.6 x3, each step through the next
    member (leader, follower, follower, ...): a user, role, permission or
    auth change made through one member is what the next one enforces, a
    password is checked and a token issued by a member the user was not
    added through.  Every step's exit code, stdout and stderr is compared
    with 3.7's, and with 3.6's but for CLUSTER_36_DIFFERENCES."""
    ctl = etcd_tool("etcdctl-3.7")
    steps = SETUP + AS_USERS
    want = {}
    for version, binary in (("3.7", etcd_tool("etcd-3.7")), ("3.6", etcd36_bin)):
        etcd = EtcdCluster(3, binary=binary, lifetime=600.0)
        try:
            etcd.start()
            want[version] = run_session(ctl, _leader_first(etcd), steps)
        finally:
            etcd.cleanup()
    nats = nats_cluster_factory(3)
    brain = BrainCluster(3, nats, lifetime=600.0)
    try:
        brain.start()
        got = run_session(ctl, _leader_first(brain), steps)
    finally:
        brain.cleanup()
    assert len(got) == len(steps)
    for version in ("3.7", "3.6"):
        mismatches = [f"step {i} {b[0]}:\n  brain x3    {b[1:]}\n  etcd {version} x3 {e[1:]}"
                      for i, (b, e) in enumerate(zip(got, want[version])) if b != e]
        differing = [b[0] for b, e in zip(got, want[version]) if b != e]
        assert differing == ([] if version == "3.7" else CLUSTER_36_DIFFERENCES), "\n".join(mismatches)
    # the session ran: refusals as well as changes
    assert sum(1 for step in got if step[1] != 0) >= 30


def test_over_mutual_tls_the_certificate_name_is_the_user_through_every_member(nats_cluster_factory):
    """The mutual-TLS session (the client certificate's common name as the
    user) on brain x3 and etcd 3.7 x3, both listening on https with
    --client-cert-auth, each step through the next member: the name's grant
    made through one member lets its write through a follower (forwarded to
    the leader with the name it was checked as) and its refusal is the same
    on every member."""
    ctl = etcd_tool("etcdctl-3.7")
    etcd = EtcdCluster(3, binary=etcd_tool("etcd-3.7"), lifetime=600.0, tls=True)
    try:
        etcd.start()
        want = run_session(ctl, _leader_first(etcd), CN_SESSION)
    finally:
        etcd.cleanup()
    brain = BrainCluster(3, nats_cluster_factory(3), lifetime=600.0, tls=True)
    try:
        brain.start()
        members = _leader_first(brain)
        assert all(m.tls is not None for m in members)  # every step over mutual TLS
        got = run_session(ctl, members, CN_SESSION)
    finally:
        brain.cleanup()
    mismatches = [f"step {i} {b[0]}:\n  brain x3    {b[1:]}\n  etcd 3.7 x3 {e[1:]}"
                  for i, (b, e) in enumerate(zip(got, want)) if b != e]
    assert not mismatches, "\n".join(mismatches)
    # the name's put went through a follower (step 8: member 2) and was
    # taken; the put outside its prefix (step 10: member 1) was refused
    assert CN_SESSION[8][:2] == ["put", "/cn/a"] and got[8][1] == 0
    assert CN_SESSION[10][:2] == ["put", "/x"] and got[10][1] != 0
