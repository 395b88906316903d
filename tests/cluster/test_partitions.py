"""A 3-replica brain cluster on 3 nats-servers under network partitions:
every link (each replica to each nats-server, each pair of nats-servers)
goes through Toxiproxy (tests/support/partitioned.py), which cuts, slows
and heals single links while their connections stay open.

Faults, each held for a bounded time and healed before the test ends:
- a replica (the brain leader, or a follower) cut from every nats-server;
- a nats-server that does not lead the journal's stream cut from the other
  two while a replica reaches only it;
- the stream leader cut from its two peers while a replica reaches only it,
  the other replicas only its peers (the stale-read case: a linearizable
  read on the cut-off side must never miss a write the other side
  acknowledged);
- slow links (latency with jitter, a bandwidth limit) from the brain leader
  to every nats-server;
- partitions of random shape that heal mid-load, one after another
  (``BRAIN_PARTITION_ROUNDS``, 2 here, more under ``make test-full``).

Under each, over all three endpoints at once: clientv3 gets, puts, CAS and
deletes checked by porcupine and for the real-time order of header
revisions (clustercheck lin, 0 violations), an open-loop writer whose every
acknowledged write must be present at its revision and no key that was
never written be visible (write + verify), and a watcher (on the replica
under the fault where it has one) that must see every acknowledged
revision exactly once (watch).
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.support import clustercheck, servers
from tests.support.partitioned import PartitionedCluster

JOURNAL = "{name}_journal"
NATS = ("n1", "n2", "n3")
# How long a cut is held: past brain's election timeout (2 s) and nats-py's
# ping detection (5 s interval, 2 outstanding) on the cut side.
HOLD = 12.0
# How long the stale-read probe runs after the stream leader is cut: NATS
# elects a new stream leader after 4-9 s, the old one steps down after its
# own lost-quorum interval; the window between is the one probed.
PROBE_SECONDS = 25.0
# A stale-side read is sent every READ_INTERVAL.  It waits for its read
# index up to the request timeout (7 s), or two when it arrived while a
# round trip was on its way: READ_TIMEOUT leaves room for the server's
# verdict.
READ_INTERVAL = 0.1
READ_TIMEOUT = 20.0
# Reads sent in the window (see _probe_stale_reads) that must have had a
# verdict: the window runs from the first write acknowledged without the
# old stream leader (its peers elect another 4-9 s after the cut) until the
# old one steps down (its lost-quorum check, every 10 s, finds no peer heard
# from for 10 s: 10-20 s after the cut), so it is rarely under a second.
MIN_READS_IN_WINDOW = 5


@pytest.fixture
def net(nats_server_bin, clustercheck_bin, request):
    """A cluster of its own for each test (3-7 s to start), so a replica a
    fault left broken fails that test alone; the logs when it failed."""
    from tests.support import binaries

    binaries.require(binaries.toxiproxy_binary)
    cluster = PartitionedCluster(lifetime=900.0)
    t0 = time.monotonic()
    cluster.start()
    print(f"\npartitioned cluster up in {time.monotonic() - t0:.2f} s, {len(cluster.links)} proxies "
          f"({cluster.setup_seconds:.3f} s of it)")
    yield cluster
    if getattr(request.node, "cluster_test_failed", False):
        print(f"\n=== logs ===\n{cluster.logs()}")
    cluster.cleanup()


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


def _follower(pc):
    lead = pc.brain.wait_leader()
    return lead, next(m for m in pc.brain.members if m is not lead)


def _wait(what: str, cond, within: float, pc) -> float:
    """Seconds until ``cond()`` holds (polled every 0.2 s), or fail."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within, f"{what} not within {within:.0f} s\n{pc.logs()}"
        time.sleep(0.2)
    return time.monotonic() - t0


def _connected_to(pc, replica) -> set[str]:
    """The nats-servers holding a client connection named after ``replica``:
    the one it uses, and for up to two minutes (the server's own pings) one
    it left behind a cut."""
    out = set()
    for n in pc.nats.nodes:
        try:
            _status, body = n.monitor("/connz")
        except (OSError, ValueError):
            continue
        if any(c.get("name") == f"brain-{replica.name}" for c in body.get("connections", [])):
            out.add(n.name)
    return out


