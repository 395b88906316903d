"""Request checks etcd makes before a request reaches its store.

They run in etcd's order so that a request breaking two rules fails with the
same error etcd picks.  All are pure functions of the request.
"""

from __future__ import annotations

from . import errors
from .requests import (
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    SORT_DESCEND,
    TARGET_VALUE,
    TxnRequest,
)

DEFAULT_MAX_TXN_OPS = 128  # etcd's --max-txn-ops: operations in one branch of a Txn


def check_range(r: RangeRequest) -> None:
    if not r.key:
        raise errors.ErrEmptyKey.fresh()
    if not 0 <= r.sort_order <= SORT_DESCEND or not 0 <= r.sort_target <= TARGET_VALUE:
        raise errors.ErrInvalidSortOption.fresh()


def check_put(r: PutRequest) -> None:
    if not r.key:
        raise errors.ErrEmptyKey.fresh()
    if r.ignore_value and r.value:
        raise errors.ErrValueProvided.fresh()
    if r.ignore_lease and r.lease:
        raise errors.ErrLeaseProvided.fresh()


def check_delete(r: DeleteRangeRequest) -> None:
    if not r.key:
        raise errors.ErrEmptyKey.fresh()


def check_txn(r: TxnRequest, max_txn_ops: int) -> None:
    """Size and shape of a Txn, then the put/delete overlap rule."""
    _check_txn_shape(r, max_txn_ops)
    _check_intervals(r.success)
    _check_intervals(r.failure)


def _check_txn_shape(r: TxnRequest, max_txn_ops: int) -> None:
    ops = max(len(r.compare), len(r.success), len(r.failure))
    if ops > max_txn_ops:
        raise errors.ErrTooManyOps.fresh()
    for c in r.compare:
        if not c.key:
            raise errors.ErrEmptyKey.fresh()
    for branch in (r.success, r.failure):
        for op in branch:
            if isinstance(op, RangeRequest):
                check_range(op)
            elif isinstance(op, PutRequest):
                check_put(op)
            elif isinstance(op, DeleteRangeRequest):
                check_delete(op)
            elif isinstance(op, TxnRequest):
                _check_txn_shape(op, max_txn_ops)
            else:
                # etcd answers an empty RequestOp this way.
                raise errors.ErrKeyNotFound.fresh()


class _Intervals:
    """Deleted key ranges of one Txn branch: points and half-open intervals.

    etcd compares range ends literally here: a from-key delete (range_end
    "\\0") is the interval [key, "\\0"), which holds no key, so it never
    conflicts with a put.  We do the same to answer exactly as etcd does."""

    __slots__ = ("points", "ranges")

    def __init__(self) -> None:
        self.points: set[bytes] = set()
        self.ranges: list[tuple[bytes, bytes]] = []

    def add(self, key: bytes, range_end: bytes) -> None:
        if not range_end:
            self.points.add(key)
        else:
            self.ranges.append((key, range_end))

    def union(self, other: "_Intervals") -> None:
        self.points |= other.points
        self.ranges.extend(other.ranges)

    def contains(self, key: bytes) -> bool:
        if key in self.points:
            return True
        for start, end in self.ranges:
            if start <= key < end:
                return True
        return False


def _check_intervals(ops: list) -> tuple[set[bytes], _Intervals]:
    """etcd's rule: within one branch (nested Txns included) no key may be put
    twice, and no put may fall inside a deleted range.  The two branches of
    a nested Txn exclude each other, so a key they both put is allowed."""
    dels = _Intervals()
    for op in ops:
        if isinstance(op, DeleteRangeRequest):
            dels.add(op.key, op.range_end)
    puts: set[bytes] = set()
    for op in ops:
        if not isinstance(op, TxnRequest):
            continue
        puts_then, dels_then = _check_intervals(op.success)
        puts_else, dels_else = _check_intervals(op.failure)
        for k in puts_then:
            if k in puts or dels.contains(k):
                raise errors.ErrDuplicateKey.fresh()
            puts.add(k)
        for k in puts_else:
            if (k in puts and k not in puts_then) or dels.contains(k):
                raise errors.ErrDuplicateKey.fresh()
            puts.add(k)
        dels.union(dels_then)
        dels.union(dels_else)
    for op in ops:
        if isinstance(op, PutRequest):
            if op.key in puts or dels.contains(op.key):
                raise errors.ErrDuplicateKey.fresh()
            puts.add(op.key)
    return puts, dels


def txn_writes_nothing(r: TxnRequest) -> bool:
    """No branch, nested Txns included, holds a Put or a DeleteRange: applied,
    the Txn changes nothing whichever way its compares go, so the engine may
    answer it from the store without a journal record (and no quota applies).

    Not etcd's IsTxnReadonly, which calls any Txn holding a nested one a
    write: that rule, the API layer's, decides how a request is routed (read barrier or commit path, request-size limit); this one what
    applying it may change.  Every Txn etcd calls read-only writes nothing;
    a Txn whose nested Txns hold only Ranges writes nothing but is routed as
    a write.
    """
    for branch in (r.success, r.failure):
        for op in branch:
            if isinstance(op, (PutRequest, DeleteRangeRequest)):
                return False
            if isinstance(op, TxnRequest) and not txn_writes_nothing(op):
                return False
    return True


__all__ = ["check_range", "check_put", "check_delete", "check_txn", "txn_writes_nothing"]
