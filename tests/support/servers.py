"""Start and stop etcd / brain servers on loopback for tests.

Every server gets free loopback ports and its own temporary directory (data
dir plus a log file next to it).  ``start()`` waits until a gRPC Range on the
client endpoint succeeds (up to ``ready_timeout`` seconds) and raises
``ServerStartError`` carrying the tail of the server's log when it does not.
``stop()`` sends SIGTERM, waits, then SIGKILLs.  The process handling is
tests.support.harness, shared with the benchmarks; what is the tests' own is
here: the leak-check marks a server carries, skip-or-fail when a binary is
missing, temp dirs on /dev/shm.

etcd comes in two versions: 3.4 is Debian's etcd-server (``/usr/bin/etcd``),
3.6 is the etcd 3.6.16 that benchmarks/build.sh builds into its cache (built
on first use, then found in the cache in under a second).

Environment knobs:
  ETCD_BIN          path of the etcd 3.4 binary (default /usr/bin/etcd)
  ETCD36_BIN        path of an etcd 3.6 binary (default: benchmarks/build.sh's
                    etcd-3.6, under $BRAIN_BENCH_CACHE or <repo>/.cache/bench)
  ETCD37_BIN        the same for etcd 3.7 (etcd-3.7)
  TEST_TMPDIR       parent directory for server temp dirs (default: /dev/shm
                    when it exists, else the system temp dir)
  TEST_DISK_TMPDIR  parent directory for servers that must keep their data on a
                    real disk (``on_disk=True``: crash and fdatasync tests);
                    default: the system temp dir, refused if it is a tmpfs
  KEEP_TEST_DIRS    when set, temp dirs are left behind for inspection
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc

from tests.support import leaks
from tests.support.harness import REPO_ROOT, ServerProcess, ServerStartError, brain_env, free_port, port_taken

ETCD_BIN = os.environ.get("ETCD_BIN", "/usr/bin/etcd")
ETCD_VERSIONS = ("3.4", "3.6", "3.7")

DEFAULT_READY_TIMEOUT = 20.0
_LOG_TAIL_BYTES = 20000


class ServerRunningError(RuntimeError):
    """``start()`` of a server whose process is running already."""


def _executable(path: str | os.PathLike) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def etcd_available() -> bool:
    return _executable(ETCD_BIN)


_built: dict[str, str] = {}  # version -> binary, or "" after a failed build (reason in _build_errors)
_build_errors: dict[str, str] = {}


def etcd_binary(version: str = "3.4") -> str | None:
    """The etcd binary of ``version`` (one of ETCD_VERSIONS), or None.

    3.4 is Debian's; 3.6 and 3.7 are built by benchmarks/build.sh on first
    use (once per session; Go's module and build caches make later builds a
    cache hit).  $ETCD36_BIN / $ETCD37_BIN name prebuilt ones instead."""
    if version == "3.4":
        return ETCD_BIN if etcd_available() else None
    if version not in ETCD_VERSIONS:
        raise ValueError(f"unknown etcd version {version!r}; known: {ETCD_VERSIONS}")
    env = "ETCD%s_BIN" % version.replace(".", "")
    explicit = os.environ.get(env)
    if explicit:
        if not _executable(explicit):
            _build_errors[version] = f"{env}={explicit} is not an executable file"
            return None
        return explicit
    name = f"etcd-{version}"
    if version not in _built:
        from benchmarks.servers import bin_dir

        build = REPO_ROOT / "benchmarks" / "build.sh"
        if shutil.which("go") is None:
            cached = bin_dir() / name
            _built[version] = str(cached) if _executable(cached) else ""
            _build_errors[version] = f"go is not on PATH and {name} is not built"
        else:
            r = subprocess.run(["bash", str(build), name], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=1800)
            lines = r.stdout.strip().splitlines()
            path = Path(lines[-1]) / name if r.returncode == 0 and lines else None
            _built[version] = str(path) if path is not None and _executable(path) else ""
            _build_errors[version] = f"benchmarks/build.sh {name} failed (exit {r.returncode}): {r.stderr[-1500:]}"
    return _built[version] or None


def brain_available() -> bool:
    """True when ``python -m brain`` can be run from the repository."""
    return (REPO_ROOT / "brain" / "__main__.py").is_file()


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(msg: str, *, module: bool = False) -> None:
    """A tool, package or service the calling test needs is missing: fail
    under CI ($CI set), skip elsewhere (`make test` lists skips at the end).
    ``module``: called while a test module is imported."""
    import pytest

    if in_ci():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg, allow_module_level=module)


def require_tool(name: str, package: str) -> str:
    """The path of command ``name`` (from Debian package ``package``)."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} not found (Debian package {package}; `make deps-system` installs it)")
    return path


