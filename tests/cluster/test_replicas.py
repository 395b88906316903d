"""Replicas of one engine on a shared JetStream journal, in one process:
writes through any replica, reads that see every acknowledged write,
failover, a deposed leader fenced and rebuilt, leases, membership,
retention.  (The same over real processes, kill -9 and etcd clients:
test_failover.py.)"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from brain.api import convert
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.cluster import ClusterOptions, Replica
from brain.cluster.forwarding import UNREADABLE
from brain.engine import EngineConfig
from brain.journal import JournalError, JournalUnavailableError
from brain.mvcc import errors
from brain.mvcc.requests import (
    CompactRequest,
    Compare,
    LeaseGrantRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
    CMP_EQUAL,
    CMP_MOD,
    CMP_VALUE,
)
from tests.support.memory_journal import key_held

_names = itertools.count()


class Cluster:
    """N in-process replicas of cluster ``name`` (their own data dirs)."""

    def __init__(self, nats, tmp_path, n=3, read_lease=True, read_txn=(), **engine_kw):
        """``read_txn``: the members given a reader for Txns forwarded as
        their clients' bytes (ClusterOptions.read_txn), by index."""
        self.nats = nats
        self.tmp = tmp_path
        self.name = f"t{next(_names)}x{int(time.time() * 1000) % 100000}"
        self.read_lease = read_lease
        self.read_txn = {f"r{i}" for i in read_txn}
        self.engine_kw = dict(shards=2, shard_boundaries=[b"m"], checkpoint_interval_seconds=3600) | engine_kw
        self.replicas: list[Replica] = []
        self.dead: list[Replica] = []  # killed, closed at the end
        for i in range(n):
            self.add(f"r{i}")
        for r in self.replicas:
            r.start()

    def options(self, member: str) -> ClusterOptions:
        return ClusterOptions(journal_url=f"{self.nats.urls[0]}/{self.name}", name=member,
                              client_urls=(f"http://{member}:2379",), election_timeout_ms=1000,
                              heartbeat_interval_ms=250, read_lease=self.read_lease,
                              read_txn=convert.forwarded_txn_reader() if member in self.read_txn else None)

    def add(self, member: str, start: bool = False) -> Replica:
        r = Replica.open(self.options(member), EngineConfig(str(self.tmp / member), **self.engine_kw))
        self.replicas.append(r)
        if start:
            r.start()
        return r

    def leader(self, timeout=15.0, exclude=()) -> Replica:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.replicas:
                if r not in exclude and r.engine.is_leader:
                    return r
            time.sleep(0.02)
        raise AssertionError("no leader elected")

    def followers(self, leader) -> list[Replica]:
        return [r for r in self.replicas if r is not leader]

    def kill(self, r: Replica) -> None:
        """As close to kill -9 as one process allows: the replica stops
        talking to NATS at once (no resign, no final anything)."""
        r.election._stop.set()
        r.membership.stop()
        r.conn.close()
        self.replicas.remove(r)
        self.dead.append(r)

    def close(self) -> None:
        for r in self.replicas:
            r.close()
        for r in self.dead:
            try:
                r.engine.close()
            except Exception:  # noqa: BLE001 - its connection is gone
                pass


