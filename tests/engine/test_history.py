"""Engine.history(): the committed history at a pinned revision, walked in
chunks while writes and compactions go on (the docstring's worked example)."""

from __future__ import annotations

import pytest

from brain.engine import Engine
from brain.mvcc.requests import CompactRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest
from brain.mvcc.revision import main_of
from tests.support.engines import cfg

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine(tmp_path):
    eng = Engine.open(cfg(tmp_path / "e"))  # shards split at f and p
    yield eng
    eng.close()


def walked(pinned, upto=None, **kw) -> tuple[list[tuple[int, list[int]]], int]:
    chunks = list(pinned.walk(upto, **kw))
    return [(c.shard, [main_of(r) for r in c.revisions]) for c in chunks if c.revisions], \
        sum(c.alive for c in chunks)


def test_the_worked_example(engine):
    engine.put(PutRequest(b"k", b"1"))  # 2
    engine.put(PutRequest(b"k", b"2"))  # 3
    engine.delete_range(DeleteRangeRequest(b"k"))  # 4
    engine.put(PutRequest(b"a", b"x"))  # 5, in another shard
    engine.put(PutRequest(b"k", b"3"))  # 6
    engine.compact(CompactRequest(3, physical=True))
    with engine.history().pin() as pinned:
        assert (pinned.revision, pinned.compact_revision) == (6, 3)
        assert pinned.journal_index == engine.applied_index
        assert walked(pinned) == ([(0, [5]), (1, [3, 4, 6])], 2)
        engine.put(PutRequest(b"k", b"4"))  # 7: above the pin
        engine.compact(CompactRequest(6))  # its physical part waits for the pin
        assert engine.store.compact_rev == 6  # logically at once
        assert walked(pinned) == ([(0, [5]), (1, [3, 4, 6])], 2)
        assert walked(pinned, 4) == ([(1, [3, 4])], 0)
        records = pinned.read([(1, r) for c in pinned.walk() if c.shard == 1 for r in c.revisions])
        assert [(key, value) for key, value, *_ in records] == [(b"k", b"2"), (b"k", None), (b"k", b"3")]
        with pytest.raises(ValueError, match="above the pinned revision"):
            list(pinned.walk(7))
    with pytest.raises(ValueError, match="unpinned"):
        list(pinned.walk())
    with engine.history().pin() as later:  # the compaction went ahead once unpinned
        assert (later.revision, later.compact_revision) == (7, 6)
        assert walked(later) == ([(0, [5]), (1, [6, 7])], 2)


def test_chunks_end_at_either_bound(engine):
    for i in range(30):
        engine.put(PutRequest(b"q%02d" % i, b"v"))
    engine.put(PutRequest(b"q00", b"again"))
    with engine.history().pin() as pinned:
        by_revisions = [len(c.revisions) for c in pinned.walk(revisions_per_hold=4) if c.shard == 2]
        assert sum(by_revisions) == 31 and max(by_revisions) <= 5  # a key's revisions stay together
        by_keys = [len(c.revisions) for c in pinned.walk(keys_per_hold=7) if c.shard == 2]
        assert by_keys[:4] == [8, 7, 7, 7] and sum(by_keys) == 31
        # keys newer than the walk's revision end a hold too, yielding nothing
        assert [len(c.revisions) for c in pinned.walk(1, keys_per_hold=7) if c.shard == 2] == [0] * 5


def test_leases(engine):
    engine.lease_grant(LeaseGrantRequest(60, 9))
    engine.lease_grant(LeaseGrantRequest(30, 4))
    assert engine.history().leases() == [(4, 30), (9, 60)]
