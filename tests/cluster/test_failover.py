"""A 3-replica brain cluster on a 3-node NATS cluster, driven the way users
and Kubernetes drive etcd (clientv3 with every endpoint), with real faults:
kill -9 of the brain leader and of the NATS stream leader.

- every acknowledged write is there afterwards, at its revision, and
  revisions never go back (clustercheck write + verify);
- a watcher on a follower sees every revision exactly once, in order,
  across the failovers (clustercheck watch);
- the history is linearizable across leader kills (porcupine over
  clientv3, clustercheck lin), and a concurrency.Mutex excludes across a
  leader kill (clustercheck mutex);
- the write pause of each failover is printed (the benchmarks report it
  next to etcd's).
"""

from __future__ import annotations

import time

import pytest

from tests.support import clustercheck
from tests.support.brain_cluster import BrainCluster

JOURNAL = "{name}_journal"


@pytest.fixture
def brain_cluster(nats_cluster_factory):
    made = []

    def make(size=3, *, nats_size=3, sync_always=True, **kw):
        nats = nats_cluster_factory(nats_size, sync_always=sync_always)
        c = BrainCluster(size, nats, **kw)
        made.append(c)
        c.start()
        return c

    yield made_factory(make)
    for c in made:
        c.cleanup()


def made_factory(make):
    return make


def _clean(res: dict) -> None:
    assert res["violations"] == 0, {k: v for k, v in res.items() if k != "stderr_tail"}


def test_kill9_of_brain_and_nats_leaders_loses_nothing(brain_cluster, clustercheck_bin, tmp_path):
    cluster = brain_cluster(3)
    nats = cluster.nats
    lead = cluster.wait_leader()
    watched = next(m for m in cluster.members if m is not lead)
    record = tmp_path / "acked.json"
    duration = 80
    writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin, duration=duration,
                                rate=300, clients=16, record=record, pause_threshold=0.2)
    watcher = clustercheck.start("watch", watched.endpoint, binary=clustercheck_bin, duration=duration,
                                 acked=record, settle="40s", pause_threshold=0.2)
    kills = []
    with writer, watcher:
        time.sleep(3)
        for _ in range(5):
            # keep=watched: if the watcher's replica leads, the lead is moved first
            lead, t_kill, t_new = cluster.kill_leader(keep=watched)
            kills.append(("brain leader", lead.name, t_kill, t_new - t_kill))
            time.sleep(1.5)
            cluster.restart(lead)
            time.sleep(2.5)
        stream = JOURNAL.format(name=cluster.name)
        for _ in range(3):
            node = nats.stream_leader(stream)
            t_kill = nats.kill9(node)
            nats.wait_stream_leader(stream, exclude=node, timeout=30)
            kills.append(("NATS stream leader", node.name, t_kill, time.time() - t_kill))
            print(f"  (NATS {node.name} killed at +{t_kill - writer.started:.2f} s)")
            time.sleep(1.0)
            nats.restart(node)
            time.sleep(3.0)
        w = writer.result()
        seen = watcher.result()
    v = clustercheck.run("verify", cluster.endpoints, binary=clustercheck_bin, record=record)
    lines = [f"  kill -9 {what} {who}: leader again after {took:.2f} s, write pause "
             f"{clustercheck.pause_after(w, t, window=3):.2f} s, watch pause "
             f"{clustercheck.pause_after(seen, t, window=3):.2f} s" for what, who, t, took in kills]
    print(f"\nbrain x3 on NATS x3 ({w['acked']} acked, {w['unknown']} unknown, longest write pause "
          f"{w['longest_pause_s']:.2f} s, {seen['events']} events watched on {watched.name}):\n"
          + "\n".join(lines))
    print("write pauses over 0.2 s (from, to, seconds after the writer started):", w.get("pauses"))
    _clean(w)
    _clean(seen)
    _clean(v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 1000, v
    assert seen["missing"] == 0 and seen["acked_watched"] > 0, seen


def test_linearizable_and_mutually_exclusive_across_leader_kills(brain_cluster, clustercheck_bin, tmp_path):
    cluster = brain_cluster(3, nats_size=1, sync_always=False)
    # exclusive: brain makes no revision of its own (an epoch record is not
    # a revision), so every revision is one of this run's writes.  A client
    # deadline longer than a failover keeps unknown outcomes (which the
    # checker must try both ways) to the writes cut off by the kill itself.
    lin = clustercheck.start("lin", cluster.endpoints, binary=clustercheck_bin, duration="20s", clients=6,
                             keys=3, op_timeout="6s", check_timeout="120s", visualize=tmp_path / "lin.html")
    with lin:
        for _ in range(2):
            time.sleep(5)
            lead = cluster.wait_leader()
            cluster.kill9(lead)
            cluster.wait_leader(exclude=lead)
            cluster.restart(lead)
        res = lin.result()
    print(f"\nporcupine over brain x3 with 2 leader kills: {res['ok']} ok, {res['unknown']} unknown, "
          f"{res['check_result']} in {res.get('check_seconds', 0):.2f} s")
    _clean(res)
    assert res["check_result"] == "Ok" and res["ok"] > 500, res

    cluster.wait_serving()  # the replica killed last is back before the next run clears its prefix
    mutex = clustercheck.start("mutex", cluster.endpoints, binary=clustercheck_bin, duration="12s")
    with mutex:
        time.sleep(4)
        lead = cluster.wait_leader()
        cluster.kill9(lead)
        cluster.wait_leader(exclude=lead)
        cluster.restart(lead)
        m = mutex.result()
    print(f"mutex counter across a leader kill: {m['increments']} increments, counter ok: {m['counter_ok']}")
    _clean(m)
    assert m["counter_ok"] and m["increments"] > 20, m
