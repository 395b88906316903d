"""Processes of the e2e control plane: the storage server (brain, or etcd 3.6
as the baseline), kube-apiserver, kube-controller-manager, kube-scheduler and
kwok, all on loopback.

Every process writes its own log file in the run's work directory; ``stop()``
sends SIGTERM and waits (bounded), then SIGKILL. Readiness waits are bounded
and raise ``StartError`` with the tail of the log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.k8s.pki import ClusterPKI
from tests.support.harness import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.96.0.0/16"   # addresses only written into Service objects; no traffic
SERVICE_IP = "10.96.0.1"
TOKENS = {
    "admin": ("e2e-admin-token", "admin", "system:masters"),
    "controller-manager": ("e2e-kcm-token", "system:kube-controller-manager", ""),
    "scheduler": ("e2e-scheduler-token", "system:kube-scheduler", ""),
}


class StartError(RuntimeError):
    pass


def log_tail(path: Path, limit: int = 6000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace")


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    env: dict | None = None
    popen: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> "Proc":
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== e2e: start #{self.starts} at {time.strftime('%H:%M:%S')}: "
                  f"{' '.join(self.argv)}\n".encode())
        log.flush()
        env = dict(os.environ)
        env.update(self.env or {})
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=str(REPO_ROOT), start_new_session=True,
        )
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode

    def kill9(self) -> int | None:
        """SIGKILL (no clean shutdown) and reap. Returns the exit status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        return self.popen.returncode

    def check_alive(self) -> None:
        if not self.alive:
            code = self.popen.returncode if self.popen else None
            raise StartError(f"{self.name} exited (code {code}); log tail:\n{log_tail(self.log_path)}")


# ---------------------------------------------------------------------------
# the storage server: brain, or etcd 3.6 as the baseline
# ---------------------------------------------------------------------------