def require_etcd(version: str = "3.4") -> None:
    """Skip the calling test when etcd ``version`` is missing (fail instead under CI)."""
    if etcd_binary(version):
        return
    if version == "3.4":
        unavailable(f"etcd binary not found at {ETCD_BIN} (apt-get install etcd-server etcd-client)")
    unavailable(f"etcd {version} unavailable: {_build_errors.get(version, 'not built')}")


def require_brain() -> None:
    """Skip the calling test when ``brain/__main__.py`` does not exist yet (fail under CI)."""
    if not brain_available():
        unavailable("brain server entry point (brain/__main__.py) does not exist yet")


def tmp_parent() -> str | None:
    """Where servers' temp dirs go: $TEST_TMPDIR, else /dev/shm (memory: no disk I/O), else the system's."""
    explicit = os.environ.get("TEST_TMPDIR")
    if explicit:
        return explicit
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}


def filesystem_type(path: str) -> str:
    """The type of the filesystem holding ``path`` (as `stat -f -c %T` names it)."""
    return subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True,
                          check=True).stdout.strip()


def disk_tmp_parent() -> str:
    """A parent directory on a real disk: page cache, writeback and fdatasync
    cost what they cost in production (on tmpfs fdatasync does nothing)."""
    parent = os.environ.get("TEST_DISK_TMPDIR") or tempfile.gettempdir()
    fs = filesystem_type(parent)
    if fs in MEMORY_FILESYSTEMS:
        raise ServerStartError(f"{parent} is on {fs}, not a disk: set TEST_DISK_TMPDIR to a disk directory")
    return parent


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included (/health answers 503 with a body)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def grpc_target(endpoint: str) -> str:
    """Turn ``http://host:port`` (or ``host:port``) into a gRPC target;
    ``unix:///path`` stays as it is (grpc and etcdctl both take it)."""
    if endpoint.startswith("unix://"):
        return endpoint
    for prefix in ("http://", "https://"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):].rstrip("/")
    return endpoint


class Endpoint(str):
    """A server's client endpoint as tests pass it around (a plain string:
    ``127.0.0.1:PORT`` or ``unix:///path``), carrying the test PKI when the
    server wants mutual TLS, so every client made from it (``grpc_channel``,
    etcdctl through ``etcdctl_flags``) presents the test client certificate."""

    tls = None  # tests.support.tls.TestPKI | None

    def __new__(cls, value: str, tls=None) -> "Endpoint":
        e = super().__new__(cls, value)
        e.tls = tls
        return e


def grpc_channel(endpoint: str, options=()) -> grpc.Channel:
    """A channel to ``endpoint``: TLS with the test client certificate when
    it is an mTLS Endpoint, else plaintext (TCP or unix)."""
    tls = getattr(endpoint, "tls", None)
    target = grpc_target(endpoint)
    opts = list(options)
    if tls is None:
        return grpc.insecure_channel(target, options=opts)
    if target.startswith("unix:"):
        opts.append(("grpc.ssl_target_name_override", "localhost"))
    return grpc.secure_channel(target, tls.channel_credentials(), options=opts)


