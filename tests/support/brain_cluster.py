"""A brain cluster on loopback: N ``brain serve --journal-url`` replicas on
one NATS cluster (tests/support/nats_cluster.py), shaped like EtcdCluster so
the same tests and benchmarks drive both.

    nats = NatsCluster(3, sync_always=True).start()
    with BrainCluster(3, nats) as cluster:
        cluster.endpoints                  # "127.0.0.1:p1,127.0.0.1:p2,..."
        old = cluster.leader()             # asks every replica's Status
        killed, t_kill, t_new = cluster.kill_leader(keep=watcher_replica)
        cluster.restart(killed)

Each replica gets its own data dir and ports; every replica of one
BrainCluster shares one cluster name (the journal's stream and buckets), so
several BrainClusters can share a NATS cluster.  ``start()`` returns once
every replica answers and one leads.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Sequence

import grpc

from tests.support import servers
from tests.support.server_group import GroupMember, ServerGroup

_seq = itertools.count()


class BrainReplica(GroupMember):
    """One replica; started by its ``BrainCluster``."""

    kind = "brain-replica"

    def __init__(self, cluster: "BrainCluster", name: str, **kw):
        self.cluster = cluster
        super().__init__(cluster, name, **kw)

    def _command(self) -> list[str]:
        c = self.cluster
        return [
            servers.sys.executable, "-m", "brain", "serve",
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--journal-url", f"{c.nats.url.replace(',nats://', ',')}/{c.name}",
            "--shards", str(c.shards), *servers.shard_args(c.shards),
            *c.extra_args,
        ]

    def _env(self) -> dict:
        env = super()._env()
        pp = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(servers.REPO_ROOT) + (os.pathsep + pp if pp else "")
        return env

    def _cwd(self) -> str | None:
        return str(servers.REPO_ROOT)

    def status(self, timeout: float = 2.0):
        from brain.api.pb.etcdserverpb import rpc_pb2

        with servers.kv_stub(self.endpoint) as st:
            return st.maintenance.Status(rpc_pb2.StatusRequest(), timeout=timeout)

    def member_id(self) -> int:
        return self.status().header.member_id


class BrainCluster(ServerGroup):
    def __init__(self, size: int, nats, *, shards: int = 1, extra_args: Sequence[str] = (),
                 lifetime: float = 900.0, ready_timeout: float = 60.0, name: str | None = None):
        self.nats = nats
        self.shards = shards
        self.extra_args = list(extra_args)
        self.name = name or f"bc{os.getpid()}x{next(_seq)}"
        super().__init__("brain-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.members = [BrainReplica(self, f"b{i + 1}", ready_timeout=ready_timeout) for i in range(size)]

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def endpoint_list(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def member(self, name: str) -> BrainReplica:
        return next(m for m in self.members if m.name == name)

    def _ready(self) -> None:
        self.wait_leader()

    def leader(self, timeout: float = 2.0) -> BrainReplica | None:
        """The replica the live replicas agree leads, or None."""
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
            lead = ids.get(leaders.pop())
            if lead is not None and lead.status(timeout=timeout).leader == lead.member_id():
                return lead
        return None

    def wait_leader(self, exclude: BrainReplica | None = None, timeout: float | None = None) -> BrainReplica:
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None and m is not exclude:
                return m
            time.sleep(0.05)
        raise servers.ServerStartError(f"no brain leader within {timeout or self.ready_timeout:.0f} s\n"
                                       + self.logs())

    def followers(self) -> list[BrainReplica]:
        lead = self.leader()
        return [m for m in self.members if m.running and m is not lead]

    def kill_leader(self, keep: BrainReplica | None = None) -> tuple[BrainReplica, float, float]:
        """SIGKILL the leader (first handing the lead on if ``keep`` leads)
        and wait for the next; returns (killed, kill time, new leader seen)."""
        lead = self.wait_leader()
        if lead is keep:
            self.move_leader(next(m for m in self.members if m.running and m is not keep))
            lead = self.wait_leader()
        t_kill = self.kill9(lead)
        self.wait_leader(exclude=lead)
        return lead, t_kill, time.time()

    def move_leader(self, to: BrainReplica) -> None:
        """Hand the lead to ``to`` (Maintenance.MoveLeader on the leader)."""
        from brain.api.pb.etcdserverpb import rpc_pb2

        lead = self.wait_leader()
        if lead is to:
            return
        with servers.kv_stub(lead.endpoint) as st:
            st.maintenance.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=to.member_id()), timeout=15)
        deadline = time.monotonic() + 10
        while self.leader() is not to:
            if time.monotonic() > deadline:
                raise RuntimeError(f"leadership did not move to {to.name}")
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"<BrainCluster {self.name} {self.endpoints} dir={self.root}>"
