"""The clusters under benchmark: a 3-replica brain on a 3-node NATS JetStream
cluster against a 3-member etcd 3.6 cluster, on the same machine.

    flavor = BrainClusterFlavor()            # or EtcdClusterFlavor()
    target = flavor.start(root / "brain-cluster-r1", size=3)
    target.endpoint                          # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
    target.cpu_seconds()                     # every process of the cluster
    failover(target, plan, log_dir)          # kills, isolations, planned restarts, under a writer
    target.stop()

brain: three ``nats-server`` with ``jetstream { sync_interval: always }``
(fsync before a publish is acknowledged: as durable as a single brain's
fdatasync) and three ``brain serve --journal-url`` replicas, each on
``brain serve``'s own defaults otherwise.  etcd: three members of the etcd
3.6 that benchmarks/build.sh builds, on their defaults.  The processes are
started by the cluster tests' own helpers (tests/support: brain_cluster,
nats_cluster, etcd_cluster), with their data on the benchmark's temporary
root (a disk, not tmpfs: fsync must cost).

A cluster's CPU time and memory are those of all its processes: the three
brains and the three nats-servers; the three etcds.  A target quacks like
``benchmarks.servers.Server`` where the harness needs it (endpoint, alive,
cpu_seconds, memory, log_tail, stop), so the single-server workloads run on
it unchanged, with every endpoint given to the load generator.

``failover`` drives clustercheck (tests/cluster/go, built by
tests/cluster/build.sh): an open-loop writer over every endpoint records
each acknowledged write with its revision while the leader (etcd's, brain's,
and for brain the NATS stream leader's nats-server) is killed with SIGKILL
and restarted; while the leader is isolated (its process stopped with
SIGSTOP for a fixed time, then SIGCONT: cut from its peers, from NATS and
from its clients at once, the machine having no packet filter to cut links
with); for brain while every nats-server in turn is restarted as planned
(the leaders of brain's streams on it stepped down, lame duck mode, a start); and
while every member is restarted in turn with SIGTERM (a rolling restart: a
brain leader hands the lead over first).  The write pause of each fault is
the longest gap between acknowledged writes around it, and afterwards
``clustercheck verify`` reads every acknowledged write back at its revision.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from benchmarks.machine import first_line
from benchmarks.servers import ServerError, StartOptions, cpu_seconds, memory_kb, thread_cpu_seconds, tool_path
from benchmarks.stream_leader import StreamLeaderWatch
from brain.cluster.replica import jetstream_streams
from tests.support.servers import ServerStartError

JOURNAL_STREAM = "{name}_journal"  # brain's journal stream in NATS (docs/cluster.md)


@contextlib.contextmanager
def _data_under(root: Path):
    """The tests' server groups make their directories under $TEST_TMPDIR
    (default /dev/shm): point it at the benchmark's root while they do."""
    old = os.environ.get("TEST_TMPDIR")
    root.mkdir(parents=True, exist_ok=True)
    os.environ["TEST_TMPDIR"] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TEST_TMPDIR", None)
        else:
            os.environ["TEST_TMPDIR"] = old


def binary_or_reason(getter) -> tuple[str | None, str]:
    """(path, "") from a tests.support.binaries getter, or (None, why not)."""
    from tests.support.binaries import ToolMissing

    try:
        return getter(), ""
    except ToolMissing as e:
        return None, " ".join(str(e).split())[:300]