def etcdctl_flags(endpoint: str) -> list[str]:
    """etcdctl's TLS flags for ``endpoint`` ([] for plaintext)."""
    tls = getattr(endpoint, "tls", None)
    return tls.tool_flags() if tls is not None else []


_PKI = None


def shared_pki():
    """One test PKI per test process (made on first use)."""
    global _PKI
    if _PKI is None:
        from tests.support.tls import make_test_pki

        where = tempfile.mkdtemp(prefix="brain-test-pki-", dir=tmp_parent())
        atexit.register(shutil.rmtree, where, ignore_errors=True)  # /dev/shm is memory: leave nothing there
        _PKI = make_test_pki(Path(where))
    return _PKI


# ---------------------------------------------------------------------------
# gRPC stubs
# ---------------------------------------------------------------------------


@dataclass
class Stubs:
    channel: grpc.Channel
    kv: object
    watch: object
    lease: object
    maintenance: object

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Stubs":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kv_stub(endpoint: str) -> Stubs:
    """KV / Watch / Lease / Maintenance stubs over one insecure channel."""
    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    channel = grpc_channel(
        endpoint,
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
    )
    return Stubs(
        channel=channel,
        kv=rpc_pb2_grpc.KVStub(channel),
        watch=rpc_pb2_grpc.WatchStub(channel),
        lease=rpc_pb2_grpc.LeaseStub(channel),
        maintenance=rpc_pb2_grpc.MaintenanceStub(channel),
    )


# ---------------------------------------------------------------------------
# Process management
# ---------------------------------------------------------------------------