def _leads(replica) -> bool:
    """``replica`` says it leads (the cut-off old leader may still say so
    too, which is why LedGroup.leader(), asking for agreement, does not do)."""
    try:
        st = replica.status()
    except grpc.RpcError:
        return False
    return st.leader == st.header.member_id


def _serves_linearizable(replica) -> bool:
    try:
        with servers.kv_stub(replica.endpoint) as st:
            st.kv.Range(pb.RangeRequest(key=b"/ready"), timeout=2)
        return True
    except grpc.RpcError:
        return False


def _under_load(pc, tmp_path, fault, *, watch_on, tag: str, lin_clients: int = 6) -> dict:
    """Run ``fault()`` under clustercheck lin, write and watch (on
    ``watch_on``) over every endpoint, then verify; assert every check
    clean.  Returns the results by mode."""
    endpoints = pc.brain.endpoints
    stop = tmp_path / "stop"
    record = tmp_path / "acked.json"
    prefix = f"/partitions/{tag}/"
    bound = 240
    writer = clustercheck.start("write", endpoints, duration=bound, rate=150, clients=8, record=record,
                                prefix=prefix + "w/", pause_threshold=0.5, stop_file=stop)
    watcher = clustercheck.start("watch", watch_on.endpoint, duration=bound, acked=record, prefix=prefix + "w/",
                                 settle="60s", pause_threshold=0.5, stop_file=stop)
    # the writer bumps the revision too: lin's model lets it only grow
    lin = clustercheck.start("lin", endpoints, duration=bound, clients=lin_clients, keys=4, rate=40,
                             per_key=True, exclusive=False, op_timeout="4s", check_timeout="120s",
                             prefix=prefix + "lin/", stop_file=stop, visualize=tmp_path / "lin.html")
    with writer, watcher, lin:
        time.sleep(2.0)
        fault()
        time.sleep(2.0)
        stop.touch()
        res = {"write": writer.result(), "watch": watcher.result(), "lin": lin.result()}
    # a heal may be followed by elections: verify once every replica serves
    pc.brain.wait_serving(timeout=90)
    res["verify"] = clustercheck.run("verify", endpoints, record=record, prefix=prefix + "w/", retry="60s",
                                     dial_timeout="30s")
    w, seen, li, v = res["write"], res["watch"], res["lin"], res["verify"]
    print(f"\n{tag}: write {w['acked']} acked, {w['unknown']} unknown, longest pause {w['longest_pause_s']:.2f} s; "
          f"watch on {watch_on.name}: {seen['events']} events, {seen['missing']} missing, "
          f"{seen['duplicates']} duplicated, longest pause {seen['longest_pause_s']:.2f} s; "
          f"lin {li['ok']} ok, {li['unknown']} unknown, porcupine {li['check_result']}, "
          f"{li.get('header_order_checked')} answers in real-time order, "
          f"{li.get('header_order_violations')} not; verify {v['found']} found, {v['missing']} missing, "
          f"{v['phantoms']} never written, {v['unknown_present']} unknown outcomes present")
    for p in li.get("header_order_problems") or []:
        print("   ", p)
    for name, r in res.items():
        assert r["violations"] == 0, (name, {k: x for k, x in r.items() if k != "stderr_tail"})
    assert li["check_result"] == "Ok" and li["ok"] > 100, li
    assert v["missing"] == 0 and v["phantoms"] == 0 and v["acked"] == w["acked"] > 300, v
    assert seen["missing"] == 0 and seen["duplicates"] == 0 and seen["acked_watched"] > 0, seen
    return res


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_replica_cut_from_every_nats_server_then_healed(net, tmp_path, role):
    lead, follower = _follower(net)
    victim = lead if role == "leader" else follower

    def fault():
        cut = net.isolate([victim.name], NATS)
        t0 = time.monotonic()
        if role == "leader":
            others = [m for m in net.brain.members if m is not victim]
            took = _wait("a new brain leader", lambda: any(_leads(m) for m in others), 60, net)
            print(f"\n  {victim.name} (leader) cut off: another replica leads after {took:.1f} s")
        time.sleep(max(0.0, HOLD - (time.monotonic() - t0)))
        net.heal_all()
        took = _wait(f"{victim.name} serving again", lambda: _serves_linearizable(victim), 90, net)
        print(f"  {len(cut)} links healed after {HOLD:.0f} s: {victim.name} serves linearizable reads "
              f"{took:.1f} s later")
        time.sleep(3.0)

    _under_load(net, tmp_path, fault, watch_on=victim, tag=f"replica-{role}")


