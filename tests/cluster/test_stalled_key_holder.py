"""A replica that wins the election key and stalls before its epoch record
(GC, CPU starvation, a frozen VM, SIGSTOP) must not lead when it resumes
after another replica took the key: that replica leads within its read
lease, answering linearizable reads at its own last append, and would
never see the writes the resumed one decided.

Real processes on a real NATS cluster (issue 23): 3 replicas on 3
nats-servers with the read lease on, 16 clients (porcupine per key and the
header revisions' real-time order, clustercheck lin) through every
replica.  The leader L is stopped (SIGSTOP); the replica X that wins its
key stops itself at the failpoint ``promote.start`` (brain/failpoints.py),
between the key and the epoch; both stay stopped until the third replica Y
leads; then both are continued.  Right after, a probe writes through X
and reads through Y: every linearizable read must show the write
acknowledged before it.  Before the hold check, X appended its epoch after
Y's and acknowledged writes that Y's reads missed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.support import clustercheck, servers
from tests.support.brain_cluster import BrainCluster

WAIT = 30.0


def _stopped(pid: int) -> bool:
    """The process is stopped (state T in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


def _wait(what: str, check, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _leads(member) -> bool:
    try:
        st = member.status(timeout=1)
    except grpc.RpcError:
        return False
    return st.leader == st.header.member_id


class Probe:
    """Puts through the resumed replica X, each followed at once by a
    linearizable get through Y: every get must answer at the put's
    revision or later.  Puts are sent while X is still stopped, so they
    wait in X's socket and are the first writes X decides when it resumes
    (a put sent after would come too late: X, deposed, steps down within
    milliseconds of resuming)."""

    def __init__(self, members) -> None:
        from brain.api.pb.etcdserverpb import rpc_pb2_grpc

        # connected before any replica stops: a connection's handshake
        # would wait for a stopped server
        self._channels = {m.name: servers.grpc_channel(m.endpoint) for m in members}
        self._stubs = {name: rpc_pb2_grpc.KVStub(c) for name, c in self._channels.items()}
        for stub in self._stubs.values():
            stub.Range(pb.RangeRequest(key=b"/stalled/warm", serializable=True), timeout=5)
        self._x = self._y = None
        self._lock = threading.Lock()
        self.out = {"acked": 0, "answered": 0, "failed": 0, "stale": []}
        self._threads: list[threading.Thread] = []

    def between(self, x, y) -> None:
        """Write through ``x``, read through ``y``."""
        self._x, self._y = self._stubs[x.name], self._stubs[y.name]

    def close(self) -> None:
        for c in self._channels.values():
            c.close()

    def _one(self, i: int, key: bytes, timeout: float) -> bool:
        try:
            rev = self._x.Put(pb.PutRequest(key=key, value=b"%d" % i), timeout=timeout).header.revision
        except grpc.RpcError:
            with self._lock:
                self.out["failed"] += 1
            return False
        try:
            got = self._y.Range(pb.RangeRequest(key=key), timeout=2)
        except grpc.RpcError:
            with self._lock:
                self.out["acked"] += 1
                self.out["failed"] += 1
            return True
        seen = got.kvs[0].mod_revision if got.kvs else 0
        with self._lock:
            self.out["acked"] += 1
            self.out["answered"] += 1
            if seen < rev or got.header.revision < rev:
                self.out["stale"].append({"key": key.decode(), "acked": rev, "read_mod": seen,
                                          "read_header": got.header.revision})
        return True

    def pending(self, n: int) -> None:
        """``n`` puts sent now, on keys of their own, answered whenever X
        answers."""
        for i in range(n):
            t = threading.Thread(target=self._one, args=(i, b"/stalled/pending/%d" % i, 20.0), daemon=True)
            t.start()
            self._threads.append(t)

    def serial(self, seconds: float) -> None:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < seconds:
            i += 1
            if not self._one(i, b"/stalled/serial", 2.0):
                time.sleep(0.01)

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)


@pytest.fixture
def stalled_cluster(nats_cluster_factory, tmp_path, monkeypatch):
    failpoints = tmp_path / "failpoints"
    monkeypatch.setenv("BRAIN_FAILPOINTS_FILE", str(failpoints))
    nats = nats_cluster_factory(3, sync_always=True)
    cluster = BrainCluster(3, nats, extra_args=("--read-lease=true", "--checkpoint-interval", "3"))
    try:
        cluster.start()
        yield cluster, failpoints
    finally:
        for m in cluster.members:
            if m.running:
                os.kill(m.proc.pid, signal.SIGCONT)  # a stopped process cannot stop cleanly
        cluster.cleanup()


def test_a_key_holder_stalled_before_its_epoch_does_not_lead_after_resuming(stalled_cluster, clustercheck_bin,
                                                                              tmp_path):
    cluster, failpoints = stalled_cluster
    lead = cluster.wait_leader()
    stop = tmp_path / "stop"
    lin = clustercheck.start("lin", cluster.endpoints, binary=clustercheck_bin, duration=60, clients=16, keys=8,
                             per_key=True, op_timeout="4s", check_timeout="120s", prefix="/stalled/lin/",
                             stop_file=stop, visualize=tmp_path / "lin.html")
    stopped: list = []
    probe = Probe(cluster.members)
    with lin:
        try:
            time.sleep(2.0)
            failpoints.write_text("promote.start stop\n")
            os.kill(lead.proc.pid, signal.SIGSTOP)
            stopped.append(lead)
            others = [m for m in cluster.members if m is not lead]
            x = _wait("a replica to win the key and stop before its epoch",
                      lambda: next((m for m in others if _stopped(m.proc.pid)), None))
            stopped.append(x)
            failpoints.unlink()
            y = next(m for m in others if m is not x)
            _wait(f"{y.name} to lead", lambda: _leads(y))
            probe.between(x, y)
            probe.pending(8)
            time.sleep(1.0)  # both stay stopped well past X's hold on the key; the puts wait at X
            for m in (x, lead):
                os.kill(m.proc.pid, signal.SIGCONT)
            stopped.clear()
            probe.join(30)
            probe.serial(3.0)
            time.sleep(1.0)
        finally:
            probe.close()
            for m in stopped:
                os.kill(m.proc.pid, signal.SIGCONT)
            stop.touch()
        res = lin.result()
    x_log = x.log_tail(200000)
    print(f"\nL={lead.name} X={x.name} Y={y.name}; probe {probe.out}; lin: "
          f"{ {k: v for k, v in res.items() if k not in ('stderr_tail',)} }")
    # the window was reached: X stopped inside its promotion and went on from there
    assert "failpoint promote.start: continued" in x_log, x_log[-4000:]
    assert probe.out["acked"] > 0 and probe.out["answered"] > 0, probe.out
    assert probe.out["stale"] == [], probe.out
    assert res["violations"] == 0, res
