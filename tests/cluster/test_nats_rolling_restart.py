"""A rolling restart of every nats-server under a brain cluster and a
clustercheck writer, the way docs/cluster.md "Operations" says to do it:
for each server in turn, move the leaders of brain's streams off it
($JS.API.STREAM.LEADER.STEPDOWN), put it in lame duck mode
(``nats-server --signal ldm=<pid>``), wait for it to exit, start it
again with the same config and data, and wait until it has caught up with
every stream before the next one.

- every acknowledged write is there afterwards at its revision, and
  revisions never go back (clustercheck write + verify);
- each replica's NATS connection left a lame duck server when told, before
  the server closed it (its log says so);
- the write pause of each server's restart is printed and bounded
  generously (this machine is loaded); docs/cluster.md has the figures;
- a request in flight on a connection that drops fails then, not after its
  timeout (what lets the journal resend an append at once).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from brain.cluster import jetstream_streams
from tests.support import clustercheck
from tests.support.brain_cluster import BrainCluster
from tests.support.servers import REPO_ROOT

NATS_STREAMS = REPO_ROOT / "deploy" / "cluster" / "nats-streams.py"
# Far above the 0.5 s the issue asks for, which an idle machine meets
# (docs/cluster.md "Operations"); a lost answer waited out (2 s ack timeout)
# or a NATS election (4-9 s) would exceed it.
PAUSE_BOUND = 1.5
LAME_DUCK_EXIT = 60.0  # seconds: a lame duck server waits 10 s, then closes its clients, then exits


def _nats_streams(*args: str) -> str:
    """deploy/cluster/nats-streams.py, as docs/cluster.md runs it."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, str(NATS_STREAMS), *args], capture_output=True, text=True,
                         timeout=90, env=env)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def _lame_duck_restart(nats, node, name: str, nats_server: str) -> dict:
    """The procedure for one server; its timings (time.time())."""
    other = next(n for n in nats.nodes if n is not node)
    t_begin = time.time()
    moved = _nats_streams("step-down", node.url, node.name, "--name", name)
    t_ldm = time.time()
    subprocess.run([nats_server, "--signal", f"ldm={node.proc.pid}"], check=True, timeout=10)
    node.proc.wait(LAME_DUCK_EXIT)
    t_exit = time.time()
    nats.restart(node)
    _nats_streams("wait-current", other.url, "--name", name)
    return {"node": node.name, "moved": [line.split(":")[0] for line in moved.splitlines()], "t_begin": t_begin, "t_ldm": t_ldm, "t_exit": t_exit,
            "t_current": time.time()}


def test_a_nats_rolling_restart_in_lame_duck_mode_loses_nothing(nats_cluster_factory, nats_server_bin,
                                                                clustercheck_bin, tmp_path):
    nats = nats_cluster_factory(3, sync_always=True)
    cluster = BrainCluster(3, nats, extra_args=("--checkpoint-interval", "3"))
    try:
        cluster.start()
        cluster.wait_leader()
        _nats_streams("wait-current", nats.nodes[0].url, "--name", cluster.name)
        record = tmp_path / "acked.json"
        stop = tmp_path / "stop"
        duration = 3 + 3 * 60 + 5
        writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin, duration=duration,
                                    rate=300, clients=16, record=record, pause_threshold=0.1, stop_file=stop)
        restarts = []
        with writer:
            time.sleep(3)
            for node in list(nats.nodes):
                restarts.append(_lame_duck_restart(nats, node, cluster.name, nats_server_bin))
                time.sleep(2.0)
            cluster.wait_serving(timeout=60)
            stop.touch()
            w = writer.result()
        v = clustercheck.run("verify", cluster.endpoints, binary=clustercheck_bin, record=record)
        logs = {m.name: m.log_tail(200_000) for m in cluster.members}
    finally:
        cluster.cleanup()
    for r in restarts:
        # every gap that begins between the step-down and the server being current again
        r["pause"] = clustercheck.pause_after(w, r["t_begin"], window=r["t_current"] - r["t_begin"] + 1.0)
    print(f"\nNATS rolling restart ({w['acked']} acked, {w['unknown']} unknown, longest pause "
          f"{w['longest_pause_s']:.2f} s): "
          + ", ".join(f"{r['node']} ({' '.join(r['moved']) or 'led nothing'}) pause {r['pause']:.2f} s, "
                      f"exit {r['t_exit'] - r['t_ldm']:.1f} s after ldm, current "
                      f"{r['t_current'] - r['t_exit']:.1f} s after" for r in restarts))
    print("write pauses over 0.1 s (from, to, seconds after the writer started):", w.get("pauses"))
    assert w["violations"] == 0 and v["violations"] == 0, (w, v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 1000, v
    for r in restarts:
        assert writer.started < r["t_begin"] and r["t_current"] + 1.0 < w["start_unix"] + w["run_seconds"], r
    left = [name for name, log in logs.items() if "entered lame duck mode; moving to another server" not in log]
    assert not left, f"replicas whose connection never left a lame duck server: {left}"
    assert max(r["pause"] for r in restarts) <= PAUSE_BOUND, [(r["node"], r["pause"]) for r in restarts]


def test_a_request_in_flight_fails_as_soon_as_its_connection_drops(nats_cluster_factory):
    """An answer cannot come on a connection that dropped: the request gives
    up then (as the timeout it would have become), not after its timeout, so
    the journal resends an append at once."""
    import nats.errors

    from brain.journal.natsio import NatsConnection

    async def never_answer(msg) -> None:
        pass

    server = nats_cluster_factory(1)
    conn = NatsConnection(list(server.urls), name="drop-test")
    try:
        conn.subscribe("never.answered", never_answer)  # a responder: no "no responders" at once
        pending = conn.submit(conn.request("never.answered", b"", timeout=30.0))
        time.sleep(0.5)
        t = time.monotonic()
        server.restart(server.nodes[0])
        try:
            pending.result(60)
            raise AssertionError("the request was answered")
        except nats.errors.TimeoutError:
            pass
        # the restart itself takes a while on this machine; 30 s would be the timeout waited out
        assert time.monotonic() - t < 15.0
    finally:
        conn.close()
