"""The servers under benchmark: etcd 3.4, 3.6 and 3.7, kine (sqlite) and brain.

etcd 3.6 and 3.7 come in two client-listener configurations.  The default
(``etcd-3.6``, ``etcd-3.7``) is one ``--listen-client-urls`` serving gRPC
and HTTP on one port, as kubeadm deploys it; under TLS etcd then serves gRPC
through Go's net/http handler (grpc-go's ServeHTTP), a known slow path
(etcd-io/etcd#15402).  "Fast gRPC" (``etcd-3.6-fast``, ``etcd-3.7-fast``)
adds ``--listen-client-http-urls`` on a second port, which leaves the client
port to grpc-go's own server; the load generators use the client port.  In
plaintext both configurations reach grpc-go's server (cmux hands it HTTP/2),
so the fast ones run only in the mutual TLS groups (``tls_only``).

Each start gets a fresh data directory under the run's temporary root, free
loopback ports, its stdout/stderr in ``server.log`` beside the data dir, and
returns once a linearizable Get of one key (``ready_key``) answers: a probe
every server answers in constant time, whatever it holds (a count over the
data set would cost etcd seconds at 10M keys and brain well under one).  ``stop()`` sends SIGTERM to
the process group, waits, then SIGKILLs it.  The process handling is
tests.support.harness, the one the tests use.

Resource readings come from /proc: CPU is utime+stime (plus cutime+cstime of
waited children) summed over the server's process group, memory is VmRSS
summed the same way.  kine links sqlite in-process, so its figures cover the
database too; brain's lmdb and etcd's bbolt are memory-mapped files, whose
touched pages count in RSS (the file-backed part is reported separately).

Binaries: etcd 3.4 is ``etcd`` from PATH (Debian's etcd-server); the others
are read from ``<repo>/.cache/bench/bin`` (written by benchmarks/build.sh;
``$BRAIN_BENCH_CACHE`` moves ``.cache/bench`` as it does for build.sh), or
from ``$BRAIN_BENCH_BIN`` when set.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.machine import first_line
from benchmarks.probes import READY_KEY, ready_get
from tests.support.harness import REPO_ROOT, ServerProcess, ServerStartError, brain_env, free_port, port_taken
from tests.support.tls import TestPKI
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def bin_dir() -> Path:
    """$BRAIN_BENCH_BIN, else bin/ of build.sh's cache ($BRAIN_BENCH_CACHE or <repo>/.cache/bench)."""
    explicit = os.environ.get("BRAIN_BENCH_BIN")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("BRAIN_BENCH_CACHE")
    return (Path(cache) if cache else REPO_ROOT / ".cache" / "bench") / "bin"


def tool_path(name: str) -> Path | None:
    """A built tool (benchmark, brainload, etcdctl-3.6, ...) or None."""
    p = bin_dir() / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


class ServerError(RuntimeError):
    """A server did not start, or died; the message carries its log tail."""


# ---------------------------------------------------------------------------
# /proc readings
# ---------------------------------------------------------------------------


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(rest[2]) == pgid:  # field 5: pgrp
            pids.append(int(entry))
    return pids


def cpu_seconds(pgid: int) -> float:
    """utime+stime+cutime+cstime over the process group, in seconds."""
    ticks = 0
    for pid in _group_pids(pgid):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # rest[0] is field 3 (state); utime/stime/cutime/cstime are fields 14..17.
        ticks += sum(int(x) for x in rest[11:15])
    return ticks / CLK_TCK


def thread_cpu_seconds(pgid: int, name: str) -> float | None:
    """utime+stime of the threads called ``name`` (their OS name, /proc/<pid>/task/<tid>/comm) in the
    process group, in seconds; None when the group has no such thread."""
    ticks, found = 0, False
    for pid in _group_pids(pgid):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
                    if f.read().rstrip(b"\n").decode(errors="replace") != name:
                        continue
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    rest = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            found = True
            ticks += int(rest[11]) + int(rest[12])  # fields 14 and 15: utime, stime
    return ticks / CLK_TCK if found else None


