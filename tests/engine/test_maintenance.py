"""Engine-side maintenance: alarms, the quota, compaction pins."""

from __future__ import annotations

import threading

import pytest

from brain.engine.alarms import ALARM_CORRUPT, ALARM_NOSPACE
from brain.mvcc import errors
from brain.mvcc.requests import (
    CompactRequest,
    DeleteRangeRequest,
    LeaseGrantRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from tests.support.engines import dump, opened_engines

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def engines(tmp_path):
    with opened_engines(tmp_path) as make:
        yield make


def test_pinned_compaction_waits(engines):
    eng = engines("e")
    for i in range(20):
        eng.put(PutRequest(b"k", b"%d" % i))
    with eng.committer.lock:
        eng.pin_compaction()
    done = threading.Event()

    def compact():
        eng.compact(CompactRequest(15, physical=True))
        done.set()

    t = threading.Thread(target=compact)
    t.start()
    assert not done.wait(0.5)  # logical compaction answered only after the physical part
    with pytest.raises(errors.EtcdError):
        eng.range(RangeRequest(b"k", revision=10))
    eng.unpin_compaction()
    assert done.wait(5)
    t.join()


def test_nospace_alarm_is_raised_persisted_and_must_be_disarmed(engines, tmp_path):
    eng = engines("q", 1, quota_backend_bytes=64 << 10)
    with pytest.raises(errors.EtcdError) as e:
        for i in range(1000):
            eng.put(PutRequest(b"k%03d" % i, b"x" * 1024))
    assert e.value == errors.ErrNoSpace
    assert eng.alarms.get() == [(eng.member_id, ALARM_NOSPACE)]
    # deletes, compaction and read-only txns still work; lease grants do not
    eng.delete_range(DeleteRangeRequest(b"k", b"l"))
    eng.compact(CompactRequest(eng.committed_rev, physical=True))
    assert eng.txn(TxnRequest([], [RangeRequest(b"k")], [])).succeeded
    with pytest.raises(errors.EtcdError) as e:
        eng.lease_grant(LeaseGrantRequest(60, 1))
    assert e.value == errors.ErrNoSpace
    eng.checkpoint()  # what Defragment does: space is back, the alarm stays
    with pytest.raises(errors.EtcdError) as e:
        eng.put(PutRequest(b"small", b"v"))
    assert e.value == errors.ErrNoSpace
    eng.close()
    eng = engines("q", 1, quota_backend_bytes=64 << 10)
    assert eng.alarms.get() == [(eng.member_id, ALARM_NOSPACE)]  # survives a restart
    assert eng.alarm_deactivate(eng.member_id, ALARM_NOSPACE)
    assert not eng.alarm_deactivate(eng.member_id, ALARM_NOSPACE)
    eng.put(PutRequest(b"small", b"v"))
    assert eng.alarms.get() == []


def test_corrupt_alarm_refuses_writes_not_reads(engines):
    eng = engines("c")
    eng.put(PutRequest(b"k", b"v"))
    assert eng.alarm_activate(77, ALARM_CORRUPT)
    assert not eng.alarm_activate(77, ALARM_CORRUPT)
    for call in (lambda: eng.put(PutRequest(b"k", b"w")),
                 lambda: eng.delete_range(DeleteRangeRequest(b"k")),
                 lambda: eng.compact(CompactRequest(2))):
        with pytest.raises(errors.EtcdError) as e:
            call()
        assert e.value == errors.ErrCorrupt
    assert dump(eng)[0][:2] == (b"k", b"v")
    eng.alarm_deactivate(77, ALARM_CORRUPT)
    eng.put(PutRequest(b"k", b"w"))


def test_negative_quota_disables_the_quota(engines):
    eng = engines("n", 1, quota_backend_bytes=-1)
    for i in range(100):
        eng.put(PutRequest(b"k%d" % i, b"x" * 1024))
    assert eng.alarms.get() == []
