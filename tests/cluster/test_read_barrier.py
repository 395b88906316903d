"""Linearizable reads on a 3-server NATS cluster (R3 journal), in one
process: a read that starts after a write was acknowledged sees it, on
every replica, whichever replica the write went through and whichever
NATS server each replica talks to; and a replica attached to a NATS
stream leader that lost its peers (SIGSTOP of the other two servers, a
crude stand-in for a partition) fails its linearizable reads instead of
answering from what that server holds, while its serializable reads go
on."""

from __future__ import annotations

import os
import signal
import time

import pytest

from brain.cluster import ClusterOptions
from brain.mvcc import errors
from brain.mvcc.requests import PutRequest, RangeRequest
from tests.cluster.test_replicas import Cluster, get


class PinnedCluster(Cluster):
    """Replicas that each talk to one NATS server of their own choosing
    (``servers[member]``; the first server by default)."""

    def __init__(self, nats, tmp_path, servers: dict[str, str], **kw):
        self.servers = servers
        super().__init__(nats, tmp_path, **kw)

    def options(self, member: str) -> ClusterOptions:
        url = self.servers.get(member, self.nats.urls[0])
        return ClusterOptions(journal_url=f"{url}/{self.name}", name=member, client_urls=(f"http://{member}:2379",),
                              election_timeout_ms=1000, heartbeat_interval_ms=250, read_lease=self.read_lease)


@pytest.fixture
def nats3(nats_cluster_factory):
    return nats_cluster_factory(3, sync_always=True)


def _wait(cond, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("read_lease", [True, False], ids=["lease", "no-lease"])
def test_a_read_after_a_write_through_another_replica_sees_it(nats3, tmp_path, read_lease):
    servers = {f"r{i}": nats3.urls[i] for i in range(3)}  # one NATS server each
    c = PinnedCluster(nats3, tmp_path, servers, read_lease=read_lease)
    try:
        c.leader()
        for i in range(12):
            writer = c.replicas[i % 3]
            key = b"k%d" % (i % 4)
            res = writer.engine.put(PutRequest(key, b"v%d" % i))
            for r in c.replicas:
                if r is writer:
                    continue
                kv = get(r, key)
                assert kv is not None and kv.value == b"v%d" % i and kv.mod_revision == res.revision, (
                    r.options.name, i)
        for r in c.followers(c.leader()):
            counts = (r.read_index.leased, r.read_index.confirmed)
            assert counts[1] >= 1 if not read_lease else sum(counts) >= 1, counts
    finally:
        c.close()


def test_a_replica_on_a_stream_leader_cut_off_from_its_peers_does_not_answer_linearizable_reads(nats3, tmp_path):
    c = PinnedCluster(nats3, tmp_path, {})
    stopped = []
    try:
        lead = c.leader()
        lead.engine.put(PutRequest(b"k", b"before"))
        stream = nats3.stream_leader(lead.journal.stream)
        assert stream is not None
        # a replica that talks to the stream leader only
        c.servers = {"cut": stream.url}
        cut = c.add("cut", start=True)
        assert get(cut, b"k").value == b"before"
        for node in nats3.nodes:
            if node is not stream:
                os.kill(node.proc.pid, signal.SIGSTOP)
                stopped.append(node)
        t0 = time.monotonic()
        # the leader's lease lapses once its renewals go unacknowledged
        _wait(lambda: not any(r.election.lease_valid() for r in c.replicas), 15, "a read lease outlived NATS's quorum")
        for r in (cut, lead):
            with pytest.raises(errors.EtcdError) as e:
                r.engine.wait_linearizable(timeout=10)
            assert e.value in (errors.ErrTimeout, errors.ErrNoLeader, errors.ErrLeaderChanged), e.value
            res = r.engine.range(RangeRequest(b"k", serializable=True))
            assert res.kvs[0].value == b"before"
        print(f"\nlinearizable reads refused for {time.monotonic() - t0:.1f}s on the cut-off stream leader")
        for node in stopped:
            os.kill(node.proc.pid, signal.SIGCONT)
        stopped = []
        deadline = time.monotonic() + 60
        while True:
            try:
                res = c.leader(timeout=60).engine.put(PutRequest(b"k", b"after"))
                break
            except errors.EtcdError:
                assert time.monotonic() < deadline, "writes did not come back after NATS did"
        for r in c.replicas:
            _wait(lambda: _linearizable_value(r) == b"after", 60, f"{r.options.name} did not read the new value")
            assert get(r, b"k").mod_revision == res.revision
    finally:
        for node in stopped:
            os.kill(node.proc.pid, signal.SIGCONT)
        c.close()


def _linearizable_value(r) -> bytes | None:
    try:
        kv = get(r, b"k")
    except errors.EtcdError:
        return None
    return kv.value if kv is not None else None
