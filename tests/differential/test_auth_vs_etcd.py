"""Auth against real etcd 3.6 and 3.7: the same etcdctl 3.7 session on
brain and on each etcd, every step's stdout, stderr and exit code compared.

The session adds users (with a password and without) and roles, grants a
prefix, a single key, a range and a from-key permission, enables auth
(etcdctl makes the root role itself), then works as root, as a user with a
prefix permission, as a read-only and a write-only user, as nobody, with
a wrong password and as a user without password; it tries what only root
may (user and role listings, compaction, snapshot, defragment, hashes,
alarms), what root may not do to itself, revokes a permission and a
password and checks the user lost them, watches outside its permission,
and disables auth.  Over mutual TLS the client certificate's common name
is the user when no --user is given (etcd 3.6 and 3.7 answer that session
alike, step for step).  tests/cluster/test_auth_cluster.py runs the session
on 3-member clusters.

What differs by nature is normalized: etcdctl's retry log lines keep only
their message, method and error (their time, addresses and client ids
differ), and the IDs of response headers in JSON output.  brain behaves
as etcd 3.7: a step where etcd 3.6 and 3.7 answer differently is compared
with 3.7 only and listed in tests/differential/ETCD_BEHAVIOUR.md.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.differential.auth_session import AS_USERS, CN_SESSION, KNOWN_36_DIFFERENCES, SETUP, run_session
from tests.support.etcd_tools import etcd_tool
from tests.support.servers import Endpoint, EtcdServer, require_brain, shared_pki, start_brain

pytestmark = pytest.mark.etcd


def _compare(brain: list, etcd37: list, etcd36: list) -> list:
    """Assert brain answers as etcd 3.7 at every step and as 3.6 where 3.6
    and 3.7 agree; the steps where they do not."""
    differences, mismatches = [], []
    for b, e7, e6 in zip(brain, etcd37, etcd36):
        if b != e7:
            mismatches.append(f"step {b[0]}:\n  brain    {b[1:]}\n  etcd 3.7 {e7[1:]}")
        if e6 != e7:
            differences.append((e7[0], e6[1:], e7[1:]))
    assert not mismatches, "\n".join(mismatches)
    return differences


@pytest.fixture
def brain():
    require_brain()
    srv = start_brain()
    yield srv
    srv.cleanup()


def test_an_etcdctl_auth_session_answers_as_etcd(brain, oracle_factory):
    ctl = etcd_tool("etcdctl-3.7")
    steps = SETUP + AS_USERS
    got = run_session(ctl, brain.endpoint, steps)
    etcd37 = run_session(ctl, oracle_factory("3.7").endpoint, steps)
    etcd36 = run_session(ctl, oracle_factory("3.6").endpoint, steps)
    differences = _compare(got, etcd37, etcd36)
    # every step either changed something or was refused: the session ran
    assert sum(1 for step in got if step[1] != 0) >= 30
    assert [d[0] for d in differences] == KNOWN_36_DIFFERENCES, differences


@pytest.mark.skipif(not os.environ.get("BRAIN_AUTH_FULL"), reason="make test-full (BRAIN_AUTH_FULL=1): the session on "
                    "the grpcio front too")
def test_the_session_on_the_grpcio_front_answers_as_etcd(oracle_factory):
    require_brain()
    ctl = etcd_tool("etcdctl-3.7")
    srv = start_brain(extra_args=["--grpc-front", "grpcio"])
    try:
        got = run_session(ctl, srv.endpoint, SETUP + AS_USERS)
    finally:
        srv.cleanup()
    want = run_session(ctl, oracle_factory("3.7").endpoint, SETUP + AS_USERS)
    mismatches = [f"step {b[0]}:\n  brain    {b[1:]}\n  etcd 3.7 {e[1:]}" for b, e in zip(got, want) if b != e]
    assert not mismatches, "\n".join(mismatches)


class _TlsEtcd(EtcdServer):
    """etcd (3.6 or 3.7) on https with --client-cert-auth, the tests' PKI."""

    @property
    def client_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def endpoint(self):
        return Endpoint(f"127.0.0.1:{self.port}", shared_pki())

    def _command(self) -> list[str]:
        return [*super()._command(), *shared_pki().server_flags()]


@pytest.mark.parametrize("version", ["3.7", "3.6"])
def test_over_mutual_tls_the_certificate_name_is_the_user(version, oracle_factory):
    require_brain()
    ctl = etcd_tool("etcdctl-3.7")
    oracle_factory(version)  # that etcd is there (or the test is skipped)
    srv = start_brain(transport="mtls")
    etcd = _TlsEtcd(version=version)
    try:
        etcd.start()
        got = run_session(ctl, srv.endpoint, CN_SESSION)
        want = run_session(ctl, etcd.endpoint, CN_SESSION)
    finally:
        srv.cleanup()
        etcd.cleanup()
    for b, e in zip(got, want):
        assert b == e, f"step {b[0]}: brain {b[1:]} etcd {version} {e[1:]}"
    assert got[8][1] == 0 and got[10][1] != 0  # the name's prefix allowed, the rest refused