def memory_kb(pgid: int) -> dict:
    """VmRSS, RssAnon, RssFile and VmHWM (kB) summed over the process group."""
    out = {"rss_kb": 0, "rss_anon_kb": 0, "rss_file_kb": 0, "hwm_kb": 0}
    keys = {"VmRSS": "rss_kb", "RssAnon": "rss_anon_kb", "RssFile": "rss_file_kb", "VmHWM": "hwm_kb"}
    for pid in _group_pids(pgid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name in keys:
                        out[keys[name]] += int(value.split()[0])
        except OSError:
            continue
    return out


# ---------------------------------------------------------------------------
# Server flavours
# ---------------------------------------------------------------------------


@dataclass
class StartOptions:
    quota_bytes: int = 0  # --quota-backend-bytes (0: the server's default); the restart and scale runs raise it
    tls: TestPKI | None = None  # https:// with client-cert auth instead of http://

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


QUOTA_8G = 8 * 1024 ** 3


class Flavor:
    """How to run one kind of server.  Subclasses fill in the details."""

    name = "server"
    #: process whose RSS/CPU is measured (for documentation in the report)
    process_note = ""
    #: run only in the mutual TLS groups (a configuration that differs from another flavor's only under TLS)
    tls_only = False
    #: the only benchmark groups this configuration runs in (empty: every group)
    only_in: tuple[str, ...] = ()

    def binary(self) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def available(self) -> tuple[bool, str]:
        b = self.binary()
        if b is None:
            return False, self.missing_reason()
        return True, ""

    def missing_reason(self) -> str:
        return "binary not found"

    def version(self) -> str:
        return "?"

    def command(self, data_dir: Path, port: int, peer_port: int, opts: StartOptions) -> list[str]:
        raise NotImplementedError  # pragma: no cover

    def env(self) -> dict:
        return dict(os.environ)

    def cwd(self) -> str | None:
        return None

    def flags_note(self) -> str:
        return ""

    def metrics_url(self, peer_port: int) -> str | None:
        """Where the server serves Prometheus metrics, if the harness reads them."""
        return None

    def ready_endpoints(self, port: int, peer_port: int) -> list[str]:
        """The endpoints that must answer before the server is ready (several for a server of several
        processes)."""
        return [f"127.0.0.1:{port}"]

    def members(self, pid: int) -> dict[str, int]:
        """The server's processes as {name: the process group each leads}: the one group ``pid`` leads,
        or more for a server that starts processes of its own in sessions of their own."""
        return {self.name: pid}

    def members_up(self, pid: int) -> bool:
        """Every process the server started is still there (a server of one process: always)."""
        return True

    def endpoints_by_kind(self, port: int, peer_port: int) -> dict[str, str]:
        """brainload node-capacity's per-kind endpoints (leases, pods, events) where they are not all the
        server's one endpoint; {} when they are."""
        return {}


class Etcd(Flavor):
    """A single etcd member.  ``fast_grpc``: HTTP on a port of its own (--listen-client-http-urls),
    so the client port is grpc-go's own server also under TLS."""

    def __init__(self, name: str, binary_name: str, from_path: bool, fast_grpc: bool = False):
        self.name = name
        self._binary_name = binary_name
        self._from_path = from_path
        self.fast_grpc = fast_grpc
        self.tls_only = fast_grpc
        self.process_note = "the etcd process"

    def binary(self) -> str | None:
        if self._from_path:
            return shutil.which(self._binary_name)
        p = tool_path(self._binary_name)
        return str(p) if p else None

    def missing_reason(self) -> str:
        if self._from_path:
            return f"`{self._binary_name}` not in PATH (Debian package etcd-server)"
        return f"{self._binary_name} not built (run benchmarks/build.sh)"

    def version(self) -> str:
        return first_line([self.binary(), "--version"]) or "?"

    def command(self, data_dir, port, peer_port, opts):
        client = f"{opts.scheme}://127.0.0.1:{port}"
        peer = f"http://127.0.0.1:{peer_port}"
        cmd = [
            self.binary(),
            "--name", "bench",
            "--data-dir", str(data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}",
        ]
        if self.fast_grpc:
            # A port taken meanwhile fails the start with "address already in use": Server.start retries.
            cmd += ["--listen-client-http-urls", f"{opts.scheme}://127.0.0.1:{free_port()}"]
        if opts.quota_bytes:
            cmd += ["--quota-backend-bytes", str(opts.quota_bytes)]
        if opts.tls:
            cmd += opts.tls.server_flags()
        return cmd

    def flags_note(self) -> str:
        note = ("single member, defaults (2 GiB quota; 8 GiB for the 1M-key restart run and the node-capacity "
                "steps; the scale run: 8 GiB or 4 KiB per key, the larger)")
        if self.fast_grpc:
            return ("fast gRPC: " + note + " plus --listen-client-http-urls on a second port, the load on the "
                    "gRPC-only client port (mutual TLS groups only)")
        if not self._from_path:
            return note + "; one client listener for gRPC and HTTP (as kubeadm deploys it)"
        return note


class Kine(Flavor):
    name = "kine"
    process_note = "the kine process (sqlite is linked in)"

    def binary(self):
        p = tool_path("kine")
        return str(p) if p else None

    def missing_reason(self):
        return "kine not built (run benchmarks/build.sh)"

    def version(self):
        return first_line([self.binary(), "--version"]) or "?"

    def _help(self) -> str:
        if not hasattr(self, "_help_text"):
            try:
                out = subprocess.run([self.binary(), "--help"], capture_output=True, text=True, timeout=20)
                self._help_text = out.stdout + out.stderr
            except (OSError, subprocess.TimeoutExpired):
                self._help_text = ""
        return self._help_text

    # kine's own sqlite DefaultParams: a DSN given in --endpoint replaces them, so they are repeated.
    SQLITE_PARAMS = ("_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate"
                     "&_stmt_cache_size=20&cache=shared")

    def command(self, data_dir, port, peer_port, opts):
        dsn = f"sqlite://{data_dir}/state.db?{self.SQLITE_PARAMS}"
        cmd = [self.binary(), "--endpoint", dsn, "--listen-address", f"127.0.0.1:{port}"]
        # kine serves metrics on :8080 by default; keep it on loopback on a free port.
        if "--metrics-bind-address" in self._help():
            cmd += ["--metrics-bind-address", f"127.0.0.1:{peer_port}"]
        if opts.tls:
            cmd += opts.tls.kine_flags()
        return cmd

    def flags_note(self):
        return "sqlite backend with kine's default parameters (WAL, synchronous=NORMAL, busy timeout 30 s)"


class Brain(Flavor):
    name = "brain"
    process_note = "the python process (lmdb is memory-mapped in it)"

    def binary(self):
        return sys.executable if (REPO_ROOT / "brain" / "__main__.py").is_file() else None

    def missing_reason(self):
        return "brain/__main__.py not found"

    def version(self):
        v = first_line([sys.executable, "-m", "brain", "serve", "--version"]) or "?"
        try:
            rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            rev = ""
        py = "python " + ".".join(map(str, sys.version_info[:3]))
        return f"{v} (commit {rev or '?'}, {py})"

    def metrics_url(self, peer_port):
        return f"http://127.0.0.1:{peer_port}/metrics"

    def command(self, data_dir, port, peer_port, opts):
        # brain has no peer port: the second port serves /metrics (journal
        # and checkpoint gauges for the restart run).
        cmd = [sys.executable, "-m", "brain", "serve",
               "--data-dir", str(data_dir),
               "--listen-client-urls", f"{opts.scheme}://127.0.0.1:{port}",
               "--listen-metrics-urls", f"http://127.0.0.1:{peer_port}"]
        if opts.quota_bytes:
            cmd += ["--quota-backend-bytes", str(opts.quota_bytes)]
        if opts.tls:
            cmd += opts.tls.server_flags()
        return cmd

    def env(self):
        return brain_env(os.environ)

    def cwd(self):
        return str(REPO_ROOT)

    def flags_note(self):
        return "`brain serve` defaults (the restart, scale and node-capacity runs' quotas, as for etcd)"


class BrainGroups(Brain):
    """brain as two groups (docs/groups.md), started as `brain groups` starts them: node Leases and
    Events (coordination.k8s.io/leases, /events, events.k8s.io/events) in one brain, everything else,
    pods included, in another.  Only the node-capacity group runs it, against one brain in the same run.
    The server's port is the main group's, its second port the Leases-and-Events group's; each group
    runs in a session of its own under `brain groups`, so its CPU, memory and committer are read per
    group and summed with the supervisor's."""

    name = "brain-groups"
    process_note = "`brain groups` and its two `brain serve` processes (each group's committer read on its own)"
    only_in = ("node-capacity",)
    MOVED = "leases-events"
    RESOURCES = "coordination.k8s.io/leases,/events,events.k8s.io/events"

    def metrics_url(self, peer_port):
        return None

    def command(self, data_dir, port, peer_port, opts):
        cmd = [sys.executable, "-m", "brain", "groups", "--group", f"{self.MOVED}={self.RESOURCES}",
               "--listen-client-urls", f"default={opts.scheme}://127.0.0.1:{port}",
               "--listen-client-urls", f"{self.MOVED}={opts.scheme}://127.0.0.1:{peer_port}",
               "--data-root", str(data_dir), "--restart-delay", "-1"]
        serve = []
        if opts.quota_bytes:
            serve.append(f"quota-backend-bytes={opts.quota_bytes}")
        if opts.tls:
            flags = opts.tls.server_flags()
            while flags:
                flag = flags.pop(0)[2:]
                serve.append(f"{flag}={flags.pop(0)}" if flags and not flags[0].startswith("--") else f"{flag}=true")
        for flag in serve:
            cmd += ["--serve-flag", flag]
        return cmd

    def ready_endpoints(self, port, peer_port):
        return [f"127.0.0.1:{port}", f"127.0.0.1:{peer_port}"]

    def members(self, pid):
        out = {"brain groups": pid}
        for child in child_pids(pid):
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            names = [a[len(b"--name="):].decode() for a in argv if a.startswith(b"--name=")]
            out[names[0] if names else str(child)] = child
        return out

    def members_up(self, pid):
        return len(child_pids(pid)) == 2

    def endpoints_by_kind(self, port, peer_port):
        main, moved = f"127.0.0.1:{port}", f"127.0.0.1:{peer_port}"
        return {"leases": moved, "events": moved, "pods": main}

    def flags_note(self):
        return ("`brain groups`: node Leases and Events in one `brain serve`, everything else in another, each on "
                "`brain serve` defaults (the node-capacity quota as for brain); node-capacity only")


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (and not yet reaped zombies)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(rest[1]) == pid and rest[0] != b"Z":  # field 4: ppid; field 3: state
            out.append(int(entry))
    return out


def all_flavors() -> list[Flavor]:
    return [Etcd("etcd-3.4", "etcd", from_path=True),
            Etcd("etcd-3.6", "etcd-3.6", from_path=False),
            Etcd("etcd-3.6-fast", "etcd-3.6", from_path=False, fast_grpc=True),
            Etcd("etcd-3.7", "etcd-3.7", from_path=False),
            Etcd("etcd-3.7-fast", "etcd-3.7", from_path=False, fast_grpc=True),
            Kine(), Brain(), BrainGroups()]


# ---------------------------------------------------------------------------
# A running server
# ---------------------------------------------------------------------------


@dataclass
class Server:
    flavor: Flavor
    root: Path  # this server's directory: data/ and server.log
    opts: StartOptions = field(default_factory=StartOptions)
    ready_timeout: float = 60.0
    port: int = 0
    peer_port: int = 0
    started_at: float = 0.0
    ready_after_s: float | None = None
    # "Ready" is the first linearizable Get of this key that answers (the same
    # probe for every server); whether it found the key is kept in ready_found.
    ready_key: bytes = READY_KEY
    ready_found: bool | None = None
    # CPU seconds the server used from spawn to ready: unlike the wall time,
    # barely moved by other load on the machine.
    ready_cpu_s: float | None = None

    def __post_init__(self) -> None:
        self._process = ServerProcess(self.root / "server.log")

    @property
    def proc(self) -> subprocess.Popen | None:
        return self._process.proc

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The endpoint with its scheme, for tools that tell TLS by it."""
        return f"{self.opts.scheme}://{self.endpoint}"

    @property
    def metrics_url(self) -> str | None:
        return self.flavor.metrics_url(self.peer_port)

    def metric(self, name: str) -> float | None:
        """One unlabelled sample from the server's /metrics, or None.  brain
        opens its metrics listener just after its gRPC one: a refused
        connection is retried for up to 10 s."""
        import urllib.error
        import urllib.request

        url = self.metrics_url
        if url is None:
            return None
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    text = r.read().decode()
                break
            except urllib.error.URLError:
                if time.monotonic() > deadline or not self.alive():
                    raise
                time.sleep(0.1)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return float(parts[1])
        return None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, nbytes: int = 4000) -> str:
        return self._process.log_tail(nbytes)

    def start(self) -> float:
        """Start and wait for a linearizable Get of ``ready_key``; returns seconds from spawn to ready."""
        for attempt in range(3):
            if not self.port or attempt:
                self.port, self.peer_port = free_port(), free_port()
            try:
                return self._start_once()
            except ServerStartError as e:
                self.kill()
                if port_taken(e) and attempt < 2:
                    continue
                raise ServerError(str(e)) from None
        raise AssertionError("unreachable")

    def _start_once(self) -> float:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.flavor.command(self.data_dir, self.port, self.peer_port, self.opts)
        self.started_at = time.monotonic()
        self._process.spawn(cmd, env=self.flavor.env(), cwd=self.flavor.cwd())
        self._process.poll_ready(self._probe, self.started_at + self.ready_timeout, self.flavor.name, pause=0.01,
                                 detail=lambda: f"\n--- log tail ---\n{self.log_tail()}")
        self.ready_after_s = time.monotonic() - self.started_at
        self.ready_cpu_s = self.cpu_seconds()
        return self.ready_after_s

    def _probe(self, remaining: float) -> str | None:
        """A TCP connect (every 10 ms until one is accepted), then a linearizable Get of ``ready_key`` on
        a fresh channel (every 20 ms), at each endpoint the flavor names (the server's own first)."""
        endpoints = self.flavor.ready_endpoints(self.port, self.peer_port)
        try:
            for ep in endpoints:
                with socket.create_connection(("127.0.0.1", int(ep.rsplit(":", 1)[1])), timeout=0.5):
                    pass
        except OSError as e:
            return f"connect: {e}"
        try:
            for ep in reversed(endpoints):  # the server's own last: ready_found is its answer
                self.ready_found = ready_get(ep, self.ready_key, timeout=min(2.0, max(0.2, remaining)),
                                             tls=self.opts.tls)
            return None
        except Exception as e:  # grpc.RpcError and friends
            details = e.details() if hasattr(e, "details") else str(e)
            code = e.code() if hasattr(e, "code") else type(e).__name__
            time.sleep(0.01)  # with poll_ready's pause: 20 ms between Ranges
            return f"range: {code}: {details}"

    def alive(self) -> bool:
        return self._process.running and self.flavor.members_up(self.pid)

    def cpu_seconds(self) -> float:
        """utime+stime of every process group of the server (one, but for a server of several processes)."""
        if not self.alive():
            return float("nan")
        return sum(cpu_seconds(g) for g in self.flavor.members(self.pid).values())

    def memory(self) -> dict:
        if not self.alive():
            return {}
        out: dict = {}
        for g in self.flavor.members(self.pid).values():
            for k, v in memory_kb(g).items():
                out[k] = out.get(k, 0) + v
        return out

    def thread_cpu(self, name: str) -> dict[str, float]:
        """{member: CPU seconds of its threads called ``name``} for each process of the server that has
        such threads (the server's name for a server of one process); {} when none has (or it is down)."""
        if not self.alive():
            return {}
        members = self.flavor.members(self.pid)
        out = {}
        for member, g in members.items():
            v = thread_cpu_seconds(g, name)
            if v is not None:
                out[self.flavor.name if len(members) == 1 else member] = v
        return out

    def endpoints_by_kind(self) -> dict[str, str]:
        """brainload node-capacity's per-kind endpoints ({} when every kind goes to ``endpoint``)."""
        scheme = f"{self.opts.scheme}://" if self.opts.tls else ""
        return {k: scheme + v for k, v in self.flavor.endpoints_by_kind(self.port, self.peer_port).items()}

    def stop(self, grace: float = 30.0) -> float:
        """SIGTERM the process group, wait up to ``grace``, then SIGKILL.  Returns seconds taken."""
        t0 = time.monotonic()
        self._process.stop(grace)
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL the process group (no clean shutdown); the data dir is kept."""
        self._process.kill()

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def make_root(parent: str | None = None) -> Path:
    """The temporary root of one benchmark session (on disk, not tmpfs: fsync must cost)."""
    return Path(tempfile.mkdtemp(prefix="brain-bench-", dir=parent))
