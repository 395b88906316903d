"""The write transaction (etcd's storeTxnWrite) and the write requests that
run in one: Put, DeleteRange, Txn and lease revoke; lease grant, which
writes no key, is here beside them.  A read-only Txn is served without one.

A write transaction takes the store's next main revision: every change it
makes shares main revision begin+1 and is numbered by sub in the order it
happens, each change is added to the batch's journal payload as it is made,
and the store's revision moves only at end().  Reads inside the transaction
happen at `read_rev`, so they see its own writes.  A Txn first evaluates
every guard it will take and checks every error that depends on state
(etcd's checkRequests), so an error leaves nothing half written.

Worked example.  The store is at revision 5; "a" was created at 3 and put
again at 5 (version 2), "c" was created at 4, "b" does not exist.  A Txn
comparing version("a") == 2 with success [put a=x, range a, delete c,
put b=y, range b] (a key written twice in one Txn is refused up front):

* the guard is evaluated at 5, before any write: true, so the path is
  [True] and only `success` runs; its checks find nothing to refuse;
* the transaction begins at 5 with sub 0, read_rev 5;
* put a writes revision 6.0 (main 6, sub 0) and starts the payload's
  revision 6; read_rev is now 6;
* range a reads at 6 and sees a=x, mod 6, created 3, version 3;
* delete c writes the tombstone 6.1; put b writes 6.2 (b created 6,
  version 1); range b at 6 sees it;
* end() moves the store to revision 6: the payload holds one revision, 6,
  with three changes, and the Txn's header revision is 6.

Had the branch held only ranges, sub would have stayed 0: read_rev 5,
end() changes nothing and the header says 5, as etcd answers.
"""

from __future__ import annotations

from . import auth_apply, errors, validation
from .auth import ROLE_DELETE, ROLE_PUT, STATUS, USER_DELETE, USER_PUT
from .codec import (
    AUTH_ROLE_DELETE,
    AUTH_ROLE_PUT,
    AUTH_STATUS,
    AUTH_TOKEN_ASSIGN,
    AUTH_TOKENS_DROPPED,
    AUTH_TOKENS_OF_USER_DROPPED,
    AUTH_USER_DELETE,
    AUTH_USER_PUT,
    BatchEncoder,
)
from .lease import MAX_LEASE_TTL
from .reads import execute_range, get_kv, key_indexes, key_value, range_end_bound
from .requests import (
    AuthResult,
    CMP_CREATE,
    CMP_EQUAL,
    CMP_GREATER,
    CMP_LEASE,
    CMP_LESS,
    CMP_MOD,
    CMP_NOT_EQUAL,
    CMP_VALUE,
    CMP_VERSION,
    Compare,
    DeleteRangeRequest,
    DeleteRangeResult,
    EmptyResult,
    KeyValue,
    LeaseGrantRequest,
    LeaseGrantResult,
    LeaseRevokeRequest,
    LeaseRevokeResult,
    PutRequest,
    PutResult,
    RangeRequest,
    TxnRequest,
    TxnResult,
)
from .revision import main_of, pack
from .store_core import StoreCore

_UNION_FOR_TARGET = {
    CMP_VERSION: "version",
    CMP_CREATE: "create_revision",
    CMP_MOD: "mod_revision",
    CMP_VALUE: "value",
    CMP_LEASE: "lease",
}


class Write:
    """The changes of one write request: they all share main revision
    begin+1 and are numbered by sub in the order they happen."""

    __slots__ = ("store", "begin", "sub", "enc")

    def __init__(self, store: StoreCore, enc: BatchEncoder) -> None:
        self.store = store
        self.begin = store.revision
        self.sub = 0
        self.enc = enc

    @property
    def read_rev(self) -> int:
        return self.begin + 1 if self.sub else self.begin

    def _next(self) -> int:
        if self.sub == 0:
            self.enc.begin_revision(self.begin + 1)
        rev = pack(self.begin + 1, self.sub)
        self.sub += 1
        return rev

    def put(self, key: bytes, value: bytes, lease: int) -> int:
        rev = self._next()
        self.enc.put(key, value, lease)
        self.store.put_at(rev, key, value, lease)
        return self.begin + 1

    def delete(self, key: bytes) -> None:
        rev = self._next()
        self.enc.delete(key)
        self.store.delete_at(rev, key)

    def end(self) -> None:
        if self.sub:
            self.store.finish_revision(self.begin + 1)


