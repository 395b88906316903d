"""The gRPC server: listeners, options, services, graceful shutdown.

``ApiServer`` binds the etcd v3 services of one engine to every
--listen-client-urls entry; ``run(config)`` is `brain serve`: open the
engine, serve until SIGTERM/SIGINT, drain in-flight calls, close the engine.

Options mirror etcd's server where clients can tell the difference:

* receive limit = --max-request-bytes + 512 KiB, send limit = MaxInt32.
  The receive limit is enforced here rather than by grpc-core, so that an
  oversized request gets grpc-go's text ("grpc: received message larger
  than max (N vs. M)"), which etcd clients see; grpc-core itself only stops
  messages beyond RECV_HARD_CAP_FACTOR times that limit;
* keepalive enforcement as etcd's defaults (--grpc-keepalive-min-time 5s,
  pings without active calls allowed: clientv3 keeps idle connections alive
  with pings, and an unhappy server would answer with GOAWAY
  "too_many_pings");
* SO_REUSEPORT off, so a second server on a taken port fails to start
  instead of silently sharing the port.
"""

from __future__ import annotations

import logging
import os
import signal
import shutil
import socket
import stat
import sys
import tempfile
import threading
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from brain.api import front as native_front
from brain.api import preflight
from brain.api.cluster import ClusterService, cluster_handlers
from brain.api.grpc_stats import GrpcStats, StatsInterceptor
from brain.api.kv import KVService
from brain.api.maintenance import MaintenanceService, maintenance_handlers
from brain.api.lease import LeaseService, lease_handlers
from brain.api.watch import WatchService, watch_handlers
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.config import ConfigError, ListenURL, ServerConfig, format_key

log = logging.getLogger("brain.api.server")

MAX_SEND_BYTES = 2**31 - 1  # etcd: math.MaxInt32
KEEPALIVE_TIME_MS = 2 * 60 * 60 * 1000  # etcd --grpc-keepalive-interval 2h
KEEPALIVE_TIMEOUT_MS = 20 * 1000  # etcd --grpc-keepalive-timeout 20s
KEEPALIVE_MIN_TIME_MS = 5 * 1000  # etcd --grpc-keepalive-min-time 5s
RECV_HARD_CAP_FACTOR = 4  # grpc-core refuses (with its own text) beyond 4x the limit


class ListenError(RuntimeError):
    """A listener could not be bound; the message reads like etcd's."""


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", RECV_HARD_CAP_FACTOR * config.grpc_max_recv_bytes),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MIN_TIME_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
    ]


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from --cert-file/--key-file(/--trusted-ca-file), or None."""
    if not (config.cert_file and config.key_file):
        return None

    def read(path: str, flag: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"{flag} {path}: {e.strerror or e}") from None

    cert = read(config.cert_file, "--cert-file")
    key = read(config.key_file, "--key-file")
    ca = read(config.trusted_ca_file, "--trusted-ca-file") if config.trusted_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=ca,
        require_client_auth=bool(config.client_cert_auth),
    )


def _remove_stale_socket(path: str) -> None:
    """etcd removes a leftover socket file before listening; so do we (only
    sockets: a regular file at that path is left for the bind to fail on)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode):
        os.unlink(path)


def _bind_failure_reason(lu: ListenURL) -> str:
    """Why grpc could not bind ``lu``: grpc's own error says only that it
    failed, so try the same bind with a plain socket to get the OS error."""
    try:
        if lu.is_unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target = lu.path
        else:
            host, _, port = lu.address.rpartition(":")
            host = host.strip("[]")
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            s = socket.socket(family, socket.SOCK_STREAM)
            target = (host, int(port))
        with s:
            s.bind(target)
    except OSError as e:
        return (e.strerror or str(e)).lower()
    return "bind failed"


def unary_handler(method, request_cls, response_cls, recv_limit: int) -> grpc.RpcMethodHandler:
    """A unary handler that receives raw bytes, applies the receive limit
    with grpc-go's wording, parses, and calls ``method(request, context)``."""
    parse = request_cls.FromString

    def handle(raw: bytes, context: grpc.ServicerContext):
        if len(raw) > recv_limit:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"grpc: received message larger than max ({len(raw)} vs. {recv_limit})",
            )
        try:
            request = parse(raw)
        except DecodeError as e:
            context.abort(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {e}")
        return method(request, context)

    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=None, response_serializer=response_cls.SerializeToString
    )


