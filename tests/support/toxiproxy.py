"""Toxiproxy on loopback: the partition tests' fault injector.

One ``toxiproxy-server`` (built by ``tests/cluster/build.sh toxiproxy``,
cached; ``$TOXIPROXY_BIN`` points at another binary) holds one TCP proxy per
link.  A link is cut, slowed or healed by its HTTP API while connections
through it stay open, as on a real network:

- ``cut(name)``: a latency toxic of an hour on both directions.  Bytes sent
  into a cut link are held, not dropped, and new connections are accepted by
  the proxy and then hear nothing: what a peer sees of a network partition
  shorter than TCP's retransmission timeout (its own pings go unanswered, a
  connect times out).  Toxiproxy's ``timeout`` toxic would drop the bytes
  instead, which no TCP connection does, and disabling the proxy closes every
  connection at once, which is a crash, not a partition.
- ``heal(name)``: the proxy replaced by a new one on the same address, so
  the connections that crossed the cut are closed and their peers
  reconnect.  Removing the toxic instead would deliver what was held, but
  toxiproxy then waits 5 s for every connection whose peer has gone (the
  many connects tried through a cut link), so a heal took minutes; and a
  partition longer than the peers' pings (nats-py: 5 s x 2, the tests hold
  cuts for longer) ends in closed connections on a real network too.
- ``slow(name, latency_ms, jitter_ms, rate_kb)``: latency (each direction)
  and a bandwidth limit in KB/s.

    with Toxiproxy() as tp:
        listen = tp.proxy("b1-n1", upstream="127.0.0.1:4222")   # "127.0.0.1:<port>"
        tp.cut("b1-n1"); tp.heal("b1-n1"); tp.heal_all()
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.support.binaries import toxiproxy_binary
from tests.support.harness import free_port
from tests.support.server_group import GroupMember, ServerGroup

CUT_LATENCY_MS = 3_600_000
DIRECTIONS = ("upstream", "downstream")


class ToxiproxyError(RuntimeError):
    """The API refused a call (the status and body say why)."""


class ToxiproxyServer(GroupMember):
    kind = "toxiproxy"

    def __init__(self, group: "Toxiproxy", **kw):
        self.binary = group.binary
        super().__init__(group, "toxiproxy", **kw)

    def _command(self) -> list[str]:
        return [self.binary, "-host", "127.0.0.1", "-port", str(self.port)]

    def _probe(self, remaining: float) -> str | None:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/version", timeout=2) as r:
                return None if r.status == 200 else f"HTTP {r.status}"
        except OSError as e:
            return str(e)


class Toxiproxy(ServerGroup):
    """A toxiproxy-server and its API. See the module docstring."""

    def __init__(self, *, binary: str | None = None, lifetime: float = 900.0, ready_timeout: float = 30.0):
        self.binary = binary or toxiproxy_binary()
        super().__init__("toxiproxy-", lifetime=lifetime, ready_timeout=ready_timeout)
        self.server = ToxiproxyServer(self, ready_timeout=ready_timeout)
        self.members = [self.server]
        self.upstreams: dict[str, str] = {}
        self.listens: dict[str, str] = {}
        self.faulted: set[str] = set()  # proxies with toxics

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.server.endpoint}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(f"{method} {path}: HTTP {e.code} {e.read()[:500]!r}") from None
        return json.loads(raw) if raw else {}

    def proxy(self, name: str, upstream: str, listen: str | None = None) -> str:
        """A new proxy ``name`` to ``upstream`` (host:port), on a port below
        the ephemeral range unless ``listen`` says; returns the address it
        listens on."""
        if listen is not None:
            made = self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                                    "enabled": True})
        else:
            made = self._new_proxy(name, upstream)
        self.upstreams[name] = upstream
        self.listens[name] = made["listen"]
        return made["listen"]

    def _new_proxy(self, name: str, upstream: str) -> dict:
        """``heal`` gives a proxy's port up and binds it again: a port the
        kernel hands out (an outgoing connection's, another test's
        ``free_port``) could be taken in between ("bind: address already in
        use" in CI).  ``free_port`` picks below the ephemeral range, where
        only another explicit pick could, and never the same one twice in a
        row."""
        for _ in range(50):
            port = free_port()
            try:
                return self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{port}",
                                                        "upstream": upstream, "enabled": True})
            except ToxiproxyError as e:
                if "address already in use" not in str(e):
                    raise
        raise ToxiproxyError(f"no free port for proxy {name} in 50 tries")

    def _toxic(self, name: str, toxic: str, kind: str, attributes: dict) -> None:
        for stream in DIRECTIONS:
            self._call("POST", f"/proxies/{name}/toxics", {"name": f"{toxic}-{stream}", "type": kind,
                                                            "stream": stream, "toxicity": 1.0,
                                                            "attributes": attributes})
        self.faulted.add(name)

    def cut(self, name: str) -> None:
        """Hold every byte through ``name``, both ways, until ``heal``."""
        self._toxic(name, "cut", "latency", {"latency": CUT_LATENCY_MS, "jitter": 0})

    def slow(self, name: str, *, latency_ms: int, jitter_ms: int, rate_kb: int) -> None:
        """Latency (each way) and a bandwidth limit of ``rate_kb`` KB/s each way."""
        self._toxic(name, "slow", "latency", {"latency": latency_ms, "jitter": jitter_ms})
        self._toxic(name, "narrow", "bandwidth", {"rate": rate_kb})

    def heal(self, name: str) -> None:
        """``name`` without toxics, its connections closed (module docstring)."""
        self._call("DELETE", f"/proxies/{name}")
        self.proxy(name, self.upstreams[name], listen=self.listens[name])
        self.faulted.discard(name)

    def heal_all(self) -> None:
        for name in sorted(self.faulted):
            self.heal(name)

    def __repr__(self) -> str:
        return f"<Toxiproxy {self.server.endpoint} dir={self.root}>"
