"""The gRPC server: listeners, options, services, graceful shutdown.

``ApiServer`` binds the etcd v3 services of one engine to every
--listen-client-urls entry, on the native transport or grpcio, and drains
in-flight calls when stopped (brain.cli.serve wires it to the engine).

Options mirror etcd's server where clients can tell the difference:

* receive limit = --max-request-bytes + 512 KiB, send limit = MaxInt32.
  The receive limit is enforced here rather than by grpc-core, so that an
  oversized request gets grpc-go's text ("grpc: received message larger
  than max (N vs. M)"), which etcd clients see; grpc-core itself only stops
  messages beyond RECV_HARD_CAP_FACTOR times that limit;
* --max-concurrent-streams, HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS per
  connection, as etcd's (default math.MaxUint32);
* keepalive enforcement as etcd's defaults (--grpc-keepalive-min-time 5s,
  pings without active calls allowed: clientv3 keeps idle connections alive
  with pings, and an unhappy server would answer with GOAWAY
  "too_many_pings");
* SO_REUSEPORT off (unless --socket-reuse-port), so a second server on a
  taken port fails to start instead of silently sharing the port.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from concurrent import futures

import grpc

from brain.api import auth_tokens, encoded, native_front
from brain.api.auth import AuthService
from brain.api.authz import Gate
from brain.api.grpc_stats import GrpcStats, StatsInterceptor
from brain.api.health import HealthService
from brain.api.kv import KVService
from brain.api.lease import LeaseService
from brain.api.maintenance import MaintenanceService
from brain.api.membership import ClusterService
from brain.api.native_listeners import TlsFiles
from brain.api.require_leader import LeaderMonitor, RequireLeaderInterceptor
from brain.api.rpc_table import SERVER_STREAM, UNARY, ServiceTable
from brain.api.unary import call_on_bytes
from brain.api.watch import WatchService
from brain.config import ConfigError, ListenURL, ServerConfig, go_quoted
from brain.metrics import build_registry
from brain.metrics.http import HttpEndpoints

log = logging.getLogger("brain.api.server")

MAX_SEND_BYTES = 2**31 - 1  # etcd: math.MaxInt32
RECV_HARD_CAP_FACTOR = 4  # grpc-core refuses (with its own text) beyond 4x the limit


class ListenError(RuntimeError):
    """A listener could not be bound; the message reads like etcd's."""


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", RECV_HARD_CAP_FACTOR * config.grpc_max_recv_bytes),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.keepalive_time_ms", int(config.grpc_keepalive_interval * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.grpc_keepalive_timeout * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.grpc_keepalive_min_time * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 1 if config.socket_reuse_port else 0),
        # etcd's --max-concurrent-streams (grpc-go's MaxConcurrentStreams); grpcio takes an int
        ("grpc.max_concurrent_streams", min(config.max_concurrent_streams, 2**31 - 1)),
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


def tls_files(config: ServerConfig) -> TlsFiles:
    """The native transport's TLS settings from etcd's flags."""
    return TlsFiles(
        config.cert_file, config.key_file, config.trusted_ca_file or None, config.client_cert_auth,
        cipher_suites=config.rustls_cipher_suites(), min_tls13=config.tls_min_version == "TLS1.3",
        max_tls12=config.tls_max_version == "TLS1.2", allowed_cns=config.client_cert_allowed_cn,
        allowed_hostnames=config.client_cert_allowed_hostname, crl_file=config.client_crl_file or None)


def narrowing_notices(config: ServerConfig, listeners: list[ListenURL]) -> list[str]:
    """Why the client certificate narrowing flags may not do what their
    values suggest (etcd starts silently with each of these)."""
    flags = config.narrowing_flags()
    if not flags:
        return []
    if not any(lu.secure for lu in listeners):
        return [f"scheme is http/unix: ignoring {', '.join(flags)}"]
    out = []
    if not config.client_cert_auth:
        out.append(f"{', '.join(flags)} narrow client certificates, and without --client-cert-auth none is "
                   "asked for: they change nothing")
    for flag, items, empty in (
            ("--client-cert-allowed-cn", config.client_cert_allowed_cn,
             "lets in a certificate without a common name"),
            ("--client-cert-allowed-hostname", config.client_cert_allowed_hostname, "matches no certificate")):
        if "" in items:
            out.append(f"{flag} has an empty entry, which {empty}")
        spaced = [i for i in items if i and i != i.strip()]
        if spaced:
            out.append(f"{flag}: {go_quoted(spaced)} are matched as written, spaces included (as etcd does)")
    return out