def add_service(server: grpc.Server, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
    server.add_registered_method_handlers(service_name, handlers)


def kv_handlers(svc: KVService, recv_limit: int) -> dict[str, grpc.RpcMethodHandler]:
    return {
        "Range": unary_handler(svc.Range, rpc_pb2.RangeRequest, rpc_pb2.RangeResponse, recv_limit),
        "Put": unary_handler(svc.Put, rpc_pb2.PutRequest, rpc_pb2.PutResponse, recv_limit),
        "DeleteRange": unary_handler(svc.DeleteRange, rpc_pb2.DeleteRangeRequest, rpc_pb2.DeleteRangeResponse, recv_limit),
        "Txn": unary_handler(svc.Txn, rpc_pb2.TxnRequest, rpc_pb2.TxnResponse, recv_limit),
        "Compact": unary_handler(svc.Compact, rpc_pb2.CompactionRequest, rpc_pb2.CompactionResponse, recv_limit),
    }


class ApiServer:
    """The etcd v3 gRPC services of one engine, on the configured listeners."""

    def __init__(self, engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.endpoints: list[str] = []  # resolved URLs, after start()
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._fronts: list[native_front.NativeFront] = []
        self._fallback_dir: str | None = None
        self._handlers: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self._steps: dict[str, dict] = {}
        self.grpc_stats = GrpcStats()  # per-method call counts, for metrics

    def client_urls(self) -> list[str]:
        """What MemberList advertises: --advertise-client-urls, else the
        URLs actually listened on."""
        return list(self.config.advertise_client_urls) or list(self.endpoints)

    def _add_services(self, server: grpc.Server) -> None:
        recv_limit = self.config.grpc_max_recv_bytes
        kv = KVService(self.engine, max_request_bytes=self.config.max_request_bytes)
        lease = LeaseService(self.engine)
        watch = WatchService(self.engine, max_request_bytes=self.config.max_request_bytes)
        self._handlers = {
            "etcdserverpb.KV": kv_handlers(kv, recv_limit),
            "etcdserverpb.Maintenance": maintenance_handlers(MaintenanceService(self.engine), recv_limit),
            "etcdserverpb.Cluster": cluster_handlers(
                ClusterService(self.engine, self.config.name, self.client_urls), recv_limit),
            "etcdserverpb.Lease": lease_handlers(lease, recv_limit),
            "etcdserverpb.Watch": watch_handlers(watch),
        }
        self._steps = {"etcdserverpb.KV": kv.steps(), "etcdserverpb.Lease": lease.steps()}
        for service, handlers in self._handlers.items():
            add_service(server, service, handlers)

    def _front_methods(self) -> list[native_front.Method]:
        """Every unary method: the hot ones as steps, the rest as pooled
        grpcio handlers.  Streaming methods are left to the fallback."""
        methods = []
        for service, handlers in self._handlers.items():
            steps = self._steps.get(service, {})
            for name, handler in handlers.items():
                if name in steps:
                    request_cls, step = steps[name]
                    methods.append(native_front.Method(service, name, request_cls=request_cls, step=step))
                elif handler.unary_unary is not None:
                    methods.append(native_front.Method(service, name, call=handler.unary_unary))
        return methods

    def start(self) -> None:
        config = self.config
        listeners = config.listeners()
        creds = server_credentials(config) if any(lu.secure for lu in listeners) else None
        if creds is None and (config.cert_file or config.key_file):
            log.warning("scheme is http/unix while key and cert files are present; ignoring key and cert files")
        use_front = config.grpc_front == "native" and native_front.available()
        if config.grpc_front == "native" and not native_front.available():
            log.warning("pygrpc-native is not installed; serving every listener with grpcio")
        self._executor = futures.ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="grpc")
        server = grpc.server(self._executor, options=grpc_options(config),
                             interceptors=[StatsInterceptor(self.grpc_stats)])
        self._add_services(server)
        endpoints = []
        try:
            # unix:// stays on grpcio too: grpc-go clients send the socket
            # path as :authority, which the front's HTTP/2 layer refuses.
            native = [lu for lu in listeners if use_front and lu.scheme == "http"]
            fallback = None
            if native:
                # The fronts forward streaming calls here: a socket only this
                # process can reach.
                self._fallback_dir = tempfile.mkdtemp(prefix="brain-grpc-")
                fallback = os.path.join(self._fallback_dir, "streams.sock")
                if server.add_insecure_port(f"unix:{fallback}") == 0:
                    raise ListenError(f"listen unix {fallback}: bind failed")
            for lu in listeners:
                if lu in native:
                    endpoints.append(self._bind_front(lu, fallback))
                else:
                    endpoints.append(self._bind(server, lu, creds))
            server.start()
            for f in self._fronts:
                f.start()
        except BaseException:
            server.stop(None)
            for f in self._fronts:
                f.stop(None)
            self._fronts = []
            self._executor.shutdown(wait=False)
            self._remove_fallback_dir()
            raise
        self._server = server
        self.endpoints = endpoints

    def _bind_front(self, lu: ListenURL, fallback_socket: str) -> str:
        """A batching front for ``lu``; its socket is bound here (start()
        only begins accepting), so a taken port fails before serving."""
        f = native_front.NativeFront(
            self.engine, lu.address, self._front_methods(), fallback_socket=fallback_socket,
            recv_limit=self.config.grpc_max_recv_bytes, stats=self.grpc_stats, pool=self._executor,
            keepalive_time_ms=KEEPALIVE_TIME_MS, keepalive_timeout_ms=KEEPALIVE_TIMEOUT_MS)
        try:
            port = f.bind()
        except (OSError, RuntimeError, ValueError) as e:
            log.debug("front bind %s: %s", lu.address, e)
            raise ListenError(f"listen tcp {lu.address}: bind: {_bind_failure_reason(lu)}") from None
        self._fronts.append(f)
        host = lu.address.rpartition(":")[0]
        return f"{lu.scheme}://{host}:{port}"

    def _remove_fallback_dir(self) -> None:
        if self._fallback_dir is not None:
            shutil.rmtree(self._fallback_dir, ignore_errors=True)
            self._fallback_dir = None

    def _bind(self, server: grpc.Server, lu: ListenURL, creds) -> str:
        if lu.is_unix:
            _remove_stale_socket(lu.path)
        try:
            if lu.secure:
                port = server.add_secure_port(lu.address, creds)
            else:
                port = server.add_insecure_port(lu.address)
        except RuntimeError:
            port = 0
        if lu.is_unix:
            if port == 0:
                raise ListenError(f"listen unix {lu.path}: bind: {_bind_failure_reason(lu)}")
            return lu.url
        if port == 0:
            raise ListenError(f"listen tcp {lu.address}: bind: {_bind_failure_reason(lu)}")
        host = lu.address.rpartition(":")[0]
        return f"{lu.scheme}://{host}:{port}"

    def stop(self, grace: float | None = None) -> None:
        """Refuse new calls at once, let running ones finish for up to
        ``grace`` seconds (None: cancel them now), then release threads."""
        server, self._server = self._server, None
        fronts, self._fronts = self._fronts, []
        if server is not None:
            stopping = [threading.Thread(target=f.stop, args=(grace,), daemon=True) for f in fronts]
            for t in stopping:
                t.start()
            stopped = server.stop(grace)
            # Watch streams never finish on their own: end them now so the
            # grace period only waits for unary calls in flight.
            watches = getattr(self.engine, "watches", None)
            if watches is not None:
                watches.close_streams()
            stopped.wait()
            for t in stopping:
                t.join()
        self._remove_fallback_dir()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for lu in self.config.listeners():
            if lu.is_unix:
                try:
                    _remove_stale_socket(lu.path)
                except OSError:
                    pass


def _engine_config(config: ServerConfig):
    from brain.engine import EngineConfig

    kw = dict(
        data_dir=config.data_dir,
        name=config.name,
        max_txn_ops=config.max_txn_ops,
        quota_backend_bytes=config.quota_backend_bytes,
        auto_compaction_mode=config.auto_compaction_mode,
        auto_compaction_retention=config.auto_compaction_retention,
    )
    shards = config.effective_shards()
    if shards is not None:
        kw["shards"] = shards
    if config.shard_boundaries is not None:
        kw["shard_boundaries"] = list(config.shard_boundaries)
    if config.backend is not None:
        kw["backend"] = config.backend
    for field, value in (
        ("checkpoint_interval_seconds", config.checkpoint_interval),
        ("checkpoint_journal_bytes", config.checkpoint_journal_bytes),
        ("checkpoint_memtable_records", config.checkpoint_memtable_records),
        ("segment_bytes", config.journal_segment_bytes),
        ("watch_progress_notify_interval", config.watch_progress_notify_interval),
        ("watch_queue_events", config.watch_queue_events),
    ):
        if value is not None:
            kw[field] = value
    return EngineConfig(**kw)


def _describe_layout(engine_config) -> str:
    from brain.mvcc.shard import default_boundaries

    shards = engine_config.shards
    bounds = engine_config.shard_boundaries
    if bounds is None:
        try:
            bounds = default_boundaries(shards)
        except ValueError:
            bounds = []
    if not bounds:
        return f"{shards} shard"
    return f"{shards} shards split at [{', '.join(format_key(b) for b in bounds)}]"


def run(config: ServerConfig) -> int:
    """`brain serve`: returns the process exit code."""
    from brain import __version__
    from brain.engine import Engine

    try:
        config.validate()
        engine_config = _engine_config(config)
    except (ConfigError, ValueError, TypeError) as e:
        log.error("invalid configuration: %s", e)
        return 2
    try:
        preflight.check_before_data_dir(config)  # listeners and TLS files, then the data dir
    except (preflight.StartupError, ConfigError) as e:
        log.error("%s", e)
        return 1

    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("received %s again, exiting without draining", name)
            os._exit(1)
        log.info("received %s, shutting down", name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            engine = Engine.open(engine_config)
        except Exception as e:  # noqa: BLE001 - reported, then a clean exit code
            # expected refusals (dir locked, layout mismatch, I/O) need no traceback
            from brain.journal import JournalError

            expected = isinstance(e, (OSError, ValueError, RuntimeError, JournalError))
            log.error("cannot open data dir %s: %s", config.data_dir, e, exc_info=not expected)
            return 1
        if stop.is_set():  # told to stop while recovering
            engine.close()
            return 0
        api = ApiServer(engine, config)
        try:
            api.start()
        except (ListenError, ConfigError) as e:
            log.error("%s", e)
            engine.close()
            return 1
        log.info(
            "brain %s serving client requests",
            __version__,
            extra={
                "fields": {
                    "name": config.name,
                    "data-dir": os.path.abspath(config.data_dir),
                    "endpoints": ",".join(api.endpoints),
                    "advertise": ",".join(config.advertise_client_urls) or "-",
                    "layout": _describe_layout(engine_config),
                    "cluster-id": f"{engine.cluster_id:x}",
                    "member-id": f"{engine.member_id:x}",
                    "pid": os.getpid(),
                    "python": sys.version.split()[0],
                }
            },
        )
        metrics = None
        if config.listen_metrics_urls:
            from brain.metrics import MetricsServer

            metrics = MetricsServer(engine, config.listen_metrics_urls, grpc_stats=api.grpc_stats,
                                    cert_file=config.cert_file, key_file=config.key_file)
            try:
                metrics.start()
            except (ConfigError, OSError, ValueError) as e:
                log.error("%s", e)
                api.stop(None)
                engine.close()
                return 1
            log.info("serving metrics and health on %s", ",".join(metrics.endpoints))
        while not stop.wait(1.0):
            pass
        if metrics is not None:
            metrics.stop()
        log.info("stopping gRPC server (grace %.1fs)", config.shutdown_grace)
        api.stop(config.shutdown_grace)
        log.info("closing engine")
        engine.close()
        log.info("stopped")
        return 0
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