def test_nats_server_cut_from_its_peers_while_a_replica_reaches_only_it(net, tmp_path):
    stream = JOURNAL.format(name=net.brain.name)
    leader = net.nats.stream_leader(stream)
    assert leader is not None
    node = next(n for n in net.nats.nodes if n is not leader)
    peers = [n.name for n in net.nats.nodes if n is not node]
    _lead, reaching = _follower(net)

    def fault():
        net.isolate([reaching.name], peers)
        took = _wait(f"{reaching.name} on {node.name} alone", lambda: node.name in _connected_to(net, reaching),
                     60, net)
        print(f"\n  {reaching.name} reaches only {node.name} (connected after {took:.1f} s)")
        time.sleep(2.0)
        net.isolate([node.name], peers)
        print(f"  {node.name} (not the stream leader, {leader.name} is) cut from {peers}")
        time.sleep(HOLD)
        net.heal_all()
        took = _wait(f"{reaching.name} serving again", lambda: _serves_linearizable(reaching), 90, net)
        print(f"  healed: {reaching.name} serves linearizable reads {took:.1f} s later")
        time.sleep(3.0)

    _under_load(net, tmp_path, fault, watch_on=reaching, tag="nats-follower")


def _leads_by_its_own_view(node, stream: str) -> bool | None:
    """Whether nats-server ``node`` names itself the leader of ``stream``
    (asked on its monitoring port, which no proxy cuts); None when it does
    not answer."""
    try:
        _status, body = node.monitor("/jsz?accounts=true&streams=true", timeout=1.0)
    except (OSError, ValueError):
        return None
    for account in body.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                return (detail.get("cluster") or {}).get("leader") == node.name
    return False