class ClusterFlavor:
    """How to run one kind of cluster; ``name`` is the server it is compared as."""

    name = "cluster"
    process_note = ""

    def available(self) -> tuple[bool, str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def version(self) -> str:
        return "?"

    def flags_note(self) -> str:
        return ""

    def start(self, root: Path, size: int, lifetime: float,
              extra_args: Sequence[str] = ()) -> "ClusterTarget":  # pragma: no cover
        """Start ``size`` members, each with ``extra_args`` added to its command line."""
        raise NotImplementedError


class EtcdClusterFlavor(ClusterFlavor):
    name = "etcd-3.6"
    process_note = "the 3 etcd processes"

    def binary(self) -> str | None:
        p = tool_path("etcd-3.6")
        return str(p) if p else None

    def available(self):
        return (True, "") if self.binary() else (False, "etcd-3.6 not built (run benchmarks/build.sh)")

    def version(self):
        return first_line([self.binary(), "--version"]) or "?"

    def flags_note(self):
        return "3 members on loopback, defaults"

    def start(self, root, size, lifetime, extra_args=()):
        from tests.support.etcd_cluster import EtcdCluster

        with _data_under(root):
            group = EtcdCluster(size, binary=self.binary(), extra_args=extra_args, lifetime=lifetime,
                                ready_timeout=120.0)
        _start(group)
        return ClusterTarget(self, root, group)


class BrainClusterFlavor(ClusterFlavor):
    name = "brain"
    process_note = "the 3 brain processes and the 3 nats-servers"

    def available(self):
        from tests.support.binaries import nats_server_binary

        path, why = binary_or_reason(nats_server_binary)
        return (True, "") if path else (False, f"nats-server: {why}")

    def nats_binary(self) -> str:
        from tests.support.binaries import nats_server_binary

        return nats_server_binary()

    def version(self):
        from benchmarks.servers import Brain

        nats = (first_line([self.nats_binary(), "--version"]) or "?").replace("nats-server:", "").strip()
        return f"{Brain().version()}; nats-server {nats}"

    def flags_note(self):
        return ("3 `brain serve --journal-url` replicas (otherwise defaults) on 3 nats-servers, "
                "`jetstream { sync_interval: always }`, stream R3")

    def start(self, root, size, lifetime, extra_args=()):
        from tests.support.nats_cluster import NatsCluster

        with _data_under(root):
            nats = NatsCluster(size, sync_always=True, binary=self.nats_binary(), lifetime=lifetime,
                               ready_timeout=60.0)
        _start(nats)
        try:
            with _data_under(root):
                group = _BenchBrainCluster(size, nats, extra_args=extra_args, lifetime=lifetime,
                                           ready_timeout=120.0)
            _start(group)
        except BaseException:
            nats.cleanup()
            raise
        return ClusterTarget(self, root, group, nats)


def _start(group) -> None:
    """Start a server group; a member that does not come up is a ServerError."""
    from tests.support.servers import ServerStartError

    try:
        group.start()
    except ServerStartError as e:
        raise ServerError(str(e)[-3000:]) from None


def _bench_brain_cluster_class():
    """BrainCluster whose replicas keep ``brain serve``'s default shard layout,
    as the single brain under benchmark does (the tests' helper pins its own)."""
    from tests.support.brain_cluster import BrainCluster, BrainReplica

    class BenchReplica(BrainReplica):
        def _command(self) -> list[str]:
            cmd = super()._command()
            for flag in ("--shards", "--shard-boundaries"):
                while flag in cmd:
                    i = cmd.index(flag)
                    del cmd[i:i + 2]
            return cmd

    class BenchBrainCluster(BrainCluster):
        def __init__(self, size, nats, **kw):
            super().__init__(size, nats, **kw)
            made = self.members
            for m in made:  # not started yet: only their directories exist
                shutil.rmtree(m.root, ignore_errors=True)
            self.members = [BenchReplica(self, m.name, ready_timeout=m.ready_timeout) for m in made]

    return BenchBrainCluster


def _BenchBrainCluster(size, nats, **kw):
    return _bench_brain_cluster_class()(size, nats, **kw)


@dataclass
class ClusterTarget:
    """A started cluster, shaped like ``benchmarks.servers.Server`` for the harness."""

    flavor: ClusterFlavor
    root: Path
    group: object                # tests.support EtcdCluster or BrainCluster
    nats: object | None = None   # the NatsCluster under a brain cluster
    opts: StartOptions = field(default_factory=StartOptions)
    proc = None

    @property
    def endpoint(self) -> str:
        """Every member, comma-separated: what the load generators get."""
        return self.group.endpoints

    @property
    def url(self) -> str:
        return self.endpoint

    @property
    def probe_endpoint(self) -> str:
        """One member, for the harness's own gRPC calls."""
        return self.group.members[0].endpoint

    @property
    def metrics_url(self) -> None:
        return None

    def endpoints_by_kind(self) -> dict[str, str]:
        """Every kind of brainload node-capacity's goes to every member: none of its own."""
        return {}

    def processes(self) -> list:
        members = list(self.group.members) + (list(self.nats.members) if self.nats else [])
        return [m for m in members if m.running]

    def alive(self) -> bool:
        return all(m.running for m in self.group.members) and (
            self.nats is None or all(m.running for m in self.nats.members))

    def cpu_seconds(self) -> float:
        """utime+stime of every process of the cluster (each is its own process group)."""
        if not self.alive():
            return float("nan")
        return sum(cpu_seconds(m.proc.pid) for m in self.processes())

    def leader_name(self) -> str | None:
        """The member the cluster agrees leads, or None (an election under way)."""
        lead = self.group.leader()
        return lead.name if lead is not None else None

    def thread_cpu(self, name: str) -> dict[str, float]:
        """{member: CPU seconds of its threads called ``name``} for every running member that has one."""
        out = {}
        for m in self.processes():
            v = thread_cpu_seconds(m.proc.pid, name)
            if v is not None:
                out[m.name] = v
        return out

    def memory(self) -> dict:
        out: dict = {}
        for m in self.processes():
            for k, v in memory_kb(m.proc.pid).items():
                out[k] = out.get(k, 0) + v
        return out

    def log_tail(self, nbytes: int = 4000) -> str:
        logs = self.group.logs(nbytes // 3)
        if self.nats is not None:
            logs += "\n" + self.nats.logs(nbytes // 3)
        return logs

    def start(self) -> float:
        raise ServerError(f"{self.flavor.name} cluster: a member is down ({self.describe()}); "
                          f"the harness does not restart clusters")

    def kill(self) -> None:
        self.stop()

    def stop(self, grace: float = 10.0) -> float:
        t = time.monotonic()
        self.group.cleanup()
        if self.nats is not None:
            self.nats.cleanup()
        return time.monotonic() - t

    def remove(self) -> None:
        self.stop()

    def describe(self) -> str:
        bits = [f"{m.name} {'up' if m.running else 'down'}" for m in self.group.members]
        if self.nats is not None:
            bits += [f"nats {m.name} {'up' if m.running else 'down'}" for m in self.nats.members]
        return ", ".join(bits)

    def pids(self) -> dict[str, int]:
        return {m.name: m.proc.pid for m in self.processes()}


# ---------------------------------------------------------------------------
# Failover under a writer
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverPlan:
    leader_kills: int         # kill -9 of the leader (brain's, etcd's), then restart it
    nats_kills: int           # brain only: kill -9 of the NATS stream leader's nats-server
    rolling_restarts: int = 0  # SIGTERM and start again of every member in turn, leader included
    leader_isolations: int = 0  # SIGSTOP of the leader (brain's, etcd's), SIGCONT after isolate_seconds
    nats_rolling_restarts: int = 0  # brain only: every nats-server in turn: step-down, lame duck, start
    isolate_seconds: float = 5.0  # how long an isolated leader stays stopped
    rate: float = 300.0       # acknowledged-write rate asked of the open-loop writer (writes/s)
    clients: int = 16
    warmup: float = 3.0       # seconds of writes before the first kill
    down: float = 1.5         # seconds a killed member stays down after a new leader is seen
    settle: float = 2.5       # seconds after the restart before the next kill
    window: float = 3.0       # a kill's pause is a gap that begins within this many seconds of it
    pause_threshold: float = 0.1  # gaps above this are listed by the writer


# Seconds one fault's cycle takes at most, settle included (a new leader, the restart, every member
# serving): a brain leader is replaced in ~2 s and restarts in a few; a NATS stream leader is
# replaced after nats-server's Raft election timeout, a random 4-9 s.  Measured cycles: ~9.5 s and
# ~13 s with a 1 s settle.  A restart: a member's clean stop, its start and every member serving,
# per member.  An isolation: the stopped time (``isolate_seconds``, added) and the resumed member
# serving again.  A nats-server's planned restart: its step-down, lame duck mode (nats-server's
# default grace period of 10 s before it closes its clients, about a second per client after),
# its start and its stream replica current again, per server.
# Measured (smoke, loaded machine): an isolation's cycle ~5 s past its stopped time, a planned
# nats-server restart ~16 s.
CYCLE_ESTIMATE = {"leader": 12.0, "nats": 18.0, "restart": 10.0, "isolate": 6.0, "nats-roll": 20.0}


FAULT_NAMES = {"leader": "kill -9 leader", "nats": "kill -9 NATS stream leader", "restart": "SIGTERM and restart",
               "isolate": "leader isolated (SIGSTOP, SIGCONT later)",
               "nats-roll": "nats-server planned restart (step-down, lame duck, start)"}
# The result's list of write pauses for each fault, one per fault run (benchmarks.workloads reads them).
PAUSE_KEYS = {"leader": "leader_pauses_s", "nats": "nats_pauses_s", "restart": "restart_pauses_s",
              "isolate": "isolate_pauses_s", "nats-roll": "nats_restart_pauses_s"}


def cycle_seconds(fault: str, plan: FailoverPlan) -> float:
    """The most one run of ``fault`` is expected to take."""
    return CYCLE_ESTIMATE[fault] + (plan.isolate_seconds if fault == "isolate" else 0.0)


def fault_sequence(plan: FailoverPlan, nats: bool, members: int, nats_servers: int) -> list[str]:
    """The faults of a run in the order they are done: the kills, the isolations, the NATS kills
    and planned restarts (brain only), the members' rolling restarts."""
    return (["leader"] * plan.leader_kills + ["isolate"] * plan.leader_isolations
            + (["nats"] * plan.nats_kills + ["nats-roll"] * (plan.nats_rolling_restarts * nats_servers)
               if nats else [])
            + ["restart"] * (plan.rolling_restarts * members))


def writer_seconds(plan: FailoverPlan, nats: bool, members: int, nats_servers: int = 3) -> float:
    """How long the writer runs: the warm-up, every fault's cycle, and a tail."""
    faults = fault_sequence(plan, nats, members, nats_servers)
    return plan.warmup + sum(cycle_seconds(f, plan) for f in faults) + 5.0


def _kill_leader(group, plan: FailoverPlan) -> dict:
    lead, t_kill, t_new = group.kill_leader()
    time.sleep(plan.down)
    group.restart(lead)
    return {"fault": "leader", "member": lead.name, "t_unix": t_kill, "leader_after_s": t_new - t_kill}


def _isolate_leader(group, plan: FailoverPlan) -> dict:
    """SIGSTOP the leader's process group for ``isolate_seconds``, then SIGCONT: it is cut from its
    peers (and, for brain, from every nats-server) and from its clients, whose connections stay open
    unanswered, as under a partition.  ``leader_after_s``: when another member was seen leading
    (None: not within the isolation); a Status probe of the stopped member waits out its 2 s timeout,
    so the figure is an upper bound."""
    lead = group.wait_leader()
    t_stop = time.time()
    os.killpg(lead.proc.pid, signal.SIGSTOP)
    leader_after = None
    try:
        while time.time() < t_stop + plan.isolate_seconds:
            now = group.leader(timeout=0.5)
            if now is not None and now is not lead:
                leader_after = time.time() - t_stop
                break
            time.sleep(0.05)
        time.sleep(max(0.0, t_stop + plan.isolate_seconds - time.time()))
    finally:
        os.killpg(lead.proc.pid, signal.SIGCONT)
    return {"fault": "isolate", "member": lead.name, "t_unix": t_stop, "leader_after_s": leader_after,
            "isolated_s": round(time.time() - t_stop, 3)}


def _restart_member(group, member) -> dict:
    was_leader = group.leader() is member
    t_kill = time.time()
    member.stop()  # SIGTERM: a clean stop
    leader_after = None
    if was_leader:
        group.wait_leader(exclude=member)
        leader_after = time.time() - t_kill
    member.start()
    return {"fault": "restart", "member": member.name, "was_leader": was_leader, "t_unix": t_kill,
            "leader_after_s": leader_after}


def _kill_nats_leader(nats, stream: str, plan: FailoverPlan) -> dict:
    """kill -9 of the nats-server leading the journal stream, watched by every server's monitoring from
    before the kill (benchmarks/stream_leader.py): ``leader_after_s`` is when any server first named a new
    leader, ``stream_leader_since_s`` when that leader says it took over (None: it did not say)."""
    node = nats.wait_stream_leader(stream, timeout=30)
    with StreamLeaderWatch(nats.nodes, stream) as watch:
        time.sleep(4 * watch.interval)  # the leader as every server sees it before the kill
        t_kill = nats.kill9(node)
        new = watch.wait_new_leader(node.name, t_kill, timeout=60)
    kill = {"fault": "nats", "member": node.name, "t_unix": t_kill, "leader_after_s": new.seen_unix - t_kill,
            "stream_leader": new.leader, "stream_leader_seen_s": round(new.seen_unix - t_kill, 3),
            "stream_leader_since_s": None if new.since_unix is None else round(new.since_unix - t_kill, 3),
            "stream_leader_polls": len(watch.sightings)}
    time.sleep(plan.down)
    nats.restart(node)
    return kill


def _restart_nats_server(nats, node, streams: list[str]) -> dict:
    """A nats-server's planned restart, as docs/cluster.md "Operations" tells an operator: the
    leader of each of brain's streams (``streams``: the journal first, then the election and
    membership buckets) that this server leads stepped down first ($JS.API.STREAM.LEADER.STEPDOWN),
    then lame duck mode (``nats-server --signal ldm=<pid>``: it stops taking clients, hands its
    Raft leaders over, closes its clients one by one and exits), then a start with the same config
    and store, done when every stream's replicas are current again.  ``was_leader``: it led the
    journal; ``leader_after_s``: the journal's new leader seen.  ``window_s``: the write pause is
    the longest gap that begins while this runs."""
    t0 = time.time()
    was_leader = nats.stream_leader(streams[0]) is node
    leader_after = None
    for stream in streams:
        if nats.stream_leader(stream) is not node:
            continue
        reply = nats.js_request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", timeout=10)
        if not reply.get("success"):
            raise RuntimeError(f"stream leader step-down of {stream} on {node.name}: {reply}")
        nats.wait_stream_leader(stream, exclude=node, timeout=60)
        if stream == streams[0]:
            leader_after = time.time() - t0
    t_ldm = time.time()
    subprocess.run([nats.binary, "--signal", f"ldm={node.proc.pid}"], check=True, capture_output=True, timeout=30)
    node.proc.wait(timeout=300)
    lame_duck = time.time() - t_ldm
    nats.restart(node)
    for stream in streams:
        _wait_replicas_current(nats, stream, timeout=120)
    return {"fault": "nats-roll", "member": node.name, "was_leader": was_leader, "t_unix": t0,
            "leader_after_s": leader_after, "lame_duck_s": round(lame_duck, 2), "window_s": time.time() - t0}


def _wait_replicas_current(nats, stream: str, timeout: float) -> None:
    """Until ``stream`` has a leader and every other replica is online and current."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster = nats.stream_info(stream).get("cluster") or {}
        except Exception:  # noqa: BLE001 - no responders while the meta group settles: ask again
            cluster = {}
        replicas = cluster.get("replicas") or []
        if (cluster.get("leader") and len(replicas) == len(nats.members) - 1
                and all(r.get("current") and not r.get("offline") for r in replicas)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream}: replicas not current within {timeout:.0f} s: {cluster}")
        time.sleep(0.2)


def failover(target: ClusterTarget, plan: FailoverPlan, log_dir: Path, tag: str, say=print) -> dict:
    """Kill and isolate the leaders, restart every member (and every nats-server) in turn, under a
    clustercheck writer; return the run's result.

    Every fault gets: what was killed, stopped or restarted, when, how long until a new
    leader was seen (None: none was, or a restart of a follower), the write pause around
    it.  ``acked``, ``unknown`` (writes whose
    outcome the client could not know), ``lost`` (acknowledged writes the
    verify did not find at their revision) and ``violations`` (revisions that
    went back or were given twice, reads that disagree) cover the run.  A
    fault that no longer fits in the writer's time is skipped and listed."""
    from tests.support import clustercheck
    from tests.support.binaries import clustercheck_binary

    binary = clustercheck_binary()
    log_dir.mkdir(parents=True, exist_ok=True)
    record = log_dir / f"{tag}-acked.json"
    group, nats = target.group, target.nats
    nats_servers = len(nats.members) if nats is not None else 0
    duration = writer_seconds(plan, nats is not None, len(group.members), nats_servers)
    stream = JOURNAL_STREAM.format(name=group.name) if nats is not None else None
    prefix = f"/bench/failover/{tag}/"
    kills: list[dict] = []
    skipped: list[str] = []
    fault_error = None
    writer = clustercheck.start("write", target.endpoint, binary=binary, duration=duration, rate=plan.rate,
                                clients=plan.clients, record=record, pause_threshold=plan.pause_threshold,
                                prefix=prefix)
    with writer:
        end = writer.started + duration
        time.sleep(plan.warmup)
        turn = {"restart": 0, "nats-roll": 0}  # the next member / nats-server a rolling restart takes
        for fault in fault_sequence(plan, nats is not None, len(group.members), nats_servers):
            if time.time() + cycle_seconds(fault, plan) > end - 2.0:
                skipped.append(fault)
                continue
            t0 = time.time()
            try:
                if fault == "leader":
                    kill = _kill_leader(group, plan)
                elif fault == "isolate":
                    kill = _isolate_leader(group, plan)
                elif fault == "restart":
                    kill = _restart_member(group, group.members[turn[fault] % len(group.members)])
                    turn[fault] += 1
                elif fault == "nats-roll":
                    kill = _restart_nats_server(nats, nats.members[turn[fault] % nats_servers],
                                                jetstream_streams(group.name))
                    turn[fault] += 1
                else:
                    kill = _kill_nats_leader(nats, stream, plan)
                group.wait_serving(timeout=60)
            except (ServerStartError, TimeoutError, RuntimeError, subprocess.SubprocessError) as e:
                # The cluster did not come back from this fault: no further fault, but the writer's
                # record and the verify of what was acknowledged still count.
                fault_error = f"{FAULT_NAMES[fault]}: {' '.join(str(e).split())}"[:3000]
                say(f"    {fault_error[:300]}")
                break
            kill["cycle_s"] = round(time.time() - t0, 2)
            kills.append(kill)
            after = kill["leader_after_s"]
            say(f"    {FAULT_NAMES[fault]} {kill['member']}"
                + (f": a new leader after {after:.2f} s" if after is not None else ""))
            time.sleep(plan.settle)
        w = writer.result()
    v = clustercheck.run("verify", target.endpoint, binary=binary, record=record, prefix=prefix)
    for k in kills:
        window = max(plan.window, k.pop("window_s", 0.0))
        k["write_pause_s"] = round(clustercheck.pause_after(w, k["t_unix"], window=window), 3)
        if k["leader_after_s"] is not None:
            k["leader_after_s"] = round(k["leader_after_s"], 3)
        if k["fault"] == "nats":
            k["beyond_election_s"] = beyond_election(w, k, window)
    res = {
        "kills": kills,
        "skipped_kills": skipped,
        **{key: [k["write_pause_s"] for k in kills if k["fault"] == fault] for fault, key in PAUSE_KEYS.items()},
        "leader_restart_pauses_s": [k["write_pause_s"] for k in kills if k["fault"] == "restart" and k["was_leader"]],
        # what brain adds to NATS's own election of a new stream leader: when writes resumed minus when the new
        # leader took over (beyond_election), unclipped: negative when writes resumed first
        "nats_excess_pauses_s": [k["beyond_election_s"] for k in kills
                                 if k["fault"] == "nats" and k.get("beyond_election_s") is not None],
        "acked": w.get("acked"), "unknown": w.get("unknown"), "acked_per_s": w.get("acked_per_s"),
        "writer_seconds": w.get("run_seconds"), "rate": plan.rate,
        "longest_pause_s": w.get("longest_pause_s"),
        "writer_violations": w.get("violations"),
        "verified": v.get("acked"), "lost": v.get("missing"), "verify_violations": v.get("violations"),
        "ops": len(kills),
    }
    if fault_error:
        res["fault_error"] = fault_error
    for key in ("revision_problems", "problems", "failure"):
        if w.get(key):
            res["writer_" + key] = w[key]
        if v.get(key):
            res["verify_" + key] = v[key]
    return res


def pause_span(writer: dict, t_unix: float, window: float) -> tuple[float, float] | None:
    """(start, end) as unix times of the write pause ``clustercheck.pause_after`` takes for a fault at
    ``t_unix``: the longest gap that ends after it and begins within ``window``; None without one."""
    t = t_unix - writer["start_unix"]
    gaps = [(gap, start, end) for start, end, gap in writer.get("pauses", []) if end >= t and start <= t + window]
    if not gaps:
        return None
    _, start, end = max(gaps)
    return writer["start_unix"] + start, writer["start_unix"] + end


def beyond_election(writer: dict, kill: dict, window: float) -> float | None:
    """How long after NATS's new stream leader took over writes resumed: the end of the kill's write pause
    minus the leader's own leader_since (else when a server first named it).  Negative when writes
    resumed before it (a leader that took over before it said so, or a pause that ended on other
    writes); None when the writer saw no pause or no new leader was seen."""
    span = pause_span(writer, kill["t_unix"], window)
    since = kill.get("stream_leader_since_s")
    seen = kill.get("stream_leader_seen_s")
    elected = since if since is not None else seen
    if span is None or elected is None:
        return None
    return round(span[1] - (kill["t_unix"] + elected), 3)


def all_cluster_flavors() -> list[ClusterFlavor]:
    return [EtcdClusterFlavor(), BrainClusterFlavor()]
