"""A brain cluster whose every network link goes through Toxiproxy, so a
test can cut, slow and heal single links (tests/cluster/test_partitions.py).

Links, one proxy each, named ``<from>-<to>``:

- ``b<i>-n<j>``: replica b<i> to nats-server n<j>'s client port (each
  replica is given the proxies, never the servers' own ports);
- ``n<i>-n<j>``: n<i>'s routes to n<j> (the servers advertise no address
  of their own: tests/support/nats_cluster.py ``route_via``).

A cut between two names holds both directions of every link between them
(both route proxies of a pair of nats-servers).  ``isolate(a, b)`` cuts every
link between a member of ``a`` and a member of ``b``.

    with PartitionedCluster(3, 3) as pc:
        pc.brain, pc.nats, pc.toxiproxy
        pc.isolate(["b1"], ["n1", "n2", "n3"])      # b1 cut from all NATS
        pc.heal_all()
"""

from __future__ import annotations

import time
from typing import Iterable

from tests.support.brain_cluster import BrainCluster
from tests.support.nats_cluster import NatsCluster, NatsNode
from tests.support.toxiproxy import Toxiproxy


class PartitionedCluster:
    def __init__(self, replicas: int = 3, nats_servers: int = 3, *, lifetime: float = 900.0,
                 extra_args: tuple[str, ...] = ("--checkpoint-interval", "3")):
        self.toxiproxy = Toxiproxy(lifetime=lifetime)
        self.nats = NatsCluster(nats_servers, sync_always=True, lifetime=lifetime, route_via=self._route_via)
        self.brain = BrainCluster(replicas, self.nats, lifetime=lifetime, extra_args=extra_args,
                                  nats_addresses=self._client_addresses)
        self.links: dict[str, str] = {}  # proxy name -> its listen address
        self.setup_seconds = 0.0  # the proxies' share of start()

    def _link(self, name: str, upstream_port: int) -> str:
        if name not in self.links:
            t0 = time.monotonic()
            self.links[name] = self.toxiproxy.proxy(name, f"127.0.0.1:{upstream_port}")
            self.setup_seconds += time.monotonic() - t0
        return self.links[name]

    def _route_via(self, src: NatsNode, dst: NatsNode) -> str:
        return self._link(f"{src.name}-{dst.name}", dst.route_port)

    def _client_addresses(self, replica) -> list[str]:
        return [self._link(f"{replica.name}-{n.name}", n.port) for n in self.nats.nodes]

    def start(self) -> "PartitionedCluster":
        try:
            t0 = time.monotonic()
            self.toxiproxy.start()
            self.setup_seconds += time.monotonic() - t0
            self.nats.start()
            self.brain.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def links_between(self, a: str, b: str) -> list[str]:
        return [n for n in (f"{a}-{b}", f"{b}-{a}") if n in self.links]

    def isolate(self, side_a: Iterable[str], side_b: Iterable[str]) -> list[str]:
        """Cut every link between a name of ``side_a`` and one of ``side_b``;
        returns the links cut."""
        side_b = list(side_b)
        cut = [link for a in side_a for b in side_b for link in self.links_between(a, b)]
        for link in cut:
            self.toxiproxy.cut(link)
        return cut

    def heal_all(self) -> None:
        self.toxiproxy.heal_all()

    def logs(self) -> str:
        return f"{self.nats.logs()}\n{self.brain.logs()}\n{self.toxiproxy.logs()}"

    def cleanup(self) -> None:
        self.brain.cleanup()
        self.nats.cleanup()
        self.toxiproxy.cleanup()

    def __enter__(self) -> "PartitionedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