def _probe_stale_reads(writer_side, stale_side, old, stream: str, seconds: float) -> dict:
    """For ``seconds``: a writer puts new values of one key through
    ``writer_side``, one after another, while every READ_INTERVAL a
    linearizable get of the key goes to ``stale_side`` without waiting for
    the previous one; an answer must show every write acknowledged before
    its read was sent.

    A read is *in the window* when it was sent after a write was
    acknowledged on the other side and while ``old``, the cut-off stream
    leader, still named itself the leader: only then could an answer be
    stale.  With the barrier such a read waits for its read index up to the
    request timeout, so each one is given READ_TIMEOUT to bring the server's
    verdict (answered, or refused with the server's error); one that brings
    none timed out and probed nothing.  Returns the counts, overall and in
    the window, and every stale answer."""
    key = b"/partitions/stale-probe"
    lock = threading.Lock()
    kinds = ("sent", "answered", "refused", "timed_out")
    out = {"acked": 0, "first_ack": None, "old_stepped_down": None, "stale": [], "errors": {},
           "all": dict.fromkeys(kinds, 0), "window": dict.fromkeys(kinds, 0)}
    acked_rev = 0
    stop = threading.Event()
    t0 = time.monotonic()

    def since() -> float:
        return round(time.monotonic() - t0, 2)

    def write(w) -> None:
        nonlocal acked_rev
        i = 0
        while not stop.is_set():
            i += 1
            try:
                rev = w.kv.Put(pb.PutRequest(key=key, value=b"%d" % i), timeout=3).header.revision
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            with lock:
                acked_rev = max(acked_rev, rev)
                out["acked"] += 1
                out["first_ack"] = out["first_ack"] or since()

    def count(in_window: bool, kind: str) -> None:
        out["all"][kind] += 1
        if in_window:
            out["window"][kind] += 1

    def verdict(floor: int, in_window: bool, sent_at: float, future) -> None:
        if future.cancelled():  # no verdict by the end of the probe
            with lock:
                count(in_window, "timed_out")
            return
        exc = future.exception()
        with lock:
            if exc is not None:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                count(in_window, "timed_out" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "refused")
                name = f"{code.name if code else type(exc).__name__}: {exc.details() if code else exc}"
                out["errors"][name] = out["errors"].get(name, 0) + 1
                return
            count(in_window, "answered")
            got = future.result()
            seen = got.kvs[0].mod_revision if got.kvs else 0
            if seen < floor or got.header.revision < floor:
                out["stale"].append({"sent": sent_at, "answered": since(), "in_window": in_window,
                                     "acked_rev": floor, "read_mod_rev": seen,
                                     "read_header_rev": got.header.revision})

    with servers.kv_stub(writer_side.endpoint) as w, servers.kv_stub(stale_side.endpoint) as r:
        writer = threading.Thread(target=write, args=(w,), name="stale-probe-writer", daemon=True)
        writer.start()
        reads = []
        try:
            while time.monotonic() - t0 < seconds:
                leads = _leads_by_its_own_view(old, stream)
                with lock:
                    if leads is False and out["old_stepped_down"] is None:
                        out["old_stepped_down"] = since()
                    floor = acked_rev  # every write acknowledged before the read is sent
                    in_window = floor > 0 and leads is True
                    count(in_window, "sent")
                sent_at = since()
                future = r.kv.Range.future(pb.RangeRequest(key=key), timeout=READ_TIMEOUT)
                future.add_done_callback(functools.partial(verdict, floor, in_window, sent_at))
                reads.append(future)
                time.sleep(READ_INTERVAL)
        finally:
            stop.set()
            writer.join(timeout=10)
            deadline = time.monotonic() + READ_TIMEOUT + 5
            for future in reads:
                try:
                    future.exception(timeout=max(0.0, deadline - time.monotonic()))
                except grpc.FutureTimeoutError:
                    future.cancel()
    return out


def test_stream_leader_cut_from_its_peers_no_stale_linearizable_read(net, tmp_path):
    """The stream leader L cut from its two peers; replica ``stale`` reaches
    only L, the others only L's peers, the brain leader among them.  The
    peers elect a new stream leader and the other side writes on; L still
    believes it leads until its lost-quorum interval ends.  A linearizable
    read on ``stale`` must then wait or fail, never answer without a write
    the other side already acknowledged."""
    stream = JOURNAL.format(name=net.brain.name)
    old = net.nats.stream_leader(stream)
    assert old is not None
    peers = [n.name for n in net.nats.nodes if n is not old]
    lead, stale = _follower(net)
    others = [m for m in net.brain.members if m is not stale]
    probe = {}

    def fault():
        net.isolate([stale.name], peers)
        net.isolate([m.name for m in others], [old.name])
        took = _wait("every replica on its side",
                     lambda: old.name in _connected_to(net, stale)
                     and all(_connected_to(net, m) & set(peers) for m in others),
                     90, net)
        print(f"\n  {stale.name} reaches only {old.name} (the stream leader), {_names(others)} only {peers} "
              f"(after {took:.1f} s); brain leader {lead.name}")
        time.sleep(2.0)
        net.isolate([old.name], peers)
        probe.update(_probe_stale_reads(lead, stale, old, stream, PROBE_SECONDS))
        new = net.nats.stream_leader(stream)
        print(f"  {old.name} cut from {peers}; after {PROBE_SECONDS:.0f} s the stream leader is "
              f"{new.name if new else None}; {probe['acked']} writes acknowledged on {lead.name}, the first "
              f"{probe['first_ack']} s after the cut; {old.name} named itself the leader until "
              f"{probe['old_stepped_down']} s; linearizable reads on {stale.name}: {probe['all']}, in the window "
              f"{probe['window']}; {len(probe['stale'])} stale")
        for error, n in sorted(probe["errors"].items()):
            print(f"    {n} x {error}")
        for s in probe["stale"][:10]:
            print("    stale:", s)
        net.heal_all()
        _wait(f"{stale.name} serving again", lambda: _serves_linearizable(stale), 90, net)
        time.sleep(3.0)

    _under_load(net, tmp_path, fault, watch_on=stale, tag="nats-stream-leader")
    window = probe["window"]
    # the dangerous window was probed: reads went to the stale side after
    # the other side acknowledged writes, while the old stream leader still
    # believed it led, and the server decided them (a client timeout
    # decides nothing)
    assert window["sent"] >= MIN_READS_IN_WINDOW, probe
    assert window["answered"] + window["refused"] >= MIN_READS_IN_WINDOW, probe
    assert probe["stale"] == [], probe


