"""A NATS cluster of 1 or 3 nats-server nodes with JetStream, on loopback.

nats-server is built from its Go module by ``tests/cluster/build.sh`` (cached
under ``$BRAIN_NATS_CACHE``); ``NATS_SERVER_BIN`` points at another binary.

Each node gets free loopback ports (client, cluster routes, HTTP monitoring),
a config file and a JetStream store directory under one temporary root.
``start()`` starts every node at once and returns when every node reports
JetStream healthy and the same meta leader (the JetStream cluster's own Raft
group, which must exist before a stream can be created).

``sync_always=True`` writes ``jetstream { sync_interval: always }``: the
server fsyncs the stream file before it acknowledges a publish. The default
(what nats-server does unless told) fsyncs every 2 minutes, so an
acknowledged message is in the page cache of a quorum of nodes but may be on
no disk: it survives the kill -9 of any node (the others have it), not a
power loss of all three. ``always`` is the only setting as durable as brain's
fdatasync per batch, at about twice the publish latency.

``route_via(src, dst) -> "host:port"`` sends every route from ``src`` to
``dst`` through that address (a proxy, tests/support/partitioned.py) and
keeps the servers from advertising any address of their own.

Faults: ``kill9(node)`` (SIGKILL, store kept), ``restart(node)`` (same ports,
config and store); ``stream_leader(name)`` asks ``$JS.API.STREAM.INFO.<name>``
which node leads that stream's Raft group (``cluster.leader``, a server name).
A ``Watchdog`` kills the nodes if the test process dies or ``lifetime`` seconds
pass. ``logs()`` gathers every node's log tail for a failure message.

    with NatsCluster(3, sync_always=True) as nc:
        nc.url                               # "nats://127.0.0.1:p1,nats://127.0.0.1:p2,..."
        leader = nc.stream_leader("JOURNAL")
        nc.kill9(leader)
        nc.wait_stream_leader("JOURNAL", exclude=leader)
        nc.restart(leader)

The JetStream API calls go through nats-py (the client brain's journal uses),
one short connection per call, from synchronous test code.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Callable

from tests.support import servers
from tests.support.binaries import nats_server_binary
from tests.support.server_group import GroupMember, ServerGroup

CLUSTER_NAME = "brain-test"
# a loopback port nothing listens on (1 is privileged: no test server takes it)
UNREACHABLE = "127.0.0.1:1"


class NatsNode(GroupMember):
    """One nats-server; started by its ``NatsCluster``."""

    kind = "nats"

    def __init__(self, cluster: "NatsCluster", name: str, **kw):
        self.cluster = cluster
        super().__init__(cluster, name, **kw)
        self.data_dir = self.root / "jetstream"
        self.config_path = self.root / "nats.conf"
        self.route_port = servers.free_port()
        self.monitor_port = servers.free_port()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def route_url(self) -> str:
        return f"nats-route://127.0.0.1:{self.route_port}"

    def write_config(self) -> None:
        js = [f'store_dir: "{self.data_dir}"']
        if self.cluster.sync_always:
            js.append("sync_interval: always")
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.monitor_port}",
            "jetstream {", *(f"  {x}" for x in js), "}",
            # lame duck mode (a planned restart) closes clients after 1 s, not
            # the default 10 s: a replica must leave the server within it, and
            # a rolling restart of three servers takes half a minute less
            "lame_duck_grace_period: 1s",
        ]
        if len(self.cluster.nodes) > 1:
            via = self.cluster.route_via
            if via is None:
                routes = [n.route_url for n in self.cluster.nodes]
                hidden = []
            else:
                routes = [f"nats-route://{via(self, n)}" for n in self.cluster.nodes if n is not self]
                # Through proxies only: clients learn no other URL, and a
                # route a peer gossips about (its advertised address) leads
                # nowhere, so no connection bypasses the links under test.
                hidden = ["  no_advertise: true", f"  advertise: {UNREACHABLE}"]
            lines += [
                "cluster {",
                f"  name: {CLUSTER_NAME}",
                f"  listen: 127.0.0.1:{self.route_port}",
                f"  routes: [{', '.join(routes)}]",
                *hidden,
                "}",
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        return [self.cluster.binary, "--config", str(self.config_path)]

    def monitor(self, path: str, timeout: float = 2.0) -> tuple[int, dict]:
        """GET the monitoring endpoint ``path``: (HTTP status, JSON body)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}{path}", timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}

    def _probe(self, remaining: float) -> str | None:
        """Ready when /healthz says JetStream is up (for a clustered node: it knows a meta leader)."""
        try:
            status, body = self.monitor("/healthz")
        except (OSError, ValueError) as e:
            return str(e)
        return None if status == 200 else f"{status} {body}"

    def meta_leader(self) -> str:
        """The JetStream meta leader this node knows ("" if none)."""
        try:
            status, body = self.monitor("/jsz")
        except (OSError, ValueError):
            return ""
        if len(self.cluster.nodes) == 1:
            return self.name if status == 200 else ""
        return (body.get("meta_cluster") or {}).get("leader", "") if status == 200 else ""


