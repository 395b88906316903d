"""kube-apiserver's create and update Txns take a short way through the
store (brain.mvcc.txn._apply_update): every answer, error, journal payload
and later state must equal the general path's (apply_txn_general) for the
same sequence of Txns, leases and deletes, on two stores fed alike."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brain.backend.memory import MemoryBackend
from brain.mvcc import errors, txn
from brain.mvcc.codec import BatchEncoder
from brain.mvcc.requests import (
    CMP_EQUAL,
    CMP_MOD,
    CMP_VERSION,
    Compare,
    DeleteRangeRequest,
    LeaseGrantRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from brain.mvcc.revision import main_of
from brain.mvcc.store import Store

KEYS = [b"/registry/leases/n1", b"/registry/leases/n2", b"/registry/pods/p1"]

ops = st.lists(st.one_of(
    # (kind, key, seen: revision offset to compare on, lease, with an Else, shape tweak)
    st.tuples(st.just("update"), st.sampled_from(KEYS), st.integers(-2, 1), st.sampled_from([0, 7, 9]),
              st.booleans(), st.sampled_from(["", "", "", "version", "prev_kv", "range_limit", "two"])),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("grant"), st.sampled_from([7, 8])),
), max_size=40)


def _txn(store: Store, key: bytes, seen_offset: int, lease: int, with_else: bool, tweak: str) -> TxnRequest:
    ki = store.shard_for_key(key).get(key)
    found = ki.get(store.revision) if ki is not None else None
    mod = main_of(found[0]) if found is not None else 0  # the revision the client last saw
    seen = max(0, mod + seen_offset) if seen_offset != -2 else 0  # 0: a create
    target = CMP_VERSION if tweak == "version" else CMP_MOD
    union = "version" if tweak == "version" else "mod_revision"
    put = PutRequest(key, b"v%d" % store.revision, lease, prev_kv=tweak == "prev_kv")
    get = RangeRequest(key, limit=1 if tweak == "range_limit" else 0)
    success = [put, RangeRequest(key)] if tweak == "two" else [put]
    return TxnRequest([Compare(CMP_EQUAL, target, key, b"", union, seen)], success, [get] if with_else else [])


def _apply(store: Store, req, general: bool):
    enc = BatchEncoder()
    try:
        if isinstance(req, TxnRequest):
            res = (txn.apply_txn_general if general else txn.apply_txn)(store, req, enc)
        else:
            res, payload = store.apply([req])
            return res[0], payload
    except errors.EtcdError as e:
        res = e
    return res, enc.finish()


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_short_way_answers_and_journals_as_the_general_path(program):
    fast, general = Store(MemoryBackend(1), []), Store(MemoryBackend(1), [])
    for op in program:
        if op[0] == "update":
            reqs = [_txn(s, *op[1:]) for s in (fast, general)]
            assert reqs[0] == reqs[1]
        elif op[0] == "delete":
            reqs = [DeleteRangeRequest(op[1])] * 2
        else:
            reqs = [LeaseGrantRequest(60, op[1])] * 2
        got_fast = _apply(fast, reqs[0], general=False)
        got_general = _apply(general, reqs[1], general=True)
        assert got_fast == got_general, op
        assert fast.revision == general.revision
    for key in KEYS:
        assert fast.range(RangeRequest(key), fast.revision) == general.range(RangeRequest(key), general.revision)


def test_a_renewal_a_conflict_and_a_create_take_the_short_way():
    store = Store(MemoryBackend(1), [])
    key = KEYS[0]
    created = txn.apply_txn(store, _txn(store, key, -2, 0, False, ""), BatchEncoder())
    assert created.succeeded and created.revision == 2
    renewed = txn.apply_txn(store, _txn(store, key, 0, 0, True, ""), BatchEncoder())
    assert renewed.succeeded and renewed.revision == 3
    stale = txn.apply_txn(store, _txn(store, key, -1, 0, True, ""), BatchEncoder())
    assert not stale.succeeded and stale.revision == 3
    assert stale.responses[0].kvs[0].mod_revision == 3 and stale.responses[0].kvs[0].value == b"v2"