def test_slow_links_from_the_brain_leader(net, tmp_path):
    lead, _follower_ = _follower(net)
    links = [link for n in NATS for link in net.links_between(lead.name, n)]

    def fault():
        for link in links:
            net.toxiproxy.slow(link, latency_ms=100, jitter_ms=50, rate_kb=256)
        print(f"\n  {links}: 100 +- 50 ms each way, 256 KB/s")
        time.sleep(HOLD)
        net.heal_all()

    _under_load(net, tmp_path, fault, watch_on=lead, tag="slow")


def _random_partition(pc, rng: random.Random) -> tuple[str, list[str]]:
    """One of: a replica cut from every nats-server, a nats-server cut
    from its peers, a replica cut from all but one nats-server."""
    replicas = [m.name for m in pc.brain.members]
    kind = rng.choice(["replica", "nats", "one-server"])
    if kind == "replica":
        r = rng.choice(replicas)
        return f"{r} cut from NATS", pc.isolate([r], NATS)
    if kind == "nats":
        n = rng.choice(NATS)
        return f"{n} cut from its peers", pc.isolate([n], [x for x in NATS if x != n])
    r, n = rng.choice(replicas), rng.choice(NATS)
    return f"{r} reaches only {n}", pc.isolate([r], [x for x in NATS if x != n])


def test_partitions_heal_mid_load(net, tmp_path):
    rounds = int(os.environ.get("BRAIN_PARTITION_ROUNDS", "2"))
    seed = int(os.environ.get("BRAIN_PARTITION_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    _lead, watched = _follower(net)
    print(f"\n  seed {seed} (BRAIN_PARTITION_SEED), {rounds} rounds")

    def fault():
        for i in range(rounds):
            what, cut = _random_partition(net, rng)
            hold = rng.uniform(3.0, 8.0)
            time.sleep(hold)
            net.heal_all()
            took = _wait("every replica serving", lambda: all(_serves_linearizable(m) for m in net.brain.members),
                         90, net)
            print(f"  round {i + 1}: {what} ({len(cut)} links) for {hold:.1f} s; all serving {took:.1f} s "
                  f"after the heal")
            time.sleep(2.0)

    _under_load(net, tmp_path, fault, watch_on=watched, tag="heal-mid-load")


def test_every_link_goes_through_a_proxy(net):
    """The wiring the other tests rely on: every route connection between
    nats-servers ends at a proxy on one side (its soliciting side dialled a
    proxy's port), and each replica was given the proxies' addresses only."""
    ports = {int(a.rsplit(":", 1)[1]) for a in net.links.values()}
    total = via_proxy = 0
    for n in net.nats.nodes:
        _status, body = n.monitor("/routez")
        routes = body.get("routes", [])
        total += len(routes)
        via_proxy += sum(r.get("port") in ports for r in routes)
    assert total > 0 and via_proxy * 2 == total, (via_proxy, total)
    for m in net.brain.members:
        assert net.brain.nats_addresses(m) == [net.links[f"{m.name}-{n}"] for n in NATS]
