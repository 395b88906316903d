"""The Auth service answers a change only once this replica applied it.

On a cluster a follower's forwarded write comes back when the leader
decided it, and its answer waits until the follower applied that key
revision; an auth change makes none, so the service itself waits for the
auth revision the change made, or for the simple token, to be applied
here (an etcd member answers once it applied the raft entry).  Here an
engine that applies 0.3 s after deciding stands in for such a follower."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import bcrypt

from brain.api.auth import AuthService
from brain.api.auth_tokens import SimpleTokens
from brain.api.authz import Gate
from brain.api.native_pool import PoolContext
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.engine.tokens import TokenTable
from brain.mvcc.auth import AuthState, User
from brain.mvcc.auth_apply import TOKEN_ASSIGN
from brain.mvcc.requests import AuthResult, Authorized

LAG = 0.3


class LaggingEngine:
    """Decides at once, applies LAG seconds later (a follower behind)."""

    cluster_id = member_id = term = raft_term = leader_id = 1
    committed_rev = 1

    def __init__(self) -> None:
        hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4, prefix=b"2a"))
        self.auth = AuthState(True, 5, {"root": User("root", hashed, ("root",))})
        self.tokens = TokenTable()

    def wait_linearizable(self) -> None:
        pass

    def submit(self, request) -> Future:
        request = request.request if type(request) is Authorized else request
        fut: Future = Future()
        token = getattr(request, "token", "")
        revision = self.auth.revision + (0 if token else 1)
        fut.set_result(AuthResult(1, revision))

        def apply() -> None:
            time.sleep(LAG)
            if token:
                self.tokens.apply([(TOKEN_ASSIGN, token, request.name)])
            else:
                self.auth = AuthState(True, revision, dict(self.auth.users))

        threading.Thread(target=apply, daemon=True).start()
        return fut


def _service(engine) -> AuthService:
    return AuthService(engine, Gate(engine, SimpleTokens(engine.tokens)), bcrypt_cost=4)


def test_a_change_is_answered_once_applied_here():
    engine = LaggingEngine()
    service = _service(engine)
    token = service.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="pw"), PoolContext()).token
    started = time.monotonic()
    service.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="r"), PoolContext((None, token)))
    assert time.monotonic() - started >= LAG * 0.9
    assert engine.auth.revision == 6


def test_a_simple_token_is_answered_once_this_replica_knows_it():
    engine = LaggingEngine()
    started = time.monotonic()
    token = _service(engine).Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="pw"),
                                          PoolContext()).token
    assert time.monotonic() - started >= LAG * 0.9
    assert engine.tokens.user_of(token) == "root"


def test_passwords_are_hashed_at_the_bcrypt_cost_given_and_etcds_default_otherwise():
    hashes = []

    class Recording(LaggingEngine):
        def submit(self, request):
            inner = request.request if type(request) is Authorized else request
            if hasattr(inner, "password_hash"):
                hashes.append(inner.password_hash)
            return super().submit(request)

    engine = Recording()
    token = _service(engine).Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="pw"), PoolContext()).token
    for cost in (5, 99):  # 99: out of bcrypt's range, etcd's default 10 instead
        AuthService(engine, Gate(engine, SimpleTokens(engine.tokens)), bcrypt_cost=cost).UserAdd(
            rpc_pb2.AuthUserAddRequest(name=f"u{cost}", password="secret"), PoolContext((None, token)))
    assert [h[:7] for h in hashes] == [b"$2a$05$", b"$2a$10$"]
    assert bcrypt.checkpw(b"secret", hashes[0])
