"""Range's sorted and filtered requests (brain.mvcc.reads.execute_range
outside the columnar path): etcd walks limit+1 keys in key order when the
request names no sort order, sorts those, then cuts to the limit."""

from __future__ import annotations

import pytest

from brain.backend import MemoryBackend
from brain.mvcc import reads
from brain.mvcc.requests import SORT_DESCEND, SORT_NONE, TARGET_KEY, TARGET_VERSION, PutRequest, RangeRequest
from brain.mvcc.store import Store


@pytest.fixture(params=["overlay", "blocks"])
def store(request) -> Store:
    """a at version 3, then b, c, d at version 1."""
    s = Store(MemoryBackend(1), [], block_size=2)
    for key in (b"a", b"a", b"a", b"b", b"c", b"d"):
        s.apply([PutRequest(key, b"v")])
    if request.param == "blocks":
        s.shards[0].merge(1 << 30, 0)
    return s


def test_order_none_with_a_sort_target_sorts_the_limited_walk(store):
    r = RangeRequest(b"a", b"z", limit=2, sort_order=SORT_NONE, sort_target=TARGET_VERSION)
    assert not reads.is_columnar(r)
    res = store.range(r, store.revision)
    # a, b, c walked (limit+1), sorted by version (stable): b, c, a; cut to 2
    assert [kv.key for kv in res.kvs] == [b"b", b"c"]
    assert (res.more, res.count) == (True, 4)


def test_a_sort_order_reads_the_whole_range_first(store):
    r = RangeRequest(b"a", b"z", limit=2, sort_order=SORT_DESCEND, sort_target=TARGET_KEY)
    res = store.range(r, store.revision)
    assert [kv.key for kv in res.kvs] == [b"d", b"c"]
    assert (res.more, res.count) == (True, 4)


def test_columns_and_key_values_agree(store):
    r = RangeRequest(b"a", b"z", limit=3, keys_only=True)
    assert reads.is_columnar(r)
    cols = store.range_columns(r, store.revision)
    assert cols.values is None
    assert cols.key_values() == store.range(r, store.revision).kvs
    assert [kv.key for kv in cols.key_values()] == [b"a", b"b", b"c"] and cols.more and cols.count == 4
