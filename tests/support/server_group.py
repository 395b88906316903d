"""What a cluster of test servers on loopback has in common (the etcd 3.6
cluster and the NATS cluster build on it): one temporary root holding each
member's directory, a ``Watchdog`` bounding their lifetime, members started
together (a member of a cluster is not ready before a quorum is), kill -9 and
restart, every member's log tail for a failure message, and teardown."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tests.support import servers
from tests.support.harness import ServerStartError, port_taken
from tests.support.watchdog import Watchdog


class GroupMember(servers.LoopbackServer):
    """A member of a ``ServerGroup``: its directory is ``<group root>/<name>``."""

    def __init__(self, group: "ServerGroup", name: str, **kw):
        self.group = group
        self.name = name
        super().__init__(**kw)
        # One root for the group: the watchdog finds it in command lines.
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = group.root / name
        self.root.mkdir(parents=True)
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"

    # True where no other member is told this member's ports before it starts
    # (brain replicas find each other through the journal): a first start
    # that lost its port to another process may then move to fresh ones.
    ports_private = False

    # -- addresses: mutual TLS (the tests' PKI) when the group's ``tls`` is set
    @property
    def client_url(self) -> str:
        return f"{'https' if self.group.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        plain = f"127.0.0.1:{self.port}"
        return servers.Endpoint(plain, servers.shared_pki()) if self.group.tls else plain

    def tls_flags(self) -> list[str]:
        """The server's flags for the group's client listener kind."""
        return servers.shared_pki().server_flags() if self.group.tls else []

    def spawn(self) -> None:
        super().spawn()
        self.group.watchdog.track(self.name, self.proc)

    def respawn_on_fresh_ports(self, error: Exception) -> bool:
        """After ``error`` from ``wait_ready``: spawn again on fresh ports
        when a port was taken between picking and binding on a first start
        and nobody else knows the old ones; False (nothing done) otherwise."""
        if not (self.ports_private and self._starts == 0 and port_taken(error)):
            return False
        self._process.stop(grace=2.0, kill_wait=10)
        self._pick_new_ports()
        self.spawn()
        return True


class ServerGroup:
    """Members in ``self.members``; subclasses create them and may override
    ``_prepare`` (before any member starts) and ``_ready`` (after all are)."""

    tls = False  # members' client listeners on https with --client-cert-auth

    def __init__(self, prefix: str, *, lifetime: float, ready_timeout: float):
        self.ready_timeout = ready_timeout
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=servers.tmp_parent()))
        self.watchdog = Watchdog(self.root, lifetime)
        self.members: list = []

    def _prepare(self) -> None:
        pass

    def _ready(self) -> None:
        pass

    def start(self):
        """Start every member at once, wait for each, then for ``_ready``."""
        try:
            self._prepare()
            for m in self.members:
                m.spawn()
            for m in self.members:
                for attempt in range(3):
                    try:
                        m.wait_ready()
                        break
                    except ServerStartError as e:
                        if attempt == 2 or not m.respawn_on_fresh_ports(e):
                            raise
            self._ready()
        except BaseException:
            self.cleanup()
            raise
        return self

    def kill9(self, member) -> float:
        """SIGKILL ``member`` (its data is kept); returns the kill's time.time()."""
        t = time.time()
        member.kill9()
        return t

    def restart(self, member) -> None:
        """Start a stopped or killed member again: same ports, config and data."""
        member.stop()
        member.start()

    def logs(self, nbytes: int = 4000) -> str:
        """The tail of every member's log, for a failure message."""
        return "\n".join(f"--- {m.name} ({m.log_path}) ---\n{m.log_tail(nbytes)}" for m in self.members)

    def stop(self) -> None:
        for m in self.members:
            m.stop(grace=5.0)

    def cleanup(self) -> None:
        """Stop every member and remove the root (unless KEEP_TEST_DIRS)."""
        self.stop()
        self.watchdog.stop()
        if not os.environ.get("KEEP_TEST_DIRS"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


class StatusMember(GroupMember):
    """A member that answers etcd's Maintenance.Status (etcd or brain)."""

    def status(self, timeout: float = 2.0):
        from brain.api.pb.etcdserverpb import rpc_pb2

        with servers.kv_stub(self.endpoint) as st:
            return st.maintenance.Status(rpc_pb2.StatusRequest(), timeout=timeout)

    def member_id(self) -> int:
        return self.status().header.member_id


class LedGroup(ServerGroup):
    """A group whose members elect a leader and say who leads in Status
    (an etcd cluster, a brain cluster): endpoints, leader, failover."""

    @property
    def endpoints(self) -> str:
        """Every member's ``127.0.0.1:port``, comma-separated (clustercheck --endpoints)."""
        return ",".join(m.endpoint for m in self.members)

    def endpoint_list(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def member(self, name: str):
        return next(m for m in self.members if m.name == name)

    def _ready(self) -> None:
        self.wait_leader()

    def leader(self, timeout: float = 2.0):
        """The member the live members agree leads (and which says so
        itself), or None (no quorum, an election under way)."""
        import grpc

        ids = {}
        leaders = set()
        for m in self.members:
            if not m.running:
                continue
            try:
                st = m.status(timeout=timeout)
            except grpc.RpcError:
                continue
            ids[st.header.member_id] = (m, st.leader)
            if st.leader:
                leaders.add(st.leader)
        if len(leaders) == 1:
            lead = leaders.pop()
            found = ids.get(lead)
            if found is not None and found[1] == lead:
                return found[0]
        return None

    def wait_leader(self, exclude=None, timeout: float | None = None):
        """Wait until a member other than ``exclude`` leads and return it."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None and m is not exclude:
                return m
            time.sleep(0.05)
        raise servers.ServerStartError(f"no leader within {timeout or self.ready_timeout:.0f} s\n" + self.logs())

    def wait_serving(self, timeout: float | None = None) -> None:
        """Wait until every running member answers a linearizable read."""
        import grpc

        from brain.api.pb.etcdserverpb import rpc_pb2

        deadline = time.monotonic() + (timeout or self.ready_timeout)
        for m in self.members:
            while m.running:
                try:
                    with servers.kv_stub(m.endpoint) as st:
                        st.kv.Range(rpc_pb2.RangeRequest(key=b"/ready"), timeout=2)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise servers.ServerStartError(f"{m.name} not serving\n" + self.logs()) from None
                    time.sleep(0.1)

    def followers(self) -> list:
        lead = self.leader()
        return [m for m in self.members if m.running and m is not lead]

    def kill_leader(self, keep=None):
        """SIGKILL the leader and wait for the next.  When ``keep`` (say, the
        member a watcher is connected to) leads, the lead is first moved to
        another member, so ``keep`` stays up.  Returns (the killed member,
        the kill's time.time(), the time a new leader was seen)."""
        lead = self.wait_leader()
        if lead is keep:
            self.move_leader(next(m for m in self.members if m.running and m is not keep))
            lead = self.wait_leader()
        t_kill = self.kill9(lead)
        self.wait_leader(exclude=lead)
        return lead, t_kill, time.time()

    def move_leader(self, to) -> None:
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
