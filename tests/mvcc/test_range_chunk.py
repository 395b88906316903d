"""Store.range_chunk (a RangeStream chunk) against the reference model.

A chunk is the limited Range without its total count: the same kvs and
``more`` as Range, and a count of what the walk collected, min(limit+1,
keys left), as etcd's index walk reports it.  It must also stop walking
once it has limit+1 keys, from the overlay as from the blocks.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brain.backend import MemoryBackend
from brain.mvcc import errors
from brain.mvcc.requests import DeleteRangeRequest, PutRequest, RangeRequest
from brain.mvcc.shard import Shard
from brain.mvcc.store import Store

from .model import Model

KEYS = [b"a", b"ab", b"b", b"c", b"k", b"ka", b"m", b"t", b"z"]

writes = st.lists(st.tuples(st.booleans(), st.sampled_from(KEYS), st.binary(max_size=4)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(layout=st.sampled_from([[], [b"b", b"k"]]), program=writes,
       key=st.sampled_from(KEYS), end=st.sampled_from([b"", b"\x00", b"c", b"l"]),
       rev=st.integers(0, 45), limit=st.integers(-1, 10))
def test_chunk_matches_model(layout, program, key, end, rev, limit):
    store = Store(MemoryBackend(len(layout) + 1), layout)
    m = Model()
    for is_put, k, value in program:
        w = m.begin()
        if is_put:
            store.apply([PutRequest(k, value)])
            w.put(k, value)
        else:
            store.apply([DeleteRangeRequest(k)])
            w.delete(k, b"")
        w.commit()
    req = RangeRequest(key, end, limit=limit, revision=rev)
    try:
        kvs, total, more = m.range(key, end, rev, max(limit, 0))
    except errors.EtcdError as e:
        try:
            store.range_chunk(req, store.revision)
        except errors.EtcdError as got:
            assert got == e
            return
        raise AssertionError(f"expected {e}")
    res = store.range_chunk(req, store.revision)
    assert (res.key_values(), res.more, res.revision) == (kvs, more, m.rev)
    assert res.count == (min(limit + 1, total) if limit > 0 else total)


@pytest.mark.parametrize("tier", ["overlay", "blocks"])
def test_chunk_stops_after_limit_plus_one(monkeypatch, tier):
    store = Store(MemoryBackend(1), [], block_size=16)
    for i in range(100):
        store.apply([PutRequest(b"k%03d" % i, b"v")])
    if tier == "blocks":
        store.shards[0].merge(1 << 30, 0)
        assert not store.shards[0].overlay
    collected = []
    original = Shard.visible

    def counting(shard, start, end, at_main, out, room):
        original(shard, start, end, at_main, out, room)
        collected.append(len(out.keys))

    monkeypatch.setattr(Shard, "visible", counting)
    res = store.range_chunk(RangeRequest(b"k", b"l", limit=10), store.revision)
    assert len(res.keys) == 10 and res.more and res.count == 11
    assert collected == [11]
