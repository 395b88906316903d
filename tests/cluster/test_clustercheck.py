"""The clustercheck tool against real servers: it must catch a system that is
not linearizable, pass on ones that are, and lose nothing it reports.

- Two independent single-node etcds behind one endpoint list are not one
  linearizable store: lin must report a violation (and write porcupine's
  visualization), mutex must see lost increments.
- A single brain passes every mode, including a kill -9 and restart in the
  middle of the writer (every acknowledged write still there, the watcher
  resumes without a gap).
- A 3-member etcd 3.6 cluster passes every mode while its leader is killed;
  the write pause after each leader kill is printed, etcd's baseline for the
  brain cluster's failover benchmarks.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import clustercheck
from tests.support.etcd_cluster import EtcdCluster


def _no_violations(res: dict) -> None:
    assert res["violations"] == 0, {k: v for k, v in res.items() if k != "stderr_tail"}


# ---------------------------------------------------------------------------
# A fake that is not linearizable
# ---------------------------------------------------------------------------


@pytest.mark.etcd
def test_lin_and_mutex_catch_two_independent_etcds(etcd_factory, clustercheck_bin, tmp_path):
    a, b = etcd_factory(), etcd_factory()
    both = f"{a.endpoint},{b.endpoint}"
    vis = tmp_path / "violation.html"
    res = clustercheck.run("lin", both, binary=clustercheck_bin, duration="2s", visualize=vis)
    # porcupine's verdict, plus every answer below a revision the other store
    # had already returned (the two count their revisions independently)
    assert res["check_result"] == "Illegal" and res["header_order_violations"] >= 1, res
    assert res["violations"] == 1 + res["header_order_violations"], res
    assert vis.is_file() and vis.stat().st_size > 1000
    # Each client on one of the two: both "hold" the mutex at once.
    res = clustercheck.run("mutex", both, binary=clustercheck_bin, duration="3s", spread=True)
    assert res["violations"] >= 1 and not res["counter_ok"], res
    # The same tools pass on one of them alone.
    _no_violations(clustercheck.run("lin", a.endpoint, binary=clustercheck_bin, duration="2s"))


# ---------------------------------------------------------------------------
# A single brain
# ---------------------------------------------------------------------------


def test_single_brain_passes_and_survives_kill9(brain_factory, clustercheck_bin, tmp_path):
    brain = brain_factory(1)
    ep = brain.endpoint
    res = clustercheck.run("lin", ep, binary=clustercheck_bin, duration="3s", clients=4)
    _no_violations(res)
    assert res["ok"] > 100 and res["header_order_checked"] == res["ok"], res
    res = clustercheck.run("mutex", ep, binary=clustercheck_bin, duration="3s")
    _no_violations(res)
    assert res["increments"] > 10 and res["header_order_checked"] >= 2 * res["increments"], res

    record = tmp_path / "acked.json"
    writer = clustercheck.start("write", ep, binary=clustercheck_bin, duration="8s", rate=300,
                                clients=8, record=record, pause_threshold=0.2)
    watcher = clustercheck.start("watch", ep, binary=clustercheck_bin, duration="8s", acked=record,
                                 settle="30s")
    with writer, watcher:
        time.sleep(3)
        t_kill = time.time()
        brain.kill9()
        brain.start()
        t_up = time.time()
        w = writer.result()
        seen = watcher.result()
    _no_violations(w)
    _no_violations(seen)
    assert seen["missing"] == 0 and seen["acked_watched"] > 0, seen
    v = clustercheck.run("verify", ep, binary=clustercheck_bin, record=record)
    _no_violations(v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 0, v
    print(f"\nsingle brain kill -9 + restart ({t_up - t_kill:.2f} s): write pause "
          f"{clustercheck.pause_after(w, t_kill):.2f} s, {w['acked']} acked, {w['unknown']} unknown, "
          f"watch pause {clustercheck.pause_after(seen, t_kill):.2f} s")


# ---------------------------------------------------------------------------
# A 3-member etcd 3.6 cluster with leader kills
# ---------------------------------------------------------------------------


def _kill_leaders(cluster: EtcdCluster, kills: int, first_after: float, every: float, down: float,
                  keep=None) -> list[dict]:
    """Kill the leader ``kills`` times (restarting it ``down`` s later)."""
    events = []
    time.sleep(first_after)
    for i in range(kills):
        t0 = time.time()
        killed, t_kill, t_leader = cluster.kill_leader(keep=keep)
        time.sleep(max(0.0, down - (time.time() - t_kill)))
        cluster.restart(killed)
        events.append({"killed": killed.name, "t_kill": t_kill, "election_s": t_leader - t_kill})
        if i + 1 < kills:
            time.sleep(max(0.0, every - (time.time() - t0)))
    return events


def test_etcd_cluster_helpers(etcd_cluster_factory):
    """leader(), move_leader(), kill_leader(keep=...) and restart() on a real cluster."""
    cluster = etcd_cluster_factory(3)
    target = cluster.followers()[0]
    cluster.move_leader(target)
    assert cluster.leader() is target
    # keep=target: leadership is handed to another member, which is killed.
    killed, t_kill, t_leader = cluster.kill_leader(keep=target)
    assert killed is not target and target.running and not killed.running
    assert t_leader >= t_kill and cluster.leader() not in (None, killed)
    cluster.restart(killed)
    assert killed.running and len(cluster.followers()) == 2


def test_etcd_cluster_failover_baseline(etcd_cluster_factory, clustercheck_bin, tmp_path):
    cluster = etcd_cluster_factory(3)
    follower = cluster.followers()[0]
    record = tmp_path / "acked.json"
    duration = 24
    writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin,
                                duration=duration, rate=500, clients=16, record=record,
                                pause_threshold=0.1)
    watcher = clustercheck.start("watch", follower.endpoint, binary=clustercheck_bin,
                                 duration=duration, acked=record, settle="30s", pause_threshold=0.1)
    with writer, watcher:
        kills = _kill_leaders(cluster, kills=3, first_after=3, every=7, down=2, keep=follower)
        w = writer.result()
        seen = watcher.result()
    v = clustercheck.run("verify", cluster.endpoints, binary=clustercheck_bin, record=record)
    lines = []
    for k in kills:
        k["write_pause_s"] = clustercheck.pause_after(w, k["t_kill"], window=5)
        k["watch_pause_s"] = clustercheck.pause_after(seen, k["t_kill"], window=5)
        lines.append(f"  kill -9 {k['killed']}: new leader seen after {k['election_s']:.2f} s, "
                     f"write pause {k['write_pause_s']:.2f} s, watch pause {k['watch_pause_s']:.2f} s")
    print(f"\netcd 3.6 x3 leader kills ({w['acked']} acked, {w['unknown']} unknown, "
          f"longest write pause {w['longest_pause_s']:.2f} s, {seen['events']} events watched on "
          f"follower {follower.name}):\n" + "\n".join(lines))
    _no_violations(w)
    _no_violations(seen)
    _no_violations(v)
    assert seen["missing"] == 0 and seen["acked_watched"] > 0, seen
    assert v["acked"] == w["acked"] and v["missing"] == 0, v
    # Writes went on after every election (the writer saw each pause end).
    assert all(k["write_pause_s"] < 10 for k in kills), kills


def test_etcd_cluster_linearizable_across_leader_kills(etcd_cluster_factory, clustercheck_bin,
                                                       tmp_path: Path):
    cluster = etcd_cluster_factory(3)
    vis = tmp_path / "lin.html"
    with clustercheck.start("lin", cluster.endpoints, binary=clustercheck_bin, duration=16,
                            clients=6, visualize=vis) as run:
        kills = _kill_leaders(cluster, kills=3, first_after=2, every=4.5, down=1.5)
        res = run.result()
    print(f"\netcd 3.6 x3 lin with {len(kills)} leader kills: {res['ops']} ops, {res['unknown']} "
          f"unknown, porcupine {res['check_result']} in {res['check_seconds']:.2f} s")
    _no_violations(res)
    assert res["check_result"] == "Ok" and res["ok"] > 1000, res

    with clustercheck.start("mutex", cluster.endpoints, binary=clustercheck_bin, duration=12,
                            clients=4) as run:
        kills = _kill_leaders(cluster, kills=2, first_after=2, every=5, down=1.5)
        res = run.result()
    print(f"etcd 3.6 x3 mutex with {len(kills)} leader kills: {res['increments']} increments, "
          f"counter {res['counter']}, {res['unknown']} unknown, {res['refused']} refused")
    _no_violations(res)
    assert res["counter_ok"] and res["increments"] > 20, res


# ---------------------------------------------------------------------------
# The model and the pause/revision bookkeeping on hand-made histories
# ---------------------------------------------------------------------------


def test_clustercheck_go_unit_tests(clustercheck_bin):
    """porcupine's verdict on small histories (stale reads, unknown outcomes,
    CAS, foreign revisions), pauses, revision order and the real-time order
    of header revisions (an inverted history fails, an ordered one passes):
    go test."""
    import subprocess

    from tests.support.servers import REPO_ROOT

    out = subprocess.run(["bash", str(REPO_ROOT / "tests" / "cluster" / "build.sh"), "--go-test",
                          "clustercheck"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