# ----------------------------------------------------------------------
# single writes


def _do_put(store: StoreCore, p: PutRequest, w: Write) -> PutResult:
    prev = None
    if p.ignore_value or p.ignore_lease or p.prev_kv:
        prev = get_kv(store, p.key, w.read_rev)
    value = prev.value if p.ignore_value else p.value
    lease = prev.lease if p.ignore_lease else p.lease
    rev = w.put(p.key, value, lease)
    return PutResult(rev, prev if p.prev_kv else None)


def _do_delete(store: StoreCore, d: DeleteRangeRequest, w: Write) -> DeleteRangeResult:
    at = w.read_rev
    end = range_end_bound(d.range_end)
    victims = [ki for ki in key_indexes(store, d.key, end) if ki.get(at) is not None]
    prev_kvs = [key_value(store, ki, ki.get(at)) for ki in victims] if d.prev_kv else []
    for ki in victims:
        w.delete(ki.key)
    rev = w.begin + 1 if w.sub else w.begin
    return DeleteRangeResult(rev, len(victims), prev_kvs)


def _check_put_state(store: StoreCore, p: PutRequest, at: int) -> None:
    """A top-level Put's state checks, lease first (etcd's order)."""
    if p.lease and not store.lessor.exists(p.lease):
        raise errors.ErrLeaseNotFound.fresh()
    if (p.ignore_value or p.ignore_lease) and get_kv(store, p.key, at) is None:
        raise errors.ErrKeyNotFound.fresh()


def apply_put(store: StoreCore, p: PutRequest, enc: BatchEncoder) -> PutResult:
    validation.check_put(p)
    _check_put_state(store, p, store.revision)
    w = Write(store, enc)
    res = _do_put(store, p, w)
    w.end()
    return res


def apply_delete(store: StoreCore, d: DeleteRangeRequest, enc: BatchEncoder) -> DeleteRangeResult:
    validation.check_delete(d)
    w = Write(store, enc)
    res = _do_delete(store, d, w)
    w.end()
    return res


# ----------------------------------------------------------------------
# Txn


def _compare(store: StoreCore, c: Compare, at: int) -> bool:
    end = range_end_bound(c.range_end)
    kvs = [key_value(store, ki, f) for ki in key_indexes(store, c.key, end) if (f := ki.get(at)) is not None]
    if not kvs:
        if c.target == CMP_VALUE:
            return False  # a missing key has no value to compare
        return _compare_kv(c, KeyValue(b"", 0, 0, 0, b"", 0))
    return all(_compare_kv(c, kv) for kv in kvs)


def _path(store: StoreCore, t: TxnRequest, at: int, path: list[bool]) -> None:
    """Evaluate every guard the Txn will take, nested ones included,
    against the state before the Txn (as etcd does)."""
    ok = all(_compare(store, c, at) for c in t.compare)
    path.append(ok)
    for op in t.success if ok else t.failure:
        if isinstance(op, TxnRequest):
            _path(store, op, at, path)


def _check_txn_ops(store: StoreCore, t: TxnRequest, at: int, path: list[bool], pos: int, kind: str) -> int:
    """etcd's checkRequests over the branches the Txn will take: errors
    that depend on state, found before any write.  etcd runs it twice,
    first for puts (write Txns only), then for ranges, so a put's error
    wins over a range's."""
    ops = t.success if path[pos] else t.failure
    pos += 1
    for op in ops:
        if isinstance(op, RangeRequest):
            if kind == "range":
                if op.revision > at:
                    raise errors.ErrFutureRev.fresh()
                if op.revision and op.revision < store.compact_rev:
                    raise errors.ErrCompacted.fresh()
        elif isinstance(op, PutRequest):
            if kind == "put":
                if (op.ignore_value or op.ignore_lease) and get_kv(store, op.key, at) is None:
                    raise errors.ErrKeyNotFound.fresh()
                if op.lease and not store.lessor.exists(op.lease):
                    raise errors.ErrLeaseNotFound.fresh()
        elif isinstance(op, TxnRequest):
            pos = _check_txn_ops(store, op, at, path, pos, kind)
    return pos


