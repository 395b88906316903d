"""The etcd differential suites against a 3-replica brain cluster, talking
to a *follower*: every write it takes is forwarded to the leader and
answered once the follower applied it; every read and watch is served
from the follower's own copy.  Zero differences from a real etcd, as for a
single brain (tests/differential)."""

from __future__ import annotations

import os

import pytest

from tests.differential import harness
from tests.differential.harness import run_differential
from tests.differential.watch_harness import run_watch_differential
from tests.support.brain_cluster import BrainCluster

pytestmark = pytest.mark.etcd

SEEDS = [int(s) for s in os.environ.get("CLUSTER_DIFF_SEEDS", "1,2").split(",") if s]
KV_OPS = int(os.environ.get("CLUSTER_DIFF_OPS", "500"))
WATCH_OPS = int(os.environ.get("CLUSTER_WATCH_OPS", "250"))


@pytest.fixture
def follower(nats1):
    made = []

    def make():
        c = BrainCluster(3, nats1, shards=4, lifetime=600.0)
        made.append(c)
        c.start()
        return next(m for m in c.members if m is not c.wait_leader())

    yield make
    for c in made:
        c.cleanup()


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
def test_cluster_follower_matches_etcd_kv(seed, follower, etcd_factory, kv_stub):
    etcd = etcd_factory()
    f = follower()
    res = run_differential(kv_stub(etcd.endpoint).kv, kv_stub(f.endpoint).kv, seed, KV_OPS,
                           labels=("etcd", "brain-follower"), label="brain cluster follower vs etcd")
    harness.RESULTS.append(res)
    print(res.summary())
    assert res.diff is None, res.diff.report()
    assert res.ops_compared == KV_OPS


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
def test_cluster_follower_matches_etcd_watch_and_leases(seed, follower, etcd_factory):
    etcd = etcd_factory()
    f = follower()
    # etcd 3.4 returns leases on keys_only ranges, brain as etcd 3.7 does not
    # (tests/differential/ETCD_BEHAVIOUR.md): that one difference is left out
    res = run_watch_differential(etcd.endpoint, f.endpoint, seed, WATCH_OPS, labels=("etcd", "brain-follower"),
                                 leases=True, avoid=("fast_keys_only",))
    res.label = "watch+lease brain cluster follower vs etcd"
    harness.RESULTS.append(res)
    print(res.summary())
    assert res.diff is None, res.diff.report()
    c = res.counts
    assert c["events"] >= 50 and c["expiry phases"] == 1, res.summary()