def _keys(tmp_path, method: str) -> str:
    """Key files for ``method``; the --auth-token value naming them."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if method.startswith("HS"):
        (tmp_path / "hmac.key").write_bytes(b"a shared secret for the test")
        return f"jwt,priv-key={tmp_path / 'hmac.key'},sign-method={method}"
    curve = ec.SECP384R1() if method == "ES384" else ec.SECP256R1()
    key = {"RS": lambda: rsa.generate_private_key(65537, 2048), "PS": lambda: rsa.generate_private_key(65537, 2048),
           "ES": lambda: ec.generate_private_key(curve), "Ed": ed25519.Ed25519PrivateKey.generate}[method[:2]]()
    pkcs = serialization.PrivateFormat.PKCS8
    (tmp_path / "priv.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, pkcs,
                                                          serialization.NoEncryption()))
    (tmp_path / "pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return f"jwt,pub-key={tmp_path / 'pub.pem'},priv-key={tmp_path / 'priv.pem'},sign-method={method}"


JWT_SETUP = [
    ["user", "add", "root", "--new-user-password=rootpw"],
    ["user", "grant-role", "root", "root"],
    ["user", "add", "alice", "--new-user-password=apw"],
    ["role", "add", "pfx"],
    ["role", "grant-permission", "pfx", "--prefix=true", "readwrite", "/app/"],
    ["user", "grant-role", "alice", "pfx"],
    ["auth", "enable"],
]


@pytest.mark.parametrize("method", ["RS256", "PS384", "ES256", "ES384", "EdDSA", "HS256"])
def test_jwt_tokens_of_etcd_and_brain_are_honoured_by_each_other(method, oracle_factory, tmp_path):
    """The same keys on etcd 3.7 and brain: a token either issues works on
    the other (same claims, same signature format), so brain's JWTs are
    etcd's; an auth change after issue makes both refuse it as old."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
    from tests.support.servers import grpc_channel

    ctl = etcd_tool("etcdctl-3.7")
    option = _keys(tmp_path, method)
    etcd = oracle_factory("3.7", extra_args=["--auth-token", option])
    require_brain()
    brain = start_brain(extra_args=["--auth-token", option])
    try:
        for server in (etcd, brain):
            for args in JWT_SETUP:
                r = subprocess.run([ctl, f"--endpoints={server.endpoint}", *args], capture_output=True, text=True,
                                   timeout=60)
                assert r.returncode == 0, (server, args, r.stderr)
        stubs = {}
        for name, server in (("etcd", etcd), ("brain", brain)):
            ch = grpc_channel(server.endpoint)
            stubs[name] = (ch, rpc_pb2_grpc.AuthStub(ch), rpc_pb2_grpc.KVStub(ch))
        tokens = {name: s[1].Authenticate(rpc_pb2.AuthenticateRequest(name="alice", password="apw")).token
                  for name, s in stubs.items()}
        assert tokens["brain"].count(".") == 2
        for issuer, token in tokens.items():
            for name, (_, _, kv) in stubs.items():
                md = (("token", token),)
                kv.Put(rpc_pb2.PutRequest(key=b"/app/k", value=issuer.encode()), metadata=md)
                with pytest.raises(grpc.RpcError) as e:
                    kv.Range(rpc_pb2.RangeRequest(key=b"/other"), metadata=md)
                assert e.value.details() == "etcdserver: permission denied", (issuer, name)
        # a change of roles after the tokens were issued: both refuse them as old
        for name, server in (("etcd", etcd), ("brain", brain)):
            r = subprocess.run([ctl, f"--endpoints={server.endpoint}", "--user=root:rootpw", "role", "add", "x"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        for issuer, token in tokens.items():
            for name, (_, _, kv) in stubs.items():
                with pytest.raises(grpc.RpcError) as e:
                    kv.Range(rpc_pb2.RangeRequest(key=b"/app/k"), metadata=(("token", token),))
                assert (e.value.code(), e.value.details()) == (
                    grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old"), (issuer, name)
        with pytest.raises(grpc.RpcError) as e:
            stubs["brain"][2].Range(rpc_pb2.RangeRequest(key=b"/app/k"), metadata=(("token", tokens["brain"][:-4] + "AAAA"),))
        assert e.value.details() == "etcdserver: invalid auth token"
        for ch, _, _ in stubs.values():
            ch.close()
    finally:
        brain.cleanup()


def test_health_and_the_token_checks_of_streams_answer_as_etcd(brain, oracle_factory):
    """With auth on: the health service names no caller (a bogus token is
    ignored), a Watch or a LeaseKeepAlive with a bogus token ends as etcd
    ends it, a Status without one is refused."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
    from brain.api.pb.grpc.health.v1 import health_pb2, health_pb2_grpc
    from tests.support.servers import grpc_channel

    ctl = etcd_tool("etcdctl-3.7")
    bogus = (("token", "bogus.1"),)

    def answers(endpoint) -> list:
        for args in (["user", "add", "root", "--new-user-password=r"], ["user", "grant-role", "root", "root"],
                     ["auth", "enable"]):
            r = subprocess.run([ctl, f"--endpoints={endpoint}", *args], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        ch = grpc_channel(endpoint)
        out = [health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), metadata=bogus).status]
        for call in (lambda: list(rpc_pb2_grpc.WatchStub(ch).Watch(iter([rpc_pb2.WatchRequest(
                         create_request=rpc_pb2.WatchCreateRequest(key=b"k"))]), metadata=bogus, timeout=3)),
                     lambda: list(rpc_pb2_grpc.LeaseStub(ch).LeaseKeepAlive(iter([rpc_pb2.LeaseKeepAliveRequest(ID=1)]),
                                                                             metadata=bogus, timeout=10)),
                     lambda: rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=10)):
            try:
                got = call()
                out.append([(r.created, r.canceled, r.cancel_reason) if hasattr(r, "cancel_reason") else r.TTL
                             for r in got])
            except grpc.RpcError as e:
                # a deadline is the client's own: its text depends on when it
                # fired ("Deadline Exceeded", "Stream removed (...)")
                out.append((e.code(), None if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else e.details()))
        ch.close()
        return out

    want = answers(oracle_factory("3.7").endpoint)
    assert answers(brain.endpoint) == want
    assert want[0] == health_pb2.HealthCheckResponse.SERVING