def _check_txn(store: StoreCore, t: TxnRequest, at: int, path: list[bool], write: bool) -> None:
    if write:
        _check_txn_ops(store, t, at, path, 0, "put")
    _check_txn_ops(store, t, at, path, 0, "range")


def _execute(store: StoreCore, t: TxnRequest, w: Write | None, view: int, path: list[bool], pos: int,
             out: list) -> int:
    ok = path[pos]
    pos += 1
    for op in t.success if ok else t.failure:
        if isinstance(op, RangeRequest):
            out.append(execute_range(store, op, w.read_rev if w else view))
        elif isinstance(op, PutRequest):
            out.append(_do_put(store, op, w))
        elif isinstance(op, DeleteRangeRequest):
            out.append(_do_delete(store, op, w))
        elif isinstance(op, TxnRequest):
            sub: list = []
            sub_ok = path[pos]
            pos = _execute(store, op, w, view, path, pos, sub)
            # etcd leaves a nested Txn's header empty (revision 0).
            out.append(TxnResult(0, sub_ok, sub))
        else:
            out.append(EmptyResult())
    return pos


def txn_readonly(store: StoreCore, t: TxnRequest, view: int) -> TxnResult:
    """A Txn with no puts or deletes in any branch, served at `view`."""
    validation.check_txn(t, store.max_txn_ops)
    path: list[bool] = []
    _path(store, t, view, path)
    _check_txn(store, t, view, path, write=False)
    out: list = []
    _execute(store, t, None, view, path, 0, out)
    return TxnResult(view, path[0], out)


def apply_txn(store: StoreCore, t: TxnRequest, enc: BatchEncoder) -> TxnResult:
    update = _optimistic_update(store, t)
    if update is not None:
        return _apply_update(store, t, update, enc)
    return apply_txn_general(store, t, enc)


def apply_txn_general(store: StoreCore, t: TxnRequest, enc: BatchEncoder) -> TxnResult:
    """Any Txn, the way etcd runs one: the path of every guard first, the
    state checks, then the branches in order."""
    validation.check_txn(t, store.max_txn_ops)
    at = store.revision
    path: list[bool] = []
    _path(store, t, at, path)
    _check_txn(store, t, at, path, write=not validation.txn_writes_nothing(t))
    w = Write(store, enc)
    out: list = []
    _execute(store, t, w, at, path, 0, out)
    rev = w.read_rev
    w.end()
    return TxnResult(rev, path[0], out)


# ----------------------------------------------------------------------
# kube-apiserver's optimistic update, the commonest write of a cluster

def _optimistic_update(store: StoreCore, t: TxnRequest) -> PutRequest | None:
    """The Put of a Txn shaped as kube-apiserver's create and update
    (GuaranteedUpdate: a node Lease renewed every 10 s is one),
    ``If(mod_revision(k) == r) Then(Put k) Else(Range k)`` with no Else on
    a create, or None for any other Txn.  Such a Txn passes every check of
    ``validation.check_txn`` (one op a branch, a non-empty key, one put),
    and ``_apply_update`` decides it as the general path does, without
    building its path or reading the key's record to compare a revision."""
    compare, success, failure = t.compare, t.success, t.failure
    if len(compare) != 1 or len(success) != 1 or len(failure) > 1 or store.max_txn_ops < 1:
        return None
    c, p = compare[0], success[0]
    if (type(p) is not PutRequest or c.target != CMP_MOD or c.result != CMP_EQUAL or c.range_end
            or c.union != "mod_revision" or type(c.operand) is not int or not c.key or p.key != c.key
            or p.ignore_value or p.ignore_lease or p.prev_kv):
        return None
    if failure:
        g = failure[0]
        if type(g) is not RangeRequest or g != RangeRequest(c.key, serializable=g.serializable):
            return None
    return p


def _apply_update(store: StoreCore, t: TxnRequest, p: PutRequest, enc: BatchEncoder) -> TxnResult:
    """apply_txn for ``_optimistic_update``'s shape: compare the key's mod
    revision from the index alone, then put, or read it back."""
    at = store.revision
    history = store.shard_for_key(p.key).get(p.key)
    found = history.get(at) if history is not None else None
    if (main_of(found[0]) if found is not None else 0) == t.compare[0].operand:
        if p.lease and not store.lessor.exists(p.lease):
            raise errors.ErrLeaseNotFound.fresh()
        w = Write(store, enc)
        rev = w.put(p.key, p.value, p.lease)
        w.end()
        return TxnResult(rev, True, [PutResult(rev, None)])
    return TxnResult(at, False, [execute_range(store, g, at) for g in t.failure])


