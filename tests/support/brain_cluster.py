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
from typing import Sequence

from tests.support import servers
from tests.support.server_group import LedGroup, StatusMember

_seq = itertools.count()


class BrainReplica(StatusMember):
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


class BrainCluster(LedGroup):
    def __init__(self, size: int, nats, *, shards: int = 1, extra_args: Sequence[str] = (),
                 lifetime: float = 900.0, ready_timeout: float = 60.0, name: str | None = None):
        self.nats = nats
        self.shards = shards
        self.extra_args = list(extra_args)
        self.name = name or f"bc{os.getpid()}x{next(_seq)}"
        super().__init__("brain-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.members = [BrainReplica(self, f"b{i + 1}", ready_timeout=ready_timeout) for i in range(size)]

    def __repr__(self) -> str:
        return f"<BrainCluster {self.name} {self.endpoints} dir={self.root}>"