def _remove_stale_socket(path: str) -> None:
    """etcd removes a leftover socket file before listening; so do we (only
    sockets: a regular file at that path is left for the bind to fail on)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode):
        os.unlink(path)


def _os_reason(e: OSError) -> str:
    """An OSError as Go prints it: "address already in use"."""
    return (os.strerror(e.errno) if e.errno else str(e)).lower()


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


def _serialize(message) -> bytes:
    """A response's bytes: a protobuf message or an already encoded one
    (brain.api.encoded), which only has this method in common with it."""
    return message.SerializeToString()


def unary_handler(call, request_cls, response_cls, recv_limit: int, has_leader) -> grpc.RpcMethodHandler:
    """A unary handler that receives raw bytes, applies the receive limit
    with grpc-go's wording, parses, refuses a call that requires a leader
    when ``has_leader()`` says there is none, and calls ``call(request, context)``."""
    return grpc.unary_unary_rpc_method_handler(
        call_on_bytes(call, request_cls, recv_limit, has_leader), request_deserializer=None,
        response_serializer=_serialize)


def grpc_handlers(table: ServiceTable, recv_limit: int, has_leader) -> dict[str, grpc.RpcMethodHandler]:
    """grpcio's handlers for one service's table (brain.api.rpc_table)."""
    handlers = {}
    for rpc in table.rpcs:
        if rpc.shape == UNARY:
            handlers[rpc.name] = unary_handler(rpc.call, rpc.request, rpc.response, recv_limit, has_leader)
            continue
        parse = None if rpc.raw_request else rpc.request.FromString
        serialize = None if rpc.response is None else _serialize
        stream = (grpc.unary_stream_rpc_method_handler if rpc.shape == SERVER_STREAM
                  else grpc.stream_stream_rpc_method_handler)
        handlers[rpc.name] = stream(rpc.call, request_deserializer=parse, response_serializer=serialize)
    return handlers


def add_service(server: grpc.Server, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
    server.add_registered_method_handlers(service_name, handlers)


def check_auth_token(config: ServerConfig) -> None:
    """--auth-token names a provider etcd would start with (its key files
    read); ConfigError otherwise."""
    try:
        auth_tokens.check_option(config.auth_token)
    except auth_tokens.TokenOptionError as e:
        raise ConfigError(f"--auth-token {config.auth_token!r}: {e}") from None
    except ImportError as e:
        raise ConfigError(f"--auth-token {config.auth_token!r} needs the cryptography package: {e}") from None


def check_front(config: ServerConfig) -> None:
    """The transport --grpc-front names can be loaded (ConfigError if not):
    a missing native module stops brain instead of silently serving grpcio."""
    if config.grpc_front == "native" and not native_front.available():
        raise ConfigError(native_front.unavailable_message())


class ApiServer:
    """The etcd v3 gRPC services of one engine, on the configured listeners."""

    def __init__(self, engine, config: ServerConfig, replica=None) -> None:
        self.engine = engine
        self.config = config
        self.replica = replica  # a brain.cluster.Replica, or None on a single node
        self.endpoints: list[str] = []  # resolved URLs, after start()
        self.front_kind = ""  # after start(): "native" or "grpcio", whichever serves
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._front: native_front.NativeFront | None = None
        self._tables: list[ServiceTable] = []
        self._watch: WatchService | None = None  # the native front's sessions use these two
        self._lease: LeaseService | None = None
        self.health: HealthService | None = None  # made with the services, in start()
        self.grpc_stats = GrpcStats()  # per-method call counts, for metrics
        # require-leader streams (brain.api.require_leader), on both transports
        self.leader_monitor = LeaderMonitor(lambda: engine.has_leader)
        self._http = None
        self._http_lock = threading.Lock()
        self.gate: Gate | None = None  # who calls (brain.api.authz), made with the services

    def client_urls(self) -> list[str]:
        """What MemberList advertises: --advertise-client-urls, else the
        URLs actually listened on."""
        return list(self.config.advertise_client_urls) or list(self.endpoints)

    def _make_services(self) -> None:
        engine, config = self.engine, self.config
        gate = self.gate = Gate(engine, auth_tokens.token_provider(config.auth_token, engine.tokens),
                                client_cert_auth=config.client_cert_auth)
        kv = KVService(engine, max_request_bytes=config.max_request_bytes, gate=gate)
        self._lease = LeaseService(engine, gate)
        self._watch = WatchService(engine, max_request_bytes=config.max_request_bytes, gate=gate)
        replica = self.replica
        self.health = HealthService(None if replica is None else replica.serving_problem)
        self._tables = [kv.rpc_table(), MaintenanceService(engine, replica, gate).rpc_table(),
                        ClusterService(engine, config.name, self.client_urls, replica, gate).rpc_table(),
                        self._lease.rpc_table(), self._watch.rpc_table(), self.health.rpc_table(),
                        AuthService(engine, gate, config.bcrypt_cost).rpc_table()]

    def _add_services(self, server: grpc.Server) -> None:
        self._make_services()
        recv_limit = self.config.grpc_max_recv_bytes
        has_leader = self.leader_monitor.has_leader
        for table in self._tables:
            add_service(server, table.service, grpc_handlers(table, recv_limit, has_leader))

    def http_endpoints(self):
        """etcd's HTTP endpoints for the client port (made on first use:
        the metrics registry hooks into the engine)."""
        with self._http_lock:
            if self._http is None:
                self._http = HttpEndpoints(self.engine, build_registry(self.engine, self.grpc_stats,
                                                                       self.transport_stats))
            return self._http

    def transport_stats(self) -> dict:
        """The native transport's counters (connections, TLS handshake
        failures by reason; none on grpcio) and the require-leader streams."""
        f = self._front
        st = dict(f.transport_stats() or {}) if f is not None else {}
        st.update(self.leader_monitor.stats())
        return st

    def start(self) -> None:
        config = self.config
        listeners = config.listeners()
        if not any(lu.secure for lu in listeners) and (config.cert_file or config.key_file):
            log.warning("scheme is http/unix while key and cert files are present; ignoring key and cert files")
        for notice in narrowing_notices(config, listeners):
            log.warning("%s", notice)
        check_front(config)
        if config.grpc_front == "native":
            self._start_native(listeners)
        else:
            self._start_grpcio(listeners)
        if getattr(self.engine, "cluster", None) is not None:  # only a replica can lose its leader
            self.leader_monitor.start(self.engine.election_timeout)

    def _start_native(self, listeners: list[ListenURL]) -> None:
        config = self.config
        self._make_services()
        self._executor = futures.ThreadPoolExecutor(max_workers=min(config.grpc_workers, 16),
                                                    thread_name_prefix="brain-pool")
        front = native_front.NativeFront(
            self.engine, native_front.front_methods(self._tables, config.grpc_max_recv_bytes),
            recv_limit=config.grpc_max_recv_bytes, stats=self.grpc_stats, pool=self._executor, http=_LazyHttp(self),
            watch_service=self._watch, lease_service=self._lease, leader_monitor=self.leader_monitor,
            keepalive_time_ms=int(config.grpc_keepalive_interval * 1000),
            keepalive_timeout_ms=int(config.grpc_keepalive_timeout * 1000),
            keepalive_min_time_ms=int(config.grpc_keepalive_min_time * 1000),
            max_concurrent_streams=config.max_concurrent_streams, max_connections=config.max_connections,
            max_connection_bytes=config.max_connection_bytes, gate=self.gate)
        endpoints = []
        try:
            tls = None
            if any(lu.secure for lu in listeners):
                try:
                    tls = tls_files(config)
                    native_front.check_tls(tls)  # load the files once: errors surface here
                except ValueError as e:
                    raise ConfigError(f"TLS: {e}") from None
            for lu in listeners:
                endpoints.append(self._bind_native(front, lu, tls if lu.secure else None))
            front.start()
        except BaseException:
            front.stop(None)
            self._executor.shutdown(wait=False)
            raise
        self._front = front
        self.endpoints = endpoints
        self.front_kind = "native"

    def _bind_native(self, front: native_front.NativeFront, lu: ListenURL, tls) -> str:
        if lu.is_unix:
            _remove_stale_socket(lu.path)
            try:
                front.listen_unix(lu.path, tls)
            except OSError as e:
                raise ListenError(f"listen unix {lu.path}: bind: {_os_reason(e)}") from None
            return lu.url
        host, _, port = lu.address.rpartition(":")
        try:
            bound = front.listen_tcp(host.strip("[]"), int(port), tls, reuse_port=self.config.socket_reuse_port)
        except OSError as e:
            raise ListenError(f"listen tcp {lu.address}: bind: {_os_reason(e)}") from None
        return f"{lu.scheme}://{host}:{bound}"

    def _start_grpcio(self, listeners: list[ListenURL]) -> None:
        config = self.config
        notice = encoded.fallback_notice()  # grpcio may run without the native module
        if notice:
            log.warning("%s", notice)
        creds = server_credentials(config) if any(lu.secure for lu in listeners) else None
        self._executor = futures.ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="grpc")
        server = grpc.server(self._executor, options=grpc_options(config),
                             interceptors=[StatsInterceptor(self.grpc_stats),
                                           RequireLeaderInterceptor(self.leader_monitor)])
        self._add_services(server)
        endpoints = []
        try:
            for lu in listeners:
                endpoints.append(self._bind(server, lu, creds))
            server.start()
        except BaseException:
            server.stop(None)
            self._executor.shutdown(wait=False)
            raise
        self._server = server
        self.endpoints = endpoints
        self.front_kind = "grpcio"

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
        front, self._front = self._front, None
        health = self.health
        self.leader_monitor.stop()
        if health is not None:
            health.shutdown()  # open health watchers hear NOT_SERVING first
        if front is not None:
            front.stop(grace)
        if server is not None:
            stopped = server.stop(grace)
            # Watch streams never finish on their own: end them now so the
            # grace period only waits for unary calls in flight.
            watches = getattr(self.engine, "watches", None)
            if watches is not None:
                watches.close_streams()
            if health is not None:
                health.end_streams()
            stopped.wait()
        if health is not None:
            health.close()
        if self._http is not None:
            self._http.registry.detach()
            self._http = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for lu in self.config.listeners():
            if lu.is_unix:
                try:
                    _remove_stale_socket(lu.path)
                except OSError:
                    pass


class _LazyHttp:
    """The client port's HTTP endpoints, built on the first request."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def answer(self, method: str, target: str):
        return self.api.http_endpoints().answer(method, target)