class Storage:
    """What the run needs of the server behind --etcd-servers: start, stop
    (SIGTERM), kill -9, and direct gRPC reads (version, key counts, exact
    snapshots of the keyspace at a revision)."""

    label = "storage"
    port: int
    workdir: Path
    data_dir: Path
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def apiserver_flags(self) -> list[str]:
        return [f"--etcd-servers={self.url}"]

    def channel(self):
        import grpc

        return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[("grpc.max_receive_message_length", 256 << 20)])

    def status(self, timeout: float = 5.0):
        """Maintenance.Status: returns (version, db_size) or raises grpc.RpcError."""
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        with self.channel() as ch:
            resp = rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=timeout)
            return resp.version, resp.dbSize

    def count_prefix(self, prefix: bytes, timeout: float = 30.0) -> tuple[int, int]:
        """(count, header revision) of keys under ``prefix``: a count_only Range."""
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        end = prefix[:-1] + bytes([prefix[-1] + 1])
        with self.channel() as ch:
            resp = rpc_pb2_grpc.KVStub(ch).Range(
                rpc_pb2.RangeRequest(key=prefix, range_end=end, count_only=True), timeout=timeout)
            return resp.count, resp.header.revision

    def snapshot(self, prefix: bytes, revision: int = 0, timeout: float = 60.0) -> tuple[int, dict]:
        """(revision, {key: (create_revision, mod_revision, version, value)}) of every key under
        ``prefix`` at ``revision`` (0: now), read in pages of 1,000 at one revision."""
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        end = prefix[:-1] + bytes([prefix[-1] + 1])
        out: dict = {}
        key = prefix
        with self.channel() as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            while True:
                resp = kv.Range(rpc_pb2.RangeRequest(key=key, range_end=end, revision=revision, limit=1000),
                                timeout=timeout)
                revision = revision or resp.header.revision
                for item in resp.kvs:
                    out[item.key] = (item.create_revision, item.mod_revision, item.version, item.value)
                if not resp.more:
                    return revision, out
                key = resp.kvs[-1].key + b"\x00"

    def get(self, key: bytes, timeout: float = 10.0):
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        with self.channel() as ch:
            resp = rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=key), timeout=timeout)
            return resp.kvs[0].value if resp.kvs else None

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until a linearizable read answers."""
        self.proc.start()
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self.proc.check_alive()
            try:
                self.count_prefix(b"/registry/health", timeout=2.0)
                return
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                last = e
                time.sleep(0.2)
        raise StartError(f"{self.label} not serving on {self.url} after {timeout:.0f}s ({last}); log tail:\n"
                         f"{log_tail(self.proc.log_path)}")

    def stop(self, timeout: float = 30.0) -> int | None:
        return self.proc.stop(timeout)

    def kill9(self) -> int | None:
        return self.proc.kill9()

    def procs(self) -> list[Proc]:
        """The processes that must be running: a wait gives up at once when one has exited."""
        return [self.proc]

    def rss_mib(self) -> float | None:
        if not self.proc.alive:
            return None
        try:
            for line in Path(f"/proc/{self.proc.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


@dataclass
class Brain(Storage):
    """brain serving one client URL: tcp (http), tls (https + client certs) or unix."""

    workdir: Path
    transport: str
    pki: ClusterPKI
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    label = "brain"

    def __post_init__(self):
        self.data_dir = self.workdir / "brain-data"
        self.socket_path = self.workdir / "brain.sock"
        args = [sys.executable, "-m", "brain", "serve", "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.url,
                "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}",
                *self.extra_args]
        if self.transport == "tls":
            args += ["--cert-file", str(self.pki.etcd_server.cert), "--key-file", str(self.pki.etcd_server.key),
                     "--trusted-ca-file", str(self.pki.etcd_ca.cert), "--client-cert-auth"]
        self.proc = Proc("brain", args, self.workdir / "brain.log")

    @property
    def url(self) -> str:
        if self.transport == "tcp":
            return f"http://127.0.0.1:{self.port}"
        if self.transport == "tls":
            return f"https://127.0.0.1:{self.port}"
        if self.transport == "unix":
            return f"unix://{self.socket_path}"
        raise ValueError(self.transport)

    def apiserver_flags(self) -> list[str]:
        # etcd's client takes unix:///abs/path (absolute) endpoints as they are.
        flags = [f"--etcd-servers={self.url}"]
        if self.transport == "tls":
            flags += [f"--etcd-cafile={self.pki.etcd_ca.cert}",
                      f"--etcd-certfile={self.pki.etcd_client.cert}",
                      f"--etcd-keyfile={self.pki.etcd_client.key}"]
        return flags

    def channel(self):
        import grpc

        opts = [("grpc.max_receive_message_length", 256 << 20)]
        if self.transport == "tcp":
            return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=opts)
        if self.transport == "unix":
            return grpc.insecure_channel(f"unix:{self.socket_path}", options=opts)
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.pki.etcd_ca.cert.read_bytes(),
            private_key=self.pki.etcd_client.key.read_bytes(),
            certificate_chain=self.pki.etcd_client.cert.read_bytes(),
        )
        return grpc.secure_channel(f"127.0.0.1:{self.port}", creds, options=opts)


@dataclass
class Etcd(Storage):
    """etcd 3.6 (benchmarks/build.sh's etcd-3.6), a single member over plain
    TCP with its defaults: the baseline the same scenario runs on."""

    workdir: Path
    binary: Path
    port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    label = "etcd-3.6"
    transport = "tcp"

    def __post_init__(self):
        self.data_dir = self.workdir / "etcd-data"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = Proc("etcd", [
            str(self.binary), "--name", "e2e", "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"e2e={peer}",
        ], self.workdir / "etcd.log")


class BrainCluster(Storage):
    """Three brain replicas on a 3-node NATS JetStream cluster (docs/cluster.md),
    over TCP; kube-apiserver lists all three in --etcd-servers.  Reads for the
    checks go to any live replica; ``kill_leader`` kills -9 the one leading.
    Each replica reaches each nats-server through a Toxiproxy link of its own
    (tests/support/toxiproxy.py), so ``cut_from_nats`` can isolate a replica
    from the journal while kube-apiserver still reaches it."""

    label = "brain-cluster"
    transport = "tcp"

    def __init__(self, workdir: Path, size: int = 3):
        from tests.support import binaries
        from tests.support.nats_cluster import NatsCluster
        from tests.support.toxiproxy import Toxiproxy

        self.workdir = workdir
        self.data_dir = workdir / "brain-cluster"
        self.nats = NatsCluster(3, binary=binaries.require(binaries.nats_server_binary), sync_always=True,
                                lifetime=3600.0)
        self.toxiproxy = Toxiproxy(binary=binaries.require(binaries.toxiproxy_binary), lifetime=3600.0)
        self.ports = [free_port() for _ in range(size)]
        self.replicas = [Proc(f"brain-{i + 1}", [], workdir / f"brain-{i + 1}.log") for i in range(size)]
        self.port = self.ports[0]
        self.proc = self.replicas[0]
        self.killed: set[str] = set()  # replicas the run killed on purpose (kill_replica)

    def _links(self, replica: "Proc") -> list[str]:
        return [f"{replica.name}-{n.name}" for n in self.nats.nodes]

    def _wire(self) -> None:
        """(once the proxies can be made) each replica's command, its
        journal URL naming its own links to the nats-servers."""
        for i, (replica, port) in enumerate(zip(self.replicas, self.ports)):
            links = [self.toxiproxy.proxy(name, f"127.0.0.1:{n.port}")
                     for name, n in zip(self._links(replica), self.nats.nodes)]
            url = f"http://127.0.0.1:{port}"
            replica.argv = [
                sys.executable, "-m", "brain", "serve", "--name", f"b{i + 1}",
                "--data-dir", str(self.data_dir / f"b{i + 1}"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--journal-url", f"nats://{','.join(links)}/e2e",
            ]

    def cut_from_nats(self, replica: "Proc") -> None:
        """Hold every byte between ``replica`` and every nats-server (a
        network partition; its clients still reach it)."""
        for name in self._links(replica):
            self.toxiproxy.cut(name)

    def heal(self) -> None:
        self.toxiproxy.heal_all()

    def read_revision(self, replica: "Proc", timeout: float = 3.0) -> int:
        """The header revision of a linearizable Range answered by ``replica``."""
        import grpc

        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        port = self.ports[self.replicas.index(replica)]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"/registry/health"), timeout=timeout)
        return resp.header.revision

    def metric(self, replica: "Proc", name: str) -> int:
        """An unlabelled sample of ``replica``'s /metrics, e.g.
        brain_require_leader_streams (the streams opened with etcd's
        require-leader metadata, as kube-apiserver opens its watches)."""
        port = self.ports[self.replicas.index(replica)]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise ValueError(f"{replica.name}: no {name} in /metrics")

    @property
    def url(self) -> str:
        return ",".join(f"http://127.0.0.1:{p}" for p in self.ports)

    def apiserver_flags(self) -> list[str]:
        return [f"--etcd-servers={self.url}"]

    def channel(self):
        import grpc

        live = next((p for p, r in zip(self.ports, self.replicas) if r.alive), self.ports[0])
        return grpc.insecure_channel(f"127.0.0.1:{live}", options=[("grpc.max_receive_message_length", 256 << 20)])

    def start(self, timeout: float = 90.0) -> None:
        """Start NATS and the replicas; return once every replica answers and
        all name one leader. A replica still joining refuses connections (the
        first boot's replicas can wait seconds for the cluster ID while another
        creates the stream), and the apiserver, which was given all three,
        and the Status check would meet it."""
        self.nats.start()
        if not self.replicas[0].argv:
            self.toxiproxy.start()
            self._wire()
        for r in self.replicas:
            if not r.alive:
                r.start()
        deadline = time.monotonic() + timeout
        while self.leader(every_replica=True) is None:
            for r in self.replicas:
                r.check_alive()
            if time.monotonic() > deadline:
                tails = "\n".join(f"{r.name}:\n{log_tail(r.log_path, 2000)}" for r in self.replicas)
                raise StartError(f"{self.label}: not every replica serving with one leader after {timeout:.0f}s; "
                                 f"log tails:\n{tails}")
            time.sleep(0.2)

    def restart(self, replica: "Proc", timeout: float = 60.0) -> float:
        """Start a stopped replica again; seconds until it answers a linearizable read."""
        import grpc

        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        t0 = time.monotonic()
        replica.start()
        self.killed.discard(replica.name)
        port = self.ports[self.replicas.index(replica)]
        while True:
            replica.check_alive()
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                    rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"/registry/health"), timeout=2)
                return time.monotonic() - t0
            except grpc.RpcError:
                if time.monotonic() - t0 > timeout:
                    raise StartError(f"{replica.name} not serving after {timeout:.0f}s:\n{log_tail(replica.log_path)}")
                time.sleep(0.2)

    def leader(self, every_replica: bool = False) -> "Proc | None":
        """The replica every live replica that answers names as leader, or
        None; with ``every_replica``, None too while a live one does not answer."""
        import grpc

        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        ids, named = {}, set()
        for port, r in zip(self.ports, self.replicas):
            if not r.alive:
                continue
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                    st = rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=2)
            except grpc.RpcError:
                if every_replica:
                    return None
                continue
            ids[st.header.member_id] = r
            named.add(st.leader)
        if len(named) == 1:
            return ids.get(named.pop())
        return None

    def stop(self, timeout: float = 30.0) -> int | None:
        codes = [r.stop(timeout) for r in self.replicas]
        self.nats.cleanup()
        self.toxiproxy.cleanup()
        bad = [c for c in codes if c not in (0, None, -9)]
        return bad[0] if bad else 0

    def kill9(self) -> int | None:
        raise NotImplementedError("a brain cluster loses one replica at a time: kill_replica")

    def kill_replica(self, replica: Proc) -> int | None:
        """kill -9 of one replica; it no longer counts in ``procs`` until ``restart``."""
        self.killed.add(replica.name)
        return replica.kill9()

    def procs(self) -> list[Proc]:
        return [r for r in self.replicas if r.name not in self.killed]

    def rss_mib(self) -> float | None:
        total = 0.0
        for r in self.replicas:
            if r.alive:
                try:
                    for line in Path(f"/proc/{r.popen.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) / 1024
                except OSError:
                    pass
        return total or None


@dataclass
class GroupEndpoint(Storage):
    """One group of a BrainGroups, for reads (Storage's, on its port)."""

    port: int
    label: str = "group"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class BrainGroups(Storage):
    """`brain groups` (docs/groups.md) with two groups over TCP: node Leases
    and Events (coordination.k8s.io/leases, /events, events.k8s.io/events) in
    one, everything else in the other, from a layout file; kube-apiserver
    gets the flags `brain groups --print-flags` prints for it.  ``proc`` is
    the supervisor; the reads for the checks go to the main group unless a
    group is named."""

    label = "brain-groups"
    transport = "tcp"
    MAIN = "main"
    MOVED = "leases-events"
    RESOURCES = ("coordination.k8s.io/leases", "/events", "events.k8s.io/events")

    def __init__(self, workdir: Path, restart_delay: float = 1.0):
        self.workdir = workdir
        self.data_dir = workdir / "brain-groups"
        self.ports = {self.MAIN: free_port(), self.MOVED: free_port()}
        self.metrics_ports = {self.MAIN: free_port(), self.MOVED: free_port()}
        self.port = self.ports[self.MAIN]
        self.layout = workdir / "groups.toml"
        groups = []
        for name in (self.MAIN, self.MOVED):
            resources = "" if name == self.MAIN else f"resources = {json.dumps(list(self.RESOURCES))}\n"
            groups.append(f'[[group]]\nname = "{name}"\n{resources}'
                          f'listen-client-urls = "http://127.0.0.1:{self.ports[name]}"\n'
                          f'listen-metrics-urls = "http://127.0.0.1:{self.metrics_ports[name]}"\n'
                          f'data-dir = "{self.data_dir / name}"\n')
        # the groups' logs in the work directory, kept with the others when the data is removed
        self.layout.write_text(f'data-root = "{workdir}"\n\n' + "\n".join(groups))
        self.proc = Proc("brain-groups", [sys.executable, "-m", "brain", "groups", "--layout", str(self.layout),
                                          "--restart-delay", str(restart_delay)], workdir / "brain-groups.log")
        self._flags: list[str] | None = None

    def apiserver_flags(self) -> list[str]:
        """What `brain groups --print-flags` prints for the layout, as it prints it."""
        if self._flags is None:
            r = subprocess.run([sys.executable, "-m", "brain", "groups", "--layout", str(self.layout),
                                "--print-flags"], capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
            if r.returncode != 0:
                raise StartError(f"brain groups --print-flags failed: {r.stderr}")
            self._flags = r.stdout.split()
        return list(self._flags)

    def group(self, name: str) -> "GroupEndpoint":
        """The reads of the checks, sent to group ``name`` alone."""
        return GroupEndpoint(self.ports[name], f"{self.label} {name}")

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace")

    def start(self, timeout: float = 90.0) -> None:
        """Start the supervisor; return once it says every group is up and each answers a linearizable read."""
        self.proc.start()
        deadline = time.monotonic() + timeout
        while "brain groups up" not in self.log().rsplit("===== e2e: start #", 1)[-1]:
            self.proc.check_alive()
            if time.monotonic() > deadline:
                raise StartError(f"brain groups not up after {timeout:.0f}s; log tail:\n{log_tail(self.proc.log_path)}")
            time.sleep(0.2)
        for name in self.ports:
            self.group(name).count_prefix(b"/registry/health", timeout=10.0)

    def group_pid(self, group: str) -> int:
        """The pid of ``group``'s brain as the supervisor last reported it."""
        text = self.log().rsplit("===== e2e: start #", 1)[-1]
        pids = re.findall(rf"^  {re.escape(group)}\s+\S+\s+pid (\d+)", text, re.M)
        pids += re.findall(rf" {re.escape(group)} started again, pid (\d+)", text)
        if not pids:
            raise StartError(f"brain groups named no pid for {group}")
        # the banner comes first, restarts after it: the last line is the current process
        last = max(((text.rfind(f"pid {p}"), int(p)) for p in pids))
        return last[1]

    def rss_mib(self) -> float | None:
        if not self.proc.alive:
            return None
        total = 0.0
        for name in [None, *self.ports]:
            try:
                pid = self.proc.popen.pid if name is None else self.group_pid(name)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
            except (OSError, StartError):
                continue
        return total or None


# ---------------------------------------------------------------------------
# the Kubernetes control plane
# ---------------------------------------------------------------------------


def write_kubeconfig(path: Path, server: str, ca: Path, token: str) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "e2e", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)
    return path


@dataclass
class ControlPlane:
    bindir: Path
    workdir: Path
    pki: ClusterPKI
    brain: Storage
    kwok_stages: Path
    event_ttl: str = "30s"
    compaction_interval: str = "30s"
    port: int = field(default_factory=free_port)

    def __post_init__(self):
        w = self.workdir
        self.server = f"https://127.0.0.1:{self.port}"
        tokens = w / "tokens.csv"
        tokens.write_text("".join(f'{tok},{user},{user},"{groups}"\n' for tok, user, groups in TOKENS.values()))
        tokens.chmod(0o600)
        self.tokens_file = tokens
        self.admin_token = TOKENS["admin"][0]
        ca = self.pki.k8s_ca.cert
        self.kubeconfig = write_kubeconfig(w / "admin.kubeconfig", self.server, ca, self.admin_token)
        kcm_kc = write_kubeconfig(w / "kcm.kubeconfig", self.server, ca, TOKENS["controller-manager"][0])
        sched_kc = write_kubeconfig(w / "scheduler.kubeconfig", self.server, ca, TOKENS["scheduler"][0])
        b = self.bindir
        self.apiserver = Proc("kube-apiserver", [
            str(b / "kube-apiserver"),
            *self.brain.apiserver_flags(),
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={self.pki.apiserver.cert}", f"--tls-private-key-file={self.pki.apiserver.key}",
            f"--cert-dir={w / 'apiserver-certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki.sa_key}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The lease reconciler would publish 127.0.0.1 as the kubernetes
            # Service's endpoint, which validation refuses (loopback).
            "--endpoint-reconciler-type=none",
            f"--event-ttl={self.event_ttl}",
            f"--etcd-compaction-interval={self.compaction_interval}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=2",
        ], w / "kube-apiserver.log")
        self.controller_manager = Proc("kube-controller-manager", [
            str(b / "kube-controller-manager"),
            f"--kubeconfig={kcm_kc}", f"--authentication-kubeconfig={kcm_kc}",
            f"--authorization-kubeconfig={kcm_kc}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={self.pki.sa_key}", f"--root-ca-file={ca}",
            # One service account per controller, as kubeadm runs it: the
            # system:kube-controller-manager user alone may not run them all.
            "--use-service-account-credentials=true",
            "--kube-api-qps=200", "--kube-api-burst=400",
            "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
            "--v=1",
        ], w / "kube-controller-manager.log")
        self.scheduler = Proc("kube-scheduler", [
            str(b / "kube-scheduler"),
            f"--kubeconfig={sched_kc}", f"--authentication-kubeconfig={sched_kc}",
            f"--authorization-kubeconfig={sched_kc}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--v=1",
        ], w / "kube-scheduler.log")
        self.kwok = Proc("kwok", [
            str(b / "kwok"),
            f"--kubeconfig={self.kubeconfig}", f"--config={self.kwok_stages}",
            "--manage-all-nodes=true", "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{free_port()}",
            "--v=WARN",
        ], w / "kwok.log")
        self._ssl = ssl.create_default_context(cafile=str(ca))

    # -- HTTP to the apiserver ----------------------------------------------
    def http_get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        return self._http(urllib.request.Request(self.server + path), timeout)

    def http_post_json(self, path: str, obj: dict, timeout: float = 10.0) -> tuple[int, str]:
        """POST a JSON object as the admin."""
        return self._http(urllib.request.Request(self.server + path, data=json.dumps(obj).encode(), method="POST",
                                                 headers={"Content-Type": "application/json"}), timeout)

    def _http(self, req: urllib.request.Request, timeout: float) -> tuple[int, str]:
        """(status, body) of a request as the admin; status 0 on a transport error or timeout."""
        req.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as e:
            return 0, str(e)

    def wait_readyz(self, timeout: float) -> tuple[float, str]:
        """Poll /readyz?verbose until 200; returns (seconds waited, body)."""
        t0 = time.monotonic()
        body = ""
        while time.monotonic() - t0 < timeout:
            self.apiserver.check_alive()
            code, body = self.http_get("/readyz?verbose", timeout=5)
            if code == 200:
                return time.monotonic() - t0, body
            time.sleep(0.5)
        raise StartError(f"kube-apiserver /readyz not green after {timeout:.0f}s; last answer:\n{body}\n"
                         f"log tail:\n{log_tail(self.apiserver.log_path)}")

    def start(self, timeout: float = 180.0) -> float:
        t0 = time.monotonic()
        self.apiserver.start()
        self.wait_readyz(timeout)
        for p in (self.controller_manager, self.scheduler, self.kwok):
            p.start()
        time.sleep(1.0)
        for p in (self.controller_manager, self.scheduler, self.kwok):
            p.check_alive()
        return time.monotonic() - t0

    def procs(self) -> list[Proc]:
        return [self.kwok, self.scheduler, self.controller_manager, self.apiserver]

    def stop(self) -> None:
        for p in self.procs():
            p.stop(20)
