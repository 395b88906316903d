"""brain.mvcc.validation.txn_writes_nothing over nested Txns."""

from brain.mvcc.requests import DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest
from brain.mvcc.validation import txn_writes_nothing


def _txn(success=(), failure=()) -> TxnRequest:
    return TxnRequest([], list(success), list(failure))


def test_a_txn_of_ranges_writes_nothing():
    assert txn_writes_nothing(_txn())
    assert txn_writes_nothing(_txn([RangeRequest(b"a")], [RangeRequest(b"b")]))


def test_a_put_or_delete_in_either_branch_is_a_write():
    assert not txn_writes_nothing(_txn([RangeRequest(b"a")], [PutRequest(b"a", b"v")]))
    assert not txn_writes_nothing(_txn([DeleteRangeRequest(b"a")]))


def test_nested_txns_are_looked_into_at_any_depth():
    ranges_only = _txn([_txn([RangeRequest(b"a")], [_txn(failure=[RangeRequest(b"b")])])])
    assert txn_writes_nothing(ranges_only)
    deep_put = _txn([RangeRequest(b"a")], [_txn([_txn(failure=[PutRequest(b"k", b"v")])])])
    assert not txn_writes_nothing(deep_put)
    deep_delete = _txn([_txn(), _txn([_txn([DeleteRangeRequest(b"k")])])])
    assert not txn_writes_nothing(deep_delete)