class NatsCluster(ServerGroup):
    """``size`` nats-servers with JetStream on loopback. See the module docstring."""

    def __init__(self, size: int = 3, *, sync_always: bool = False, binary: str | None = None,
                 lifetime: float = 900.0, ready_timeout: float = 30.0,
                 route_via: Callable[[NatsNode, NatsNode], str] | None = None):
        if size < 1:
            raise ValueError("size must be >= 1")
        self.binary = binary or nats_server_binary()
        self.sync_always = sync_always
        self.route_via = route_via
        super().__init__("nats-cluster-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.members = [NatsNode(self, f"n{i + 1}", ready_timeout=ready_timeout) for i in range(size)]

    @property
    def nodes(self) -> list[NatsNode]:
        return self.members

    # -- addresses --------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (brain's --journal-url)."""
        return ",".join(self.urls)

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    def _prepare(self) -> None:
        for n in self.nodes:
            n.write_config()

    def _ready(self) -> None:
        self.wait_meta_leader()

    def wait_meta_leader(self, timeout: float | None = None) -> str:
        """Wait until every running node names the same meta leader; return its name."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while True:
            seen = {n.meta_leader() for n in self.nodes if n.running}
            if len(seen) == 1 and "" not in seen:
                return seen.pop()
            if time.monotonic() > deadline:
                raise servers.ServerStartError(f"no JetStream meta leader agreed on (saw {seen})\n" + self.logs())
            time.sleep(0.1)

    # -- JetStream API ----------------------------------------------------
    def js_request(self, subject: str, payload: dict | None = None, timeout: float = 2.0) -> dict:
        """One JetStream API request through any live node; the decoded reply."""
        import nats

        live = [n.url for n in self.nodes if n.running]
        if not live:
            raise ConnectionError("no nats-server is running")

        async def call() -> dict:
            nc = await nats.connect(servers=live,
                                    connect_timeout=timeout, allow_reconnect=False,
                                    max_reconnect_attempts=0)
            try:
                body = json.dumps(payload).encode() if payload is not None else b""
                msg = await nc.request(subject, body, timeout=timeout)
                return json.loads(msg.data)
            finally:
                await nc.close()

        return asyncio.run(call())

    def stream_info(self, stream: str, timeout: float = 2.0) -> dict:
        return self.js_request(f"$JS.API.STREAM.INFO.{stream}", timeout=timeout)

    def stream_leader(self, stream: str, timeout: float = 2.0) -> NatsNode | None:
        """The node leading ``stream``'s Raft group now, or None (no leader, error)."""
        try:
            info = self.stream_info(stream, timeout=timeout)
        except Exception:  # noqa: BLE001 - no responders, timeouts: "no leader known"
            return None
        name = (info.get("cluster") or {}).get("leader")
        if not name:
            return None
        return self.node(name)

    def wait_stream_leader(self, stream: str, exclude: NatsNode | None = None,
                           timeout: float = 30.0) -> NatsNode:
        """Wait until a node other than ``exclude`` leads ``stream``; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.stream_leader(stream)
            if n is not None and n is not exclude and n.running:
                return n
            time.sleep(0.1)
        raise TimeoutError(f"no leader for stream {stream} within {timeout:.0f} s\n" + self.logs())

    def __repr__(self) -> str:
        return f"<NatsCluster {self.url} dir={self.root}>"


def start_nats_cluster(size: int = 3, **kw) -> NatsCluster:
    return NatsCluster(size, **kw).start()