@pytest.fixture
def cluster(nats1, tmp_path):
    made = []

    def make(n=3, **kw):
        c = Cluster(nats1, tmp_path / f"c{len(made)}", n, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def get(r: Replica, key: bytes, serializable=False):
    if not serializable:
        r.engine.wait_linearizable()
    res = r.engine.range(RangeRequest(key, serializable=serializable))
    return res.kvs[0] if res.kvs else None


def test_writes_through_any_replica_read_everywhere_at_one_revision(cluster):
    c = cluster()
    leader = c.leader()
    revs = []
    for i, r in enumerate(c.replicas * 3):
        revs.append(r.engine.put(PutRequest(b"k%d" % i, b"v%d" % i)).revision)
    assert revs == list(range(2, 2 + len(revs)))
    for r in c.replicas:
        # linearizable: sees every acknowledged write, whichever replica took it
        res = r.engine.range(RangeRequest(b"k", b"l")) if r.engine.wait_linearizable() is None else None
        assert res.count == len(revs)
        assert res.revision == revs[-1]
    # the same history everywhere: create/mod revisions and versions
    snapshots = [[(kv.key, kv.create_revision, kv.mod_revision, kv.version)
                  for kv in r.engine.range(RangeRequest(b"\0", b"")).kvs] for r in c.replicas]
    assert snapshots[0] == snapshots[1] == snapshots[2]
    st = leader.engine.statistics()
    assert st.role == "leader" and st.epoch >= 1


def test_a_follower_answers_its_client_after_applying_the_write(cluster):
    c = cluster()
    leader = c.leader()
    f = c.followers(leader)[0]
    res = f.engine.put(PutRequest(b"mine", b"1"))
    # read-your-writes on the replica written through, even serializable
    kv = get(f, b"mine", serializable=True)
    assert kv is not None and kv.mod_revision == res.revision


def test_txn_and_errors_come_back_from_the_leader(cluster):
    c = cluster()
    f = c.followers(c.leader())[0]
    put = f.engine.put(PutRequest(b"a", b"1"))
    t = f.engine.txn(TxnRequest([Compare(CMP_EQUAL, CMP_MOD, b"a", union="mod_revision", operand=put.revision)],
                                [PutRequest(b"a", b"2")], []))
    assert t.succeeded
    t2 = f.engine.txn(TxnRequest([Compare(CMP_EQUAL, CMP_MOD, b"a", union="mod_revision", operand=put.revision)],
                                 [PutRequest(b"a", b"3")], []))
    assert not t2.succeeded
    with pytest.raises(errors.EtcdError) as e:
        f.engine.compact(CompactRequest(10_000))
    assert e.value == errors.ErrFutureRev
    with pytest.raises(errors.EtcdError) as e:
        f.engine.put(PutRequest(b"x", b"1", lease=12345))
    assert e.value == errors.ErrLeaseNotFound


def _submit(r: Replica, requests: list, wires: list) -> list:
    """r.engine.submit_batch's outcomes in order: a result or an EtcdError each."""
    out: list = [None] * len(requests)
    left = [len(requests)]
    done = threading.Event()

    def settled(items) -> None:
        for slot, result, exc in items:
            out[slot] = exc if exc is not None else result
        left[0] -= len(items)
        if not left[0]:
            done.set()

    r.engine.submit_batch(requests, settled, wires=wires)
    assert done.wait(15), out
    return out


def _put_txn(key: bytes, value: bytes) -> tuple[TxnRequest, bytes]:
    m = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value))])
    return convert.txn_request(m), m.SerializeToString()


def test_a_follower_forwards_a_txn_as_its_clients_bytes_and_the_leader_decides_those(cluster):
    c = cluster(read_txn=(0, 1, 2))
    f = c.followers(c.leader())[0]
    assert f.txn_bytes_read_by_all()
    sent, wire = _put_txn(b"a", b"from the bytes")
    garbage = b"\x0a\xff"  # a compare longer than the message
    plain = PutRequest(b"b", b"a request")
    out = _submit(f, [sent, TxnRequest([], [PutRequest(b"c", b"x")], []), plain], [wire, garbage, None])
    assert out[0].succeeded and not isinstance(out[2], errors.EtcdError), out
    assert out[1] == UNREADABLE  # that write alone failed
    assert f.forwarder.forwarded_as_bytes == 2
    assert get(f, b"a").value == b"from the bytes"  # the leader read the bytes, not brain's request
    assert get(f, b"b").value == b"a request" and get(f, b"c") is None