class LoopbackServer:
    """A test server on loopback (tests.support.harness runs its process).
    Subclasses implement ``_command()``."""

    kind = "server"

    def __init__(self, *, ready_timeout: float = DEFAULT_READY_TIMEOUT, env: dict | None = None,
                 on_disk: bool = False, wrapper: Sequence[str] = ()):
        self.ready_timeout = ready_timeout
        self.extra_env = dict(env or {})
        self.wrapper = list(wrapper)  # runs the server, e.g. fiu-run -x ... (exec's it: same pid)
        parent = disk_tmp_parent() if on_disk else tmp_parent()
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.kind}-test-", dir=parent))
        self.data_dir = self.root / "data"
        self.port = free_port()
        self._process = ServerProcess(self.root / "server.log")
        self._starts = 0
        # Who made this server (tests.support.leaks): a restart by a later test
        # still belongs to the fixture or test that created it.
        self.marks = leaks.current_marks()

    # -- addresses --------------------------------------------------------
    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """gRPC target, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    @log_path.setter
    def log_path(self, path: Path) -> None:
        self._process.log_path = path

    @property
    def proc(self) -> subprocess.Popen | None:
        return self._process.proc

    # -- to be provided by subclasses --------------------------------------
    def _command(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update(self.marks)
        env.update(self.extra_env)
        return env

    def _cwd(self) -> str | None:
        return None

    def _pick_new_ports(self) -> None:
        self.port = free_port()

    # -- lifecycle ----------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._process.running

    def start(self) -> "LoopbackServer":
        """Start the process and wait until it answers a gRPC Range.

        A failure to bind (a port taken between picking and binding) on the
        very first start is retried with fresh ports.  A server that is
        running already is refused (``ServerRunningError``): a second process
        on its port and data dir would die, while the first one, answering the
        readiness probe in its place, would be forgotten and outlive the test.
        """
        attempts = 3 if self._starts == 0 else 1
        last_err: Exception | None = None
        for _ in range(attempts):
            try:
                self.spawn()
                self.wait_ready()
                return self
            except ServerStartError as e:
                last_err = e
                self._process.stop(grace=2.0, kill_wait=10)
                if self._starts == 0 and port_taken(e):
                    self._pick_new_ports()
                    continue
                raise
        assert last_err is not None
        raise last_err

    def _refuse_if_running(self) -> None:
        if self.running:
            raise ServerRunningError(f"{self!r} is running already (pid {self.proc.pid}); stop it before "
                                     f"starting it again")

    def spawn(self) -> None:
        """Start the process without waiting for it (``wait_ready`` does): a
        cluster's members are spawned together, as none is ready alone."""
        self._refuse_if_running()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process.spawn(self.wrapper + self._command(), env=self._env(), cwd=self._cwd())

    def log_tail(self, nbytes: int = _LOG_TAIL_BYTES) -> str:
        return self._process.log_tail(nbytes)

    def _failure_detail(self) -> str:
        return f"; command: {' '.join(self._command())}\n--- log ({self.log_path}) ---\n{self.log_tail()}"

    def wait_ready(self) -> None:
        """Until the spawned process answers (``_probe``); then it counts as started."""
        self._process.poll_ready(self._probe, time.monotonic() + self.ready_timeout,
                                 f"{self.kind} on {self.endpoint}", pause=0.1, detail=self._failure_detail)
        self._starts += 1

    def _probe(self, remaining: float) -> str | None:
        """A gRPC Range: None once one answers (refusing it for want of
        credentials is an answer: auth is on), else the error."""
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        channel = grpc_channel(self.endpoint)
        try:
            rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"\x00readiness-probe"),
                                               timeout=min(2.0, max(0.2, remaining)))
            return None
        except grpc.RpcError as e:
            if e.details() in ("etcdserver: user name is empty", "etcdserver: permission denied"):
                return None
            return f"{e.code()}: {e.details()}"
        finally:
            channel.close()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL."""
        self._process.stop(grace, kill_wait=10)

    def kill9(self) -> None:
        """SIGKILL the process (no clean shutdown); data dir is kept."""
        self._process.kill(kill_wait=10)

    def restart(self, grace: float = 10.0) -> "LoopbackServer":
        """Stop (if running) and start again on the same port and data dir."""
        self.stop(grace)
        return self.start()

    def cleanup(self) -> None:
        """Stop the server and remove its temp dir (unless KEEP_TEST_DIRS)."""
        self.stop()
        if not os.environ.get("KEEP_TEST_DIRS"):
            shutil.rmtree(self.root, ignore_errors=True)

    def stubs(self) -> Stubs:
        return kv_stub(self.endpoint)

    def __enter__(self):
        """``with BrainServer(...) as srv``: started here, cleaned up at the
        end.  When the start fails (a server started already included:
        ``with start_brain()`` is refused) it is cleaned up at once."""
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.endpoint} dir={self.root}>"


class EtcdServer(LoopbackServer):
    """A single-member etcd (3.4, 3.6 or 3.7) on loopback."""

    kind = "etcd"

    def __init__(self, *, version: str = "3.4", extra_args: Sequence[str] = (), **kw):
        self.version = version
        self.binary = etcd_binary(version)
        if self.binary is None:
            raise ServerStartError(f"etcd {version} is not available")
        self.extra_args = list(extra_args)
        super().__init__(**kw)
        self.peer_port = free_port()

    def _pick_new_ports(self) -> None:
        super()._pick_new_ports()
        self.peer_port = free_port()

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary,
            "--name", "t",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"t={peer}",
            *self.extra_args,
        ]


class BrainServer(LoopbackServer):
    """``python -m brain serve`` with etcd-style flags, on one listener
    kind (``transport``: http, mtls or unix; see tests.support.tls)."""

    kind = "brain"

    def __init__(self, *, shards: int = 1, extra_args: Sequence[str] = (), transport: str = "http", **kw):
        self.shards = shards
        self.extra_args = list(extra_args)
        self.transport = transport
        super().__init__(**kw)

    @property
    def client_url(self) -> str:
        if self.transport == "mtls":
            return f"https://127.0.0.1:{self.port}"
        if self.transport == "unix":
            return f"unix://{self.root}/brain.sock"
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        if self.transport == "mtls":
            return Endpoint(f"127.0.0.1:{self.port}", shared_pki())
        if self.transport == "unix":
            return Endpoint(self.client_url)
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        tls = shared_pki().server_flags() if self.transport == "mtls" else []
        return [
            sys.executable, "-m", "brain", "serve",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--shards", str(self.shards),
            *tls,
            *self.extra_args,
        ]

    def _env(self) -> dict:
        return brain_env(super()._env())

    def _cwd(self) -> str | None:
        return str(REPO_ROOT)


# ---------------------------------------------------------------------------
# Shard settings used by the tests
# ---------------------------------------------------------------------------

# Boundaries chosen to cut the differential key alphabet (tests/differential/
# generator.py KEYS) into populated shards: "/registry/..." and "a*" keys fall
# before "b", "b*" in [b, k), "k*"/"m"/"s" in [k, t), "t*"/"z*"/0xff after t.
_BOUNDARIES = {
    1: [],
    2: ["k"],
    3: ["b", "t"],
    4: ["b", "k", "t"],
    8: ["/registry/pods/ns2", "a", "b", "k", "m", "t", "z"],
}
_BOUNDARY_POOL = ["/registry/pods/ns2", "/registry/s", "a", "ab", "b", "b0", "k",
                  "kz", "m", "t", "t1", "z", "zz"]


def shard_boundaries(n: int) -> list[str]:
    if n in _BOUNDARIES:
        return list(_BOUNDARIES[n])
    if n < 1 or n - 1 > len(_BOUNDARY_POOL):
        raise ValueError(f"no boundary set for {n} shards")
    step = len(_BOUNDARY_POOL) / n
    return [_BOUNDARY_POOL[int(round(step * i)) - 1] for i in range(1, n)]


def shard_args(n: int) -> list[str]:
    """Extra brain args for ``n`` shards (beyond ``--shards n``)."""
    b = shard_boundaries(n)
    return ["--shard-boundaries", ",".join(b)] if b else []


def shard_settings_from_env() -> list[int]:
    raw = os.environ.get("BRAIN_TEST_SHARDS", "1,4")
    return [int(x) for x in raw.replace(" ", "").split(",") if x]


def server_settings_from_env() -> list[tuple[int, str]]:
    """(shards, transport) pairs the server suites run on: every shard
    setting over plaintext TCP, and the first one over each other listener
    kind of BRAIN_TEST_TRANSPORTS (mutual TLS, unix socket), so a suite
    runs on every transport without multiplying every shard setting."""
    from tests.support.tls import transports_from_env

    shards = shard_settings_from_env()
    transports = transports_from_env()
    pairs = [(n, "http") for n in shards] if "http" in transports else []
    pairs += [(shards[0], t) for t in transports if t != "http"]
    return pairs


def setting_id(setting: tuple[int, str]) -> str:
    shards, transport = setting
    return f"shards{shards}" + ("" if transport == "http" else f"-{transport}")


def start_brain(shards: int = 1, extra_args: Sequence[str] = (), **kw) -> BrainServer:
    srv = BrainServer(shards=shards, extra_args=[*shard_args(shards), *extra_args], **kw)
    try:
        srv.start()
    except BaseException:
        srv.cleanup()
        raise
    return srv


def serving_brain(setting: tuple[int, str]):
    """A brain for one (shards, transport) setting, as a pytest fixture
    yields it: started, then cleaned up after the test."""
    require_brain()
    shards, transport = setting
    srv = start_brain(shards, transport=transport)
    try:
        yield srv
    finally:
        srv.cleanup()


def start_etcd(**kw) -> EtcdServer:
    srv = EtcdServer(**kw)
    try:
        srv.start()
    except BaseException:
        srv.cleanup()
        raise
    return srv
