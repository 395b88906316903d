"""brain.engine.limits in an engine: --max-leases and etcd's bound on
writes waiting for the committer, with their errors and counts."""

from __future__ import annotations

import pytest

from brain.engine import Engine, EngineConfig
from brain.engine.limits import Limits
from brain.mvcc import errors
from brain.mvcc.requests import LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest


@pytest.fixture
def engine(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[], max_leases=3))
    yield eng
    eng.close()


def test_a_grant_beyond_max_leases_is_refused_with_too_many_leases(engine):
    ids = [engine.lease_grant(LeaseGrantRequest(60, i)).id for i in (1, 2, 3)]
    with pytest.raises(errors.EtcdError) as e:
        engine.lease_grant(LeaseGrantRequest(60, 4))
    assert (e.value.code, e.value.message) == ("RESOURCE_EXHAUSTED", "etcdserver: too many leases")
    assert engine.statistics().grants_refused == 1
    # the bound is on leases that exist: one revoked, one more may be granted
    engine.lease_revoke(LeaseRevokeRequest(ids[0]))
    assert engine.lease_grant(LeaseGrantRequest(60, 5)).id == 5
    assert engine.statistics().leases == 3


def test_grants_of_one_batch_count_each_other(engine):
    futures = engine.submit_many([LeaseGrantRequest(60, i) for i in range(1, 6)])
    outcomes = []
    for f in futures:
        try:
            f.result(timeout=10)
            outcomes.append("ok")
        except errors.EtcdError as e:
            outcomes.append(e.message)
    assert outcomes.count("ok") == 3 and outcomes.count("etcdserver: too many leases") == 2
    assert engine.statistics().leases == 3


def test_client_writes_beyond_the_pending_limit_are_refused_with_too_many_requests(engine):
    engine.committer.limits.max_pending_writes = 0  # as if 5000 were waiting already
    with pytest.raises(errors.EtcdError) as e:
        engine.put(PutRequest(b"k", b"v"))
    assert (e.value.code, e.value.message) == ("RESOURCE_EXHAUSTED", "etcdserver: too many requests")
    assert engine.statistics().writes_refused == 1
    assert not engine.range(RangeRequest(b"k")).kvs  # a refused write never reached the store
    # writes another replica forwarded (local) are never refused
    done = []
    engine.submit_batch([PutRequest(b"k", b"forwarded")], lambda outcomes: done.extend(outcomes), local=True)
    engine.committer.limits.max_pending_writes = 5000
    engine.put(PutRequest(b"k2", b"v"))
    assert engine.range(RangeRequest(b"k")).kvs[0].value == b"forwarded"


def test_admit_writes_refuses_only_those_beyond_the_limit():
    limits = Limits(max_pending_writes=10)
    assert limits.admit_writes(7, [1, 2, 3]) == ([1, 2, 3], [])
    assert limits.admit_writes(8, [1, 2, 3]) == ([1, 2], [3])
    assert limits.admit_writes(12, [1]) == ([], [1])
    assert limits.writes_refused == 2