def test_while_a_member_cannot_read_txn_bytes_followers_forward_requests(cluster):
    c = cluster(read_txn=(0, 1))  # r2 is an older brain, say
    leader = c.leader()
    f = next(r for r in c.followers(leader) if r.options.read_txn is not None)
    deadline = time.monotonic() + 10
    while len(f.membership.members()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # every member's entry seen
    assert not f.txn_bytes_read_by_all()
    sent, wire = _put_txn(b"a", b"1")
    [res] = _submit(f, [sent], [wire])
    assert res.succeeded and f.forwarder.forwarded_as_bytes == 0
    assert get(f, b"a").value == b"1"


def test_failover_keeps_every_acknowledged_write(cluster):
    c = cluster()
    acked = {}
    stop = threading.Event()

    def writer(r_index):
        for i in itertools.count():
            if stop.is_set():
                return
            r = c.replicas[r_index % len(c.replicas)]
            key = b"w%d-%d" % (r_index, i)
            try:
                # a client's deadline: the killed replica never answers
                acked[key] = r.engine.submit(PutRequest(key, b"v")).result(10).revision
            except (errors.EtcdError, TimeoutError):
                time.sleep(0.01)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    old = c.leader()
    killed_at = time.monotonic()
    c.kill(old)
    new = c.leader(exclude=(old,))
    took = time.monotonic() - killed_at
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert took < 5, f"failover took {took:.1f}s"
    assert new.engine.term > old.engine.term
    for r in c.replicas:
        r.engine.wait_linearizable()
        for key, rev in acked.items():
            kv = get(r, key, serializable=True)
            assert kv is not None and kv.mod_revision == rev, (key, rev, kv)
    revs = sorted(acked.values())
    assert len(set(revs)) == len(revs)


def test_a_deposed_leader_is_fenced_and_rebuilds(cluster):
    c = cluster()
    old = c.leader()
    old.engine.put(PutRequest(b"before", b"1"))
    # the old leader stops renewing its key and beating (paused) but keeps believing it leads
    renew, beat = old.election._renew, old.election._beat

    async def paused() -> None:
        pass

    old.election._renew = old.election._beat = paused
    new = c.leader(exclude=(old,))
    new.engine.put(PutRequest(b"after", b"2"))
    assert old.engine.is_leader  # it has not noticed yet
    # its next write is refused by the journal's fence: not applied anywhere
    with pytest.raises(errors.EtcdError) as e:
        old.engine.put(PutRequest(b"stale", b"x"))
    assert e.value == errors.ErrLeaderChanged
    deadline = time.monotonic() + 10
    while old.engine.is_leader and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not old.engine.is_leader
    old.engine.wait_linearizable()
    assert get(old, b"stale", serializable=True) is None
    assert get(old, b"after", serializable=True) is not None
    for r in c.replicas:
        assert get(r, b"stale") is None
    # it wakes up: its key is gone, it learns who leads, and it is a working follower
    old.election._renew, old.election._beat = renew, beat
    res = old.engine.put(PutRequest(b"again", b"3"))
    assert get(new, b"again").mod_revision == res.revision


def test_leases_granted_through_a_follower_expire_on_the_leader(cluster):
    c = cluster()
    leader = c.leader()
    f = c.followers(leader)[0]
    g = f.engine.lease_grant(LeaseGrantRequest(2))
    f.engine.put(PutRequest(b"leased", b"v", lease=g.id))
    assert f.engine.lease_time_to_live(g.id).granted_ttl == 2
    assert [i for i in f.engine.lease_leases().ids] == [g.id]
    out = []
    f.engine.lease_keepalive_many([g.id, 999], out.extend)
    deadline = time.monotonic() + 5
    while not out and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out == [(g.id, 2), (999, 0)]
    deadline = time.monotonic() + 10
    while get(f, b"leased") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert get(f, b"leased") is None
    with pytest.raises(errors.EtcdError):
        f.engine.lease_time_to_live(g.id)


def test_membership_lists_every_replica_and_removes_one(cluster):
    c = cluster()
    leader = c.leader()
    deadline = time.monotonic() + 10
    while len(leader.members()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    members = leader.members()
    assert sorted(m.name for m in members) == ["r0", "r1", "r2"]
    assert all(m.client_urls == [f"http://{m.name}:2379"] for m in members)
    victim = c.followers(leader)[0]
    removed = threading.Event()
    victim._removed = removed.set  # instead of ending the process
    victim.membership.on_removed = removed.set
    assert leader.remove_member(victim.engine.member_id)
    assert not leader.remove_member(victim.engine.member_id)
    assert removed.wait(10)


def test_retention_purges_what_every_replica_checkpointed(cluster):
    c = cluster()
    leader = c.leader()
    for i in range(50):
        c.replicas[i % 3].engine.put(PutRequest(b"r%d" % i, b"v"))
    for r in c.replicas:
        r.engine.wait_linearizable()
        r.engine.checkpoint()
        r.membership.heartbeat_now() if hasattr(r.membership, "heartbeat_now") else None
    time.sleep(2.5)  # heartbeats carry the checkpoints
    purged = leader.retain_once()
    assert purged > 0
    assert leader.journal.first_index > 1
    # a replica restarted from its own checkpoint still catches up
    f = c.followers(leader)[0]
    f.close()
    c.replicas.remove(f)
    leader.engine.put(PutRequest(b"late", b"1"))
    back = c.add(f.options.name, start=True)
    assert get(back, b"late") is not None
    assert get(back, b"r49") is not None


def test_a_new_replica_after_a_purge_starts_from_a_peers_snapshot(cluster):
    c = cluster()
    leader = c.leader()
    for i in range(60):
        c.replicas[i % 3].engine.put(PutRequest(b"s%02d" % i, b"v%d" % i))
    lease = leader.engine.lease_grant(LeaseGrantRequest(300))
    leader.engine.put(PutRequest(b"leased", b"x", lease=lease.id))
    for r in c.replicas:
        r.engine.wait_linearizable()
        r.engine.checkpoint()
    time.sleep(2.5)  # heartbeats carry the checkpoints
    assert leader.retain_once() > 0 and leader.journal.first_index > 1
    newcomer = c.add("r9", start=True)  # an empty data dir: revision 1 is gone from the journal
    assert get(newcomer, b"s59").value == b"v59"
    assert get(newcomer, b"leased").lease == lease.id
    ref = [(kv.key, kv.create_revision, kv.mod_revision, kv.version)
           for kv in leader.engine.range(RangeRequest(b"\0", b"")).kvs]
    newcomer.engine.wait_linearizable()
    got = [(kv.key, kv.create_revision, kv.mod_revision, kv.version)
           for kv in newcomer.engine.range(RangeRequest(b"\0", b"")).kvs]
    assert got == ref
    # and it follows from there: a write through it and through the others
    res = newcomer.engine.put(PutRequest(b"from-new", b"1"))
    assert get(leader, b"from-new").mod_revision == res.revision
    assert leader.snapshots.served + sum(r.snapshots.served for r in c.followers(leader)) == 1


def test_a_replica_whose_records_were_purged_starts_again_from_a_snapshot(cluster):
    c = cluster()
    leader = c.leader()
    away = c.followers(leader)[0]
    name = away.options.name
    away.close()
    c.replicas.remove(away)
    for i in range(40):
        c.replicas[i % 2].engine.put(PutRequest(b"p%02d" % i, b"v"))
    for r in c.replicas:
        r.engine.wait_linearizable()
        r.engine.checkpoint()
    time.sleep(2.5)  # heartbeats carry the checkpoints; the absent replica's stopped
    leader.membership.refresh()
    entries = {m.name: m for m in leader.membership.members()}
    live = [entries[r.options.name] for r in c.replicas]
    gone = entries[name]
    assert all(m.updated > gone.updated + 0.2 for m in live), (gone, live)
    # only the live replicas count: a floor over the entries heard from
    # since the absent one stopped is theirs, above the absent one's checkpoint
    now = time.time()
    floor = leader.membership.retention_floor(now=now, stale_after=now - gone.updated - 0.2)
    assert floor == min(m.checkpoint_index for m in live) > gone.checkpoint_index, (floor, gone, live)
    leader.journal.purge(floor + 1)
    back = c.add(name, start=True)
    assert get(back, b"p39") is not None
    assert back.engine.statistics().applied_index >= floor


def test_after_a_failover_every_lease_gets_its_full_ttl_again(cluster):
    c = cluster()
    old = c.leader()
    g = old.engine.lease_grant(LeaseGrantRequest(10))
    time.sleep(3)
    assert old.engine.lease_time_to_live(g.id).ttl <= 7
    c.kill(old)
    new = c.leader(exclude=(old,))
    left = new.engine.lease_time_to_live(g.id)
    # etcd on a leader change: the remaining time starts over (plus the extension)
    assert left.granted_ttl == 10 and left.ttl >= 9, left
    f = next(r for r in c.replicas if r is not new)
    assert f.engine.lease_time_to_live(g.id).ttl >= 9


def test_a_replica_whose_rebuild_is_pending_does_not_lead(cluster):
    """A leader that lost its key while an append's outcome was unknown
    holds a batch the journal may not have; until its store is rebuilt
    from the journal it must not lead, or its next batch would follow a
    revision no other replica has (a NATS quorum loss did this: the old
    leader won the key back and wrote revision 15 after 13)."""
    from brain.journal import JournalUnavailableError

    c = cluster()
    lead = c.leader()
    base = lead.engine.put(PutRequest(b"k", b"committed")).revision
    eng = lead.engine

    def unavailable() -> None:
        raise JournalUnavailableError("no quorum (test)")

    def unreadable(*a, **kw):
        raise JournalUnavailableError("cannot read the journal (test)")

    eng.journal.append = lambda payload: eng.journal.last_index + 1  # never reaches NATS
    eng.journal.sync = unavailable
    eng._load_store = unreadable
    outcome: list = []
    t = threading.Thread(target=lambda: outcome.append(_try(eng.put, PutRequest(b"k", b"unknown"))))
    t.start()
    deadline = time.monotonic() + 5
    while eng.store.revision == base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.store.revision == base + 1  # applied in memory, its append never acknowledged
    eng.step_down()  # the election lost the key
    t.join(10)
    assert outcome and outcome[0] == errors.ErrTimeoutDueToLeaderFail
    del eng.journal.append, eng.journal.sync
    assert not eng.promote(key_held)  # the rebuild cannot read the journal yet
    assert not eng.is_leader
    del eng._load_store
    deadline = time.monotonic() + 10
    while not eng.promote(key_held):
        assert time.monotonic() < deadline, "no lead once the store could be rebuilt"
        time.sleep(0.1)
    assert eng.store.revision == base
    res = eng.put(PutRequest(b"k", b"after"))
    assert res.revision == base + 1
    for r in c.replicas:
        kv = get(r, b"k")
        assert (kv.value, kv.mod_revision) == (b"after", base + 1), r.name


def test_a_rebuild_that_reads_a_journal_still_catching_up_retries(cluster):
    """A rebuild whose journal read ends before records this replica has
    already applied saw a stream view still catching up (a NATS server just
    back from a partition answered with its own older end; the partition
    suite hit it): it is retried, never taken for a corrupt store."""
    c = cluster()
    lead = c.leader()
    eng = lead.engine
    for i in range(5):
        base = eng.put(PutRequest(b"k", b"v%d" % i)).revision

    def unavailable() -> None:
        raise JournalUnavailableError("no quorum (test)")

    real = eng._load_store
    short_reads: list[int] = []

    def behind(upto_index=None):
        if len(short_reads) < 2:  # the first two reads see an older end of the stream
            short_reads.append(upto_index)
            return real(upto_index=upto_index - 2)
        return real(upto_index=upto_index)

    eng.journal.append = lambda payload: eng.journal.last_index + 1  # never reaches NATS
    eng.journal.sync = unavailable
    eng._load_store = behind
    t = threading.Thread(target=lambda: _try(eng.put, PutRequest(b"k", b"unknown")))
    t.start()
    deadline = time.monotonic() + 5
    while eng.store.revision == base and time.monotonic() < deadline:
        time.sleep(0.01)
    eng.step_down()  # the unknown append: a rebuild from the journal
    t.join(10)
    del eng.journal.append, eng.journal.sync
    deadline = time.monotonic() + 15
    while not eng.promote(key_held):
        assert eng.statistics().failed is None, eng.statistics().failed
        assert time.monotonic() < deadline, "no lead once the journal read reached the applied index"
        time.sleep(0.1)
    assert len(short_reads) == 2 and eng.statistics().failed is None
    assert eng.store.revision == base and get(lead, b"k").value == b"v4"


def _try(fn, *args):
    try:
        return fn(*args)
    except errors.EtcdError as e:
        return e


def _value_is(key: bytes, value: bytes) -> Compare:
    return Compare(CMP_EQUAL, CMP_VALUE, key, union="value", operand=value)


def test_a_deposed_leader_does_not_answer_a_failed_compare_from_its_store(cluster):
    """A leader paused past its key's timeout still believes it leads; a Txn
    whose compare fails on its store appends nothing, so no fence stops it.
    Answered from that store it said "compare failed" at a revision below the
    new leader's acknowledged write (the issue's cas(k2) -> false @4500 after
    put @4501).  It must be decided on the whole journal instead: here by the
    new leader, once the old one found out and stepped down."""
    c = cluster()
    old = c.leader()
    first = old.engine.put(PutRequest(b"k", b"v1"))
    renew, beat = old.election._renew, old.election._beat

    async def paused() -> None:
        pass

    old.election._renew = old.election._beat = paused
    new = c.leader(exclude=(old,))
    second = new.engine.put(PutRequest(b"k", b"v2"))
    assert old.engine.is_leader and old.engine.committed_rev == first.revision  # it has not noticed
    cas = TxnRequest([_value_is(b"k", b"v2")], [PutRequest(b"k", b"v3")], [RangeRequest(b"k")])
    out: list = []
    t = threading.Thread(target=lambda: out.append(_try(old.engine.txn, cas)))
    t.start()
    deadline = time.monotonic() + 10
    while old.engine.is_leader and time.monotonic() < deadline:
        time.sleep(0.02)
    # it stepped down (the journal is past its last append); its election
    # wakes up too and learns who leads, so the Txn can be forwarded
    old.election._renew, old.election._beat = renew, beat
    t.join(20)
    assert out, "the Txn was not answered"
    res = out[0]
    assert not isinstance(res, errors.EtcdError), res
    assert res.succeeded and res.revision == second.revision + 1, res
    assert old.engine.unwritten_confirmations >= 1
    assert get(new, b"k").value == b"v3"


def test_without_the_read_lease_every_read_index_is_a_barrier_record(cluster):
    """read_lease=False: the leader confirms a failed compare or a
    linearizable read with a barrier record acknowledged by the journal,
    and followers' read indexes are barrier records too (never the
    leader's lease, whose answer rests on the clock bound)."""
    c = cluster(read_lease=False)
    lead = c.leader()
    f = c.followers(lead)[0]
    put = f.engine.put(PutRequest(b"k", b"v1"))
    before = lead.engine.unwritten_confirmations
    res = lead.engine.txn(TxnRequest([_value_is(b"k", b"other")], [PutRequest(b"k", b"x")], [RangeRequest(b"k")]))
    assert not res.succeeded and res.revision == put.revision
    assert res.responses[0].kvs[0].value == b"v1"
    assert lead.engine.unwritten_confirmations == before + 1
    trips = lead.engine.read_index_round_trips
    appended = lead.journal.appended
    assert get(lead, b"k").value == b"v1"
    assert lead.engine.read_index_round_trips == trips + 1
    assert lead.journal.appended == appended + 1  # the barrier record
    for r in c.followers(lead):
        assert get(r, b"k").value == b"v1"
        assert r.read_index.leased == 0 and r.read_index.confirmed >= 1
        assert r.engine.store.revision == put.revision  # barrier records hold no revision


def test_a_record_in_a_newer_format_stops_followers_before_applying_it(cluster):
    """A replica of a newer brain leads and writes a record in a format this
    one does not know (here appended through the leader's journal while its
    committer is idle): every follower refuses it with a message that says
    so, applies nothing of it or after it, and says it has failed."""
    from brain.mvcc.codec import FORMAT_VERSION, BatchEncoder

    c = cluster()
    leader = c.leader()
    before = leader.engine.put(PutRequest(b"before", b"1"))
    followers = c.followers(leader)
    for f in followers:
        assert get(f, b"before") is not None
    enc = BatchEncoder()
    enc.begin_revision(before.revision + 1)
    enc.put(b"newer", b"x", 0)
    newer = b"V" + bytes((FORMAT_VERSION + 1,)) + enc.finish()[2:]
    index = leader.journal.append(newer)
    leader.journal.sync()
    deadline = time.monotonic() + 15
    while not all(f.engine.statistics().failed for f in followers) and time.monotonic() < deadline:
        time.sleep(0.02)
    for f in followers:
        st = f.engine.statistics()
        assert st.failed and f"format version {FORMAT_VERSION + 1} is newer than this brain reads" in st.failed, st
        assert st.applied_index == index - 1 and get(f, b"newer", serializable=True) is None
        assert f.engine.range(RangeRequest(b"before", serializable=True)).revision == before.revision


def test_replicas_that_stopped_applying_leave_the_election(cluster):
    """Followers that met a record they cannot apply refuse writes until
    restarted, so they can never lead: once the leader is gone neither
    campaigns (a candidate that won the key and failed to take the lead
    would do so about once a second, keeping a healthy replica out)."""
    from brain.mvcc.codec import FORMAT_VERSION, BatchEncoder, FormatVersionError

    c = cluster()
    leader = c.leader()
    before = leader.engine.put(PutRequest(b"before", b"1"))
    followers = c.followers(leader)
    enc = BatchEncoder()
    enc.begin_revision(before.revision + 1)
    enc.put(b"newer", b"x", 0)
    leader.journal.append(b"V" + bytes((FORMAT_VERSION + 1,)) + enc.finish()[2:])
    leader.journal.sync()
    deadline = time.monotonic() + 15
    while not all(f.cannot_lead for f in followers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(f.cannot_lead and "newer than this brain reads" in f.cannot_lead for f in followers)
    assert all(f.serving_problem() == "this replica refuses writes until restarted" for f in followers)
    c.kill(leader)
    # the dead leader's key goes stale after the election timeout (1 s) or
    # KEY_ONLY_TIMEOUT (2 s); candidates would win it within a second more
    time.sleep(6)
    for f in followers:
        assert f.election.elections == 0 and not f.engine.is_leader
        assert not f.has_leader()
    # restarted, a replica replays the journal past its checkpoint while it
    # opens and meets the record again: it refuses to start, loudly, and
    # so never joins the election
    again = followers[0]
    again.close()
    c.replicas.remove(again)
    with pytest.raises(FormatVersionError, match="newer than this brain reads"):
        c.add(again.options.name, start=True)
    time.sleep(2)
    assert followers[1].election.elections == 0 and not followers[1].has_leader()


def test_a_leader_whose_journal_writes_fail_gives_up_the_lead_for_good(cluster):
    """A journal write that fails for another reason than a fence or an
    unknown outcome (here an I/O error from the leader's journal) makes the
    engine refuse writes until restart: the replica gives the key up at
    once, another replica leads, and the failed one never takes it back."""
    import errno

    c = cluster()
    old = c.leader()
    old.engine.put(PutRequest(b"before", b"1"))
    elected = old.election.elections

    def broken(payload: bytes) -> int:
        raise OSError(errno.EIO, "injected: the journal's disk failed")

    old.journal.append = broken
    with pytest.raises(errors.EtcdError) as e:
        old.engine.put(PutRequest(b"lost", b"x"))
    assert e.value == errors.ErrStopped
    assert old.cannot_lead and "journal write failed" in old.cannot_lead
    new = c.leader(exclude=(old,))
    res = new.engine.put(PutRequest(b"after", b"2"))
    for r in c.followers(old):
        assert get(r, b"after").mod_revision == res.revision and get(r, b"lost") is None
    # the new leader leaves (its key expires unrenewed); the third replica
    # takes over, never the failed one
    third = next(r for r in c.followers(old) if r is not new)
    c.kill(new)
    assert c.leader(exclude=(old, new)) is third
    time.sleep(3)
    assert old.election.elections == elected and not old.engine.is_leader


def test_a_journal_that_lost_its_records_is_refused_loudly(cluster, monkeypatch):
    """The journal's stream deleted under a running cluster and created
    again empty (here by a replica restarting, which creates a missing
    stream): the restarted replica refuses to start, and the running ones,
    whose next append is fenced on the empty stream, stop leading and
    refuse writes instead of campaigning forever (seen before: elections
    won and promotions fenced in a loop, logged at INFO only).  The wait
    for a cut-off stream leader's old end (15 s) is shortened here."""
    from brain.cluster import replica as replica_module
    from brain.engine import replication
    from brain.journal.jetstream_stream import api_request

    monkeypatch.setattr(replication, "JOURNAL_SHORT_FOR", 2.0)
    monkeypatch.setattr(replica_module, "JOURNAL_SHORT_FOR", 2.0)
    c = cluster()
    leader = c.leader()
    for i in range(5):
        leader.engine.put(PutRequest(b"k%d" % i, b"v"))
    restarting = c.followers(leader)[0]
    restarting.close()
    c.replicas.remove(restarting)
    j = leader.journal
    deleted = j.conn.run(api_request(j.conn, f"$JS.API.STREAM.DELETE.{j.stream}", b""), 10)
    assert deleted.get("success"), deleted
    with pytest.raises(JournalError, match="records it held are lost"):
        c.add(restarting.options.name)
    # the running replicas find out when one of them next tries to lead
    with pytest.raises(errors.EtcdError):
        leader.engine.put(PutRequest(b"after", b"x"))
    deadline = time.monotonic() + 30
    while not all(r.cannot_lead for r in c.replicas) and time.monotonic() < deadline:
        time.sleep(0.1)
    for r in c.replicas:
        assert r.cannot_lead and "records it held are lost" in r.cannot_lead, r.cannot_lead
        assert not r.engine.is_leader
        assert r.serving_problem() == "this replica refuses writes until restarted"
