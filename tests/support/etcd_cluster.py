"""A 3-member (or N-member) etcd 3.6 cluster on loopback, for the cluster
tests' baseline and the cluster benchmarks.

etcd 3.6 is the binary that ``benchmarks/build.sh`` builds (cached under
``$BRAIN_BENCH_CACHE``); ``ETCD36_BIN`` points at another one. Every member
gets free loopback ports and a data dir under one temporary root; the members
start together (none answers before a quorum exists) and ``start()`` returns
once each answers a linearizable Range and one of them leads.

Faults: ``kill9(member)`` (SIGKILL, data dir kept), ``restart(member)`` (same
ports and data dir), ``move_leader(to)``; ``leader()`` asks the members' Status.
A ``Watchdog`` kills the members if the test process dies or ``lifetime``
seconds pass, so a crashed or hung test leaves no etcd behind.

    with EtcdCluster(3) as cluster:          # or start_etcd_cluster(3)
        cluster.endpoints                    # "127.0.0.1:p1,127.0.0.1:p2,..."
        old = cluster.leader()
        cluster.kill9(old)
        new = cluster.wait_leader(exclude=old)
        cluster.restart(old)
"""

from __future__ import annotations

import time
from typing import Sequence

import grpc

from tests.support import servers
from tests.support.binaries import etcd36_binary
from tests.support.server_group import GroupMember, ServerGroup


class EtcdMember(GroupMember):
    """One member; started by its ``EtcdCluster``."""

    kind = "etcd-member"

    def __init__(self, cluster: "EtcdCluster", name: str, **kw):
        self.cluster = cluster
        super().__init__(cluster, name, **kw)
        self.peer_port = servers.free_port()

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def _command(self) -> list[str]:
        return [
            self.cluster.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.cluster.initial_cluster,
            "--initial-cluster-token", self.cluster.token,
            "--initial-cluster-state", "new",
            *self.cluster.extra_args,
        ]

    def member_id(self) -> int:
        return self.status().header.member_id

    def status(self, timeout: float = 2.0):
        from brain.api.pb.etcdserverpb import rpc_pb2

        with servers.kv_stub(self.endpoint) as st:
            return st.maintenance.Status(rpc_pb2.StatusRequest(), timeout=timeout)


class EtcdCluster(ServerGroup):
    """``size`` etcd members on loopback. See the module docstring."""

    def __init__(self, size: int = 3, *, binary: str | None = None, extra_args: Sequence[str] = (),
                 lifetime: float = 900.0, ready_timeout: float = 60.0):
        self.binary = binary or etcd36_binary()
        self.extra_args = list(extra_args)
        super().__init__("etcd-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.token = self.root.name
        self.members = [EtcdMember(self, f"e{i + 1}", ready_timeout=ready_timeout) for i in range(size)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    # -- addresses --------------------------------------------------------
    @property
    def endpoints(self) -> str:
        """Every member's ``127.0.0.1:port``, comma-separated (clustercheck --endpoints)."""
        return ",".join(m.endpoint for m in self.members)

    def endpoint_list(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def member(self, name: str) -> EtcdMember:
        return next(m for m in self.members if m.name == name)

    def _ready(self) -> None:
        self.wait_leader()

    def leader(self, timeout: float = 2.0) -> EtcdMember | None:
        """The member the live members agree leads, or None (no quorum, election)."""
        ids = {}
        leaders = set()
        for m in self.members:
            if not m.running:
                continue
            try:
                st = m.status(timeout=timeout)
            except grpc.RpcError:
                continue
            ids[st.header.member_id] = m
            if st.leader:
                leaders.add(st.leader)
        if len(leaders) == 1:
            return ids.get(leaders.pop())
        return None

    def wait_leader(self, exclude: EtcdMember | None = None, timeout: float | None = None) -> EtcdMember:
        """Wait until a member other than ``exclude`` leads and return it."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None and m is not exclude:
                return m
            time.sleep(0.05)
        raise servers.ServerStartError(f"no etcd leader within {timeout or self.ready_timeout:.0f} s\n"
                                       + self.logs())

    def kill_leader(self, keep: EtcdMember | None = None) -> tuple[EtcdMember, float, float]:
        """SIGKILL the leader and wait for the next one.

        When ``keep`` (say, the member a watcher is connected to) leads,
        leadership is first moved to another member, so ``keep`` stays up.
        Returns (the killed member, the kill's time.time(), the time a new
        leader was seen).
        """
        lead = self.wait_leader()
        if lead is keep:
            self.move_leader(next(m for m in self.members if m.running and m is not keep))
            lead = self.wait_leader()
        t_kill = self.kill9(lead)
        self.wait_leader(exclude=lead)
        return lead, t_kill, time.time()

    def followers(self) -> list[EtcdMember]:
        lead = self.leader()
        return [m for m in self.members if m.running and m is not lead]

    def move_leader(self, to: EtcdMember) -> None:
        """Hand leadership to ``to`` (Maintenance.MoveLeader on the current leader)."""
        from brain.api.pb.etcdserverpb import rpc_pb2

        lead = self.wait_leader()
        if lead is to:
            return
        with servers.kv_stub(lead.endpoint) as st:
            st.maintenance.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=to.member_id()), timeout=10)
        deadline = time.monotonic() + 10
        while self.leader() is not to:
            if time.monotonic() > deadline:
                raise RuntimeError(f"leadership did not move to {to.name}")
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.endpoints} dir={self.root}>"


def start_etcd_cluster(size: int = 3, **kw) -> EtcdCluster:
    return EtcdCluster(size, **kw).start()
