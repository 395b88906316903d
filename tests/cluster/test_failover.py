"""A 3-replica brain cluster on a 3-node NATS cluster, driven the way users
and Kubernetes drive etcd (clientv3 with every endpoint), with real faults:
kill -9 of the brain leader and of the NATS stream leader.

- every acknowledged write is there afterwards, at its revision, and
  revisions never go back (clustercheck write + verify);
- a watcher on a follower sees every revision exactly once, in order,
  across the failovers (clustercheck watch);
- the history is linearizable across leader kills (porcupine over
  clientv3, clustercheck lin) and no answer carries a header revision below
  one already returned before it was asked (clustercheck's real-time order
  check, which sees a stale read even on a key that did not change): 16
  clients on 8 keys, puts, linearizable gets and CAS Txns whose compares
  often fail, over all three endpoints, with 12 leader kills (2 runs of 6;
  BRAIN_CLUSTER_KILLS sets the total: 24 in ``make test-full``);
- a concurrency.Mutex excludes across a leader kill (clustercheck mutex);
- a rolling restart (SIGTERM of every replica in turn) loses nothing and
  hands the lead over instead of waiting for an election;
- the write pause of each failover is printed and bounded generously here
  (this machine is loaded: PAUSE_BOUND_KILL, PAUSE_BOUND_RESTART); the
  benchmarks carry the precise figures, next to etcd's.

Every planned kill must happen inside the clustercheck run's window (a kill
after the run ended would check nothing), and every leader kill is confirmed
by the survivors' epoch (raft_term) rising, not by Status naming a leader
(BrainCluster.kill_leader).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support import clustercheck
from tests.support.brain_cluster import BrainCluster

JOURNAL = "{name}_journal"
# Write pauses asserted, far above what an idle machine shows (docs/cluster.md
# "Failover": about 0.6-0.7 s after a kill -9 of the leader, 0.5 s at most
# across a restart) and below what the key-TTL election gave (2-4 s).
PAUSE_BOUND_KILL = 1.8
PAUSE_BOUND_RESTART = 1.5


@pytest.fixture
def brain_cluster(nats_cluster_factory):
    made = []

    def make(size=3, *, nats_size=3, sync_always=True, **kw):
        nats = nats_cluster_factory(nats_size, sync_always=sync_always)
        # A checkpoint every 3 s: a replica killed every few cycles would
        # otherwise never live the default 60 s to one, and each restart
        # would replay the whole journal (cycles grew from 7 s to 30 s).
        kw.setdefault("extra_args", ("--checkpoint-interval", "3"))
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


def _issuing_until(res: dict) -> float:
    """When a clustercheck run stopped issuing operations (time.time()): its
    start plus its own measure of its run (taken after connecting, so this
    errs early)."""
    return res["start_unix"] + res["run_seconds"]


def _inside_window(run, res: dict, kills: list[dict], planned: int, margin: float = 1.0) -> None:
    """Every planned kill happened, each while the clustercheck run was
    issuing operations, with ``margin`` seconds of them left after the new
    leader's epoch was seen (a kill after the run ended would check
    nothing)."""
    assert len(kills) == planned, f"{len(kills)} kills of {planned} planned: {kills}"
    end = _issuing_until(res)
    for k in kills:
        assert run.started < k["t_kill"] and k["t_new_epoch"] + margin < end, (
            f"kill of {k['killed']} at +{k['t_kill'] - run.started:.2f} s (new epoch at "
            f"+{k['t_new_epoch'] - run.started:.2f} s) is outside the run, which issued operations until "
            f"+{end - run.started:.2f} s")


def test_kill9_of_brain_and_nats_leaders_loses_nothing(brain_cluster, clustercheck_bin, tmp_path):
    cluster = brain_cluster(3)
    nats = cluster.nats
    lead = cluster.wait_leader()
    watched = next(m for m in cluster.members if m is not lead)
    record = tmp_path / "acked.json"
    # a bound (kill cycles measured up to ~9 s for the brain leader, ~13 s
    # for a NATS stream leader); --stop-file ends both runs after the last
    stop = tmp_path / "stop"
    duration = 3 + 5 * 14 + 3 * 20 + 5
    writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin, duration=duration,
                                rate=300, clients=16, record=record, pause_threshold=0.2, stop_file=stop)
    watcher = clustercheck.start("watch", watched.endpoint, binary=clustercheck_bin, duration=duration,
                                 acked=record, settle="40s", pause_threshold=0.2, stop_file=stop)
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
        stop.touch()
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
    # each pause measured needs writes after it: every kill and its new
    # leader inside the writer's run, 3 s before its end
    _inside_window(writer, w, cluster.kills, 5, margin=3.0)
    for what, who, t, took in kills[5:]:
        assert writer.started < t and t + took + 3.0 < _issuing_until(w), (what, who, t - writer.started, w)
    _clean(w)
    _clean(seen)
    _clean(v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 1000, v
    assert seen["missing"] == 0 and seen["acked_watched"] > 0, seen
    brain_pauses = [clustercheck.pause_after(w, t, window=3) for what, _who, t, _took in kills[:5]]
    assert max(brain_pauses) <= PAUSE_BOUND_KILL, brain_pauses


def test_a_rolling_restart_hands_the_lead_over_and_loses_nothing(brain_cluster, clustercheck_bin, tmp_path):
    """SIGTERM of every replica in turn under the writer: the leader hands
    its key to a follower on the way out (its log says so; it neither
    resigns nor lets the key time out), every pause stays short, every
    acknowledged write is there afterwards."""
    cluster = brain_cluster(3)
    cluster.wait_leader()
    record = tmp_path / "acked.json"
    stop = tmp_path / "stop"
    writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin, duration=3 + 3 * 20,
                                rate=300, clients=16, record=record, pause_threshold=0.2, stop_file=stop)
    restarts = []
    with writer:
        time.sleep(3)
        for member in list(cluster.members):
            was_leader = cluster.leader() is member
            t_stop = time.time()
            member.stop()
            log = member.log_tail(20000)
            member.start()
            cluster.wait_serving(timeout=60)
            restarts.append((member.name, was_leader, t_stop, log))
            time.sleep(2.0)
        stop.touch()
        w = writer.result()
    v = clustercheck.run("verify", cluster.endpoints, binary=clustercheck_bin, record=record)
    pauses = [(name, was_leader, clustercheck.pause_after(w, t, window=3)) for name, was_leader, t, _ in restarts]
    print(f"\nrolling restart ({w['acked']} acked, {w['unknown']} unknown): "
          + ", ".join(f"{name}{' (leading)' if lead else ''} {p:.2f} s" for name, lead, p in pauses))
    _clean(w)
    _clean(v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 1000, v
    leaders = [(name, log) for name, was_leader, _t, log in restarts if was_leader]
    assert leaders, [r[:2] for r in restarts]  # the lead may land on a replica restarted later: then twice
    for name, log in leaders:
        assert "handed the lead to" in log, (name, log[-3000:])
    assert max(p for _, _, p in pauses) <= PAUSE_BOUND_RESTART, pauses


# A kill cycle: the new epoch (~2 s: the election timeout, a poll, the
# promotion), the killed replica down, its restart (which replays the journal
# since its last checkpoint), settling.  Measured 7-14 s on the 2-core
# machine; the run's --duration allows 20 s each and --stop-file ends it
# once the last cycle is done.
LEADER_DOWN = 1.0
SETTLE = 1.0
CYCLE_BOUND = 20.0
KILLS_PER_RUN = 6


def _kill_cycles(cluster, run, duration: float, kills: int) -> list[dict]:
    """``kills`` confirmed leader kills, each killed replica restarted; a
    kill that would not fit in the run is left out (and the test fails)."""
    done = []
    for _ in range(kills):
        if time.time() + CYCLE_BOUND > run.started + duration:
            break  # _inside_window reports the kills that did not happen
        lead, _t_kill, _t_new = cluster.kill_leader()
        done.append(cluster.kills[-1])
        time.sleep(LEADER_DOWN)
        cluster.restart(lead)
        time.sleep(SETTLE)
    return done


def test_no_stale_answers_across_leader_kills(brain_cluster, clustercheck_bin, tmp_path):
    """The issue's workload: clientv3 over all three endpoints, 16 clients on
    8 keys (puts, linearizable gets, CAS Txns, most of whose compares fail,
    deletes), the brain leader killed with kill -9 six times per run.  Each
    run must be linearizable and keep header revisions in real-time order;
    the defect showed in 2 runs of 4."""
    total = int(os.environ.get("BRAIN_CLUSTER_KILLS", str(2 * KILLS_PER_RUN)))
    cluster = brain_cluster(3, nats_size=1, sync_always=False)
    print("\nmembers: " + ", ".join(f"{m.name} {m.member_id():x}" for m in cluster.members))
    runs = []
    left = total
    while left > 0:
        kills = min(KILLS_PER_RUN, left)
        left -= kills
        duration = 2.0 + kills * CYCLE_BOUND + 3.0
        stop = tmp_path / f"lin{len(runs)}.stop"
        cluster.wait_serving()  # the replica killed last is back before the run clears its prefix
        # per key: one porcupine history over 16 clients, 8 keys and the
        # unknown outcomes of 6 kills is too costly to check (it took 14 GB
        # in minutes); each key's is not, and the header order check spans
        # every key.
        run = clustercheck.start("lin", cluster.endpoints, binary=clustercheck_bin, duration=duration,
                                 clients=16, keys=8, per_key=True, op_timeout="6s", check_timeout="120s",
                                 prefix=f"/clustercheck/lin{len(runs)}/", stop_file=stop,
                                 visualize=tmp_path / f"lin{len(runs)}.html")
        with run:
            time.sleep(2.0)
            done = _kill_cycles(cluster, run, duration, kills)
            time.sleep(2.0)  # operations on the restarted replica too
            stop.touch()
            t_stop = time.time()
            res = run.result()
        runs.append((res, done))
        print(f"\nrun {len(runs)}: {res['ok']} ok, {res['unknown']} unknown, porcupine {res['check_result']} "
              f"in {res.get('check_seconds', 0):.2f} s, {res.get('header_order_checked')} answers checked for "
              f"real-time order, {res.get('header_order_violations')} out of order; kills: "
              + ", ".join(f"{k['killed']} at +{k['t_kill'] - run.started:.2f} s (epoch {k['term_before']} -> "
                          f"{k['term_after']} after {k['t_new_epoch'] - k['t_kill']:.2f} s)" for k in done))
        for p in res.get("header_order_problems") or []:
            print("   ", p)
        _inside_window(run, res, done, kills)
        assert res["stopped_early"] and _issuing_until(res) <= t_stop + 1.0, res
        _clean(res)
        assert res["check_result"] == "Ok" and res["ok"] > 300, res


def test_mutually_exclusive_across_a_leader_kill(brain_cluster, clustercheck_bin):
    cluster = brain_cluster(3, nats_size=1, sync_always=False)
    duration = 12.0
    mutex = clustercheck.start("mutex", cluster.endpoints, binary=clustercheck_bin, duration=duration)
    with mutex:
        time.sleep(4)
        lead, _t_kill, _t_new = cluster.kill_leader()
        cluster.restart(lead)
        m = mutex.result()
    print(f"\nmutex counter across a leader kill: {m['increments']} increments, counter ok: {m['counter_ok']}, "
          f"{m.get('header_order_checked')} answers in real-time order")
    _inside_window(mutex, m, cluster.kills, 1)
    _clean(m)
    assert m["counter_ok"] and m["increments"] > 20, m
    assert m["header_order_checked"] >= 2 * m["increments"], m