def _compare_kv(c: Compare, kv: KeyValue) -> bool:
    operand = c.operand if c.union == _UNION_FOR_TARGET.get(c.target) else None
    t = c.target
    if t == CMP_VALUE:
        a, b = kv.value, operand if operand is not None else b""
    elif t == CMP_CREATE:
        a, b = kv.create_revision, operand or 0
    elif t == CMP_MOD:
        a, b = kv.mod_revision, operand or 0
    elif t == CMP_VERSION:
        a, b = kv.version, operand or 0
    elif t == CMP_LEASE:
        a, b = kv.lease, operand or 0
    else:
        return True
    r = c.result
    if r == CMP_EQUAL:
        return a == b
    if r == CMP_NOT_EQUAL:
        return a != b
    if r == CMP_GREATER:
        return a > b
    if r == CMP_LESS:
        return a < b
    return True


# ----------------------------------------------------------------------
# leases (bookkeeping; deadlines live in the engine)


def apply_lease_grant(store: StoreCore, g: LeaseGrantRequest, enc: BatchEncoder) -> LeaseGrantResult:
    if g.ttl > MAX_LEASE_TTL:
        raise errors.ErrLeaseTTLTooLarge.fresh()
    if g.id in store.lessor.leases:
        raise errors.ErrLeaseExist.fresh()
    store.lessor.grant(g.id, g.ttl)
    enc.lease_grant(g.id, g.ttl)
    return LeaseGrantResult(store.revision, g.id, g.ttl)


def apply_lease_revoke(store: StoreCore, r: LeaseRevokeRequest, enc: BatchEncoder) -> LeaseRevokeResult:
    lease = store.lessor.leases.get(r.id)
    if lease is None:
        raise errors.ErrLeaseNotFound.fresh()
    w = Write(store, enc)
    for key in sorted(lease.keys):
        w.delete(key)
    w.end()
    enc.lease_revoke(r.id)
    store.lessor.remove(r.id)
    return LeaseRevokeResult(store.revision)


# ----------------------------------------------------------------------
# auth requests (decided by brain.mvcc.auth_apply, journaled as effects)


def apply_auth(store: StoreCore, req, enc: BatchEncoder) -> AuthResult:
    """Decide an auth request on the store's auth state and journal its
    effects; the store takes the new state (Store.set_auth)."""
    decision = auth_apply.decide(store.auth, req)
    for effect in decision.effects:
        encode_auth_effect(enc, effect)
    for effect in decision.token_effects:
        encode_token_effect(enc, effect)
    state = store.auth.changed(decision.effects)
    store.set_auth(state, decision.token_effects)
    return AuthResult(store.revision, state.revision)


def encode_auth_effect(enc: BatchEncoder, effect) -> None:
    kind = effect[0]
    if kind == USER_PUT:
        u = effect[1]
        enc.auth(AUTH_USER_PUT, u.name, u.password, u.no_password, u.roles)
    elif kind == USER_DELETE:
        enc.auth(AUTH_USER_DELETE, effect[1])
    elif kind == ROLE_PUT:
        r = effect[1]
        enc.auth(AUTH_ROLE_PUT, r.name, [(p.perm_type, p.key, p.range_end) for p in r.perms])
    elif kind == ROLE_DELETE:
        enc.auth(AUTH_ROLE_DELETE, effect[1])
    elif kind == STATUS:
        enc.auth(AUTH_STATUS, effect[1], effect[2])
    else:
        raise ValueError(f"unknown auth effect {kind}")


def encode_token_effect(enc: BatchEncoder, effect) -> None:
    kind = effect[0]
    if kind == auth_apply.TOKEN_ASSIGN:
        enc.auth(AUTH_TOKEN_ASSIGN, effect[1], effect[2])
    elif kind == auth_apply.TOKENS_OF_USER_DROPPED:
        enc.auth(AUTH_TOKENS_OF_USER_DROPPED, effect[1])
    else:
        enc.auth(AUTH_TOKENS_DROPPED)
