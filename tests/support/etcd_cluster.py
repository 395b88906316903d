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

from typing import Sequence


from tests.support import servers
from tests.support.binaries import etcd36_binary
from tests.support.server_group import LedGroup, StatusMember


class EtcdMember(StatusMember):
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
            *self.tls_flags(),
            *self.cluster.extra_args,
        ]


class EtcdCluster(LedGroup):
    """``size`` etcd members on loopback. See the module docstring."""

    def __init__(self, size: int = 3, *, binary: str | None = None, extra_args: Sequence[str] = (),
                 lifetime: float = 900.0, ready_timeout: float = 60.0, tls: bool = False):
        self.binary = binary or etcd36_binary()
        self.tls = tls
        self.extra_args = list(extra_args)
        super().__init__("etcd-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.token = self.root.name
        self.members = [EtcdMember(self, f"e{i + 1}", ready_timeout=ready_timeout) for i in range(size)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.endpoints} dir={self.root}>"


def start_etcd_cluster(size: int = 3, **kw) -> EtcdCluster:
    return EtcdCluster(size, **kw).start()
