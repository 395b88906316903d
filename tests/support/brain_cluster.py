"""A brain cluster on loopback: N ``brain serve --journal-url`` replicas on
one NATS cluster (tests/support/nats_cluster.py), shaped like EtcdCluster so
the same tests and benchmarks drive both.

    nats = NatsCluster(3, sync_always=True).start()
    with BrainCluster(3, nats) as cluster:
        cluster.endpoints                  # "127.0.0.1:p1,127.0.0.1:p2,..."
        old = cluster.leader()             # asks every replica's Status
        killed, t_kill, t_new = cluster.kill_leader(keep=watcher_replica)
        cluster.restart(killed)
        cluster.kills[-1]                  # the epochs before and after that kill

A leader kill is confirmed by the journal, not by the replicas' Status: the
epoch (``raft_term``) the survivors report must rise above every epoch
reported before the kill, which only a new leader's epoch record does.

Each replica gets its own data dir and ports; every replica of one
BrainCluster shares one cluster name (the journal's stream and buckets), so
several BrainClusters can share a NATS cluster.  ``start()`` returns once
every replica answers and one leads.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Callable, Sequence

from tests.support import servers
from tests.support.server_group import LedGroup, StatusMember

_seq = itertools.count()


class BrainReplica(StatusMember):
    """One replica; started by its ``BrainCluster``."""

    kind = "brain-replica"
    ports_private = True  # the others learn its address from the journal

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
            "--journal-url", f"nats://{','.join(c.nats_addresses(self))}/{c.name}",
            "--shards", str(c.shards), *servers.shard_args(c.shards),
            *self.tls_flags(),
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
                 lifetime: float = 900.0, ready_timeout: float = 60.0, name: str | None = None,
                 nats_addresses: Callable[[BrainReplica], list[str]] | None = None, tls: bool = False):
        self.nats = nats
        self.tls = tls
        # the host:port of each NATS server as a replica is to reach it
        # (default: the servers' own; tests/support/partitioned.py: proxies)
        self.nats_addresses = nats_addresses or (lambda replica: [f"127.0.0.1:{n.port}" for n in nats.nodes])
        self.shards = shards
        self.extra_args = list(extra_args)
        self.name = name or f"bc{os.getpid()}x{next(_seq)}"
        super().__init__("brain-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.members = [BrainReplica(self, f"b{i + 1}", ready_timeout=ready_timeout) for i in range(size)]
        # one entry per kill_leader: who, when, the highest epoch before the
        # kill and the first higher one a survivor reported
        self.kills: list[dict] = []

    def terms(self, timeout: float = 2.0) -> dict[str, int]:
        """The epoch (response header raft_term) of every running replica
        that answers Status, by name."""
        import grpc

        out = {}
        for m in self.members:
            if not m.running:
                continue
            try:
                out[m.name] = m.status(timeout=timeout).header.raft_term
            except grpc.RpcError:
                continue
        return out

    def kill_leader(self, keep=None, timeout: float | None = None):
        """SIGKILL the leader (moving the lead off ``keep`` first) and wait
        until a survivor reports an epoch above every epoch seen before the
        kill: a new leader has appended its epoch record, so the replica
        killed was the one leading.  Raises if that does not happen within
        ``timeout``.  Returns (the killed replica, the kill's time.time(),
        the time the new epoch was seen)."""
        lead = self.wait_leader()
        if lead is keep:
            self.move_leader(next(m for m in self.members if m.running and m is not keep))
            lead = self.wait_leader()
        before = self.terms()
        if len(before) != sum(m.running for m in self.members):
            time.sleep(0.5)  # a replica did not answer: ask once more
            before = self.terms()
        term_before = max(before.values())
        t_kill = self.kill9(lead)
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while True:
            after = self.terms()
            higher = {name: t for name, t in after.items() if t > term_before}
            if higher:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no survivor reported an epoch above {term_before} within "
                                     f"{timeout or self.ready_timeout:.0f} s of killing {lead.name} "
                                     f"(epochs before {before}, now {after}): it may not have been "
                                     f"the leader\n" + self.logs())
            time.sleep(0.05)
        t_new = time.time()
        self.kills.append({"killed": lead.name, "t_kill": t_kill, "t_new_epoch": t_new,
                           "terms_before": before, "term_before": term_before,
                           "term_after": max(higher.values()), "seen_on": sorted(higher)})
        return lead, t_kill, t_new

    def __repr__(self) -> str:
        return f"<BrainCluster {self.name} {self.endpoints} dir={self.root}>"
