"""Server configuration: one dataclass holding what `brain serve` was told,
plus the parsers for the flag values that need more than a type cast.

Flag names and defaults follow etcd's (see brain.cli); everything here is
plain Python so tests and embedding code can build a ServerConfig directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from brain import go_duration
from brain.engine import compactor
from brain.engine.limits import DEFAULT_MAX_LEASES
from brain.mvcc.shard_map import layout_problem
from brain.mvcc.validation import DEFAULT_MAX_TXN_OPS
from brain.mvcc.watch import DEFAULT_MAX_WATCHERS_PER_STREAM

DEFAULT_NAME = "default"
DEFAULT_LISTEN_CLIENT_URLS = ("http://localhost:2379",)
DEFAULT_MAX_REQUEST_BYTES = 1572864  # 1.5 MiB
DEFAULT_QUOTA_BACKEND_BYTES = 2 * 1024 * 1024 * 1024  # 2 GiB
GRPC_RECV_OVERHEAD = 512 * 1024  # etcd: gRPC receive limit = max-request-bytes + 512 KiB
# etcd's --max-concurrent-streams: HTTP/2 streams one connection may have
# open at once (SETTINGS_MAX_CONCURRENT_STREAMS); etcd's default, math.MaxUint32
MAX_UINT32 = 2**32 - 1
DEFAULT_MAX_CONCURRENT_STREAMS = MAX_UINT32
# brain's own bounds on what clients can make the server hold (docs/architecture.md, "Bounds"):
# client connections open at once, and bytes one connection may make the server
# hold on each side (requests received and not yet answered; answers queued on
# its streams and not yet written)
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_MAX_CONNECTION_BYTES = 16 << 20
# Each open Watch or LeaseKeepAlive stream holds one grpcio thread for its
# whole life, so this bounds the streams served at once (etcd has no such
# bound).  Threads start only when needed; an idle stream's costs little.
DEFAULT_GRPC_WORKERS = 4096
DEFAULT_SHUTDOWN_GRACE = 5.0

LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("text", "json")
GRPC_FRONTS = ("native", "grpcio")
TLS_VERSIONS = ("", "TLS1.2", "TLS1.3")
DEFAULT_GRPC_KEEPALIVE_MIN_TIME = 5.0  # etcd --grpc-keepalive-min-time
DEFAULT_GRPC_KEEPALIVE_INTERVAL = 7200.0  # etcd --grpc-keepalive-interval (2h)
DEFAULT_GRPC_KEEPALIVE_TIMEOUT = 20.0  # etcd --grpc-keepalive-timeout

# etcd's --cipher-suites take Go's names.  The native transport (rustls)
# implements the AEAD ECDHE suites of TLS 1.2; TLS 1.3 suites are always on
# and not configurable (as in Go, which ignores them in this list).  Go
# names it knows but does not implement (CBC, RC4, 3DES, RSA key exchange)
# are refused with a clear message.
_TLS12_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
_GO_UNSUPPORTED_SUITES = (
    "TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA", "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA", "TLS_RSA_WITH_AES_128_CBC_SHA256", "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
)
COMPACTION_MODES = ("periodic", "revision")


class ConfigError(ValueError):
    """A flag value that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class ListenURL:
    """One parsed --listen-client-urls entry.

    ``address`` is what grpc's add_*_port takes: ``host:port`` for http(s),
    ``unix:path`` for unix(s).  ``path`` is the socket path for unix URLs.
    """

    url: str
    scheme: str  # http, https, unix, unixs
    address: str
    path: str | None = None

    @property
    def secure(self) -> bool:
        return self.scheme in ("https", "unixs")

    @property
    def is_unix(self) -> bool:
        return self.scheme in ("unix", "unixs")


@dataclass
class ServerConfig:
    name: str = DEFAULT_NAME
    data_dir: str = ""  # empty: "<name>.brain"
    listen_client_urls: list[str] = field(default_factory=lambda: list(DEFAULT_LISTEN_CLIENT_URLS))
    advertise_client_urls: list[str] = field(default_factory=list)
    listen_metrics_urls: list[str] = field(default_factory=list)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS
    # brain's own limits (the native front enforces the connection ones)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connection_bytes: int = DEFAULT_MAX_CONNECTION_BYTES
    max_watchers_per_stream: int = DEFAULT_MAX_WATCHERS_PER_STREAM
    max_leases: int = DEFAULT_MAX_LEASES
    quota_backend_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES
    auto_compaction_mode: str = "periodic"
    auto_compaction_retention: str = "0"
    shards: int | None = None  # None: the engine's default
    shard_boundaries: list[bytes] | None = None
    backend: str | None = None  # None: the engine's default
    cert_file: str = ""
    key_file: str = ""
    trusted_ca_file: str = ""
    client_cert_auth: bool = False
    cipher_suites: list[str] = field(default_factory=list)  # Go names, as etcd's --cipher-suites
    tls_min_version: str = ""  # "", TLS1.2 or TLS1.3 (etcd's --tls-min-version; "" = TLS1.2)
    tls_max_version: str = ""  # "" = the highest
    # Who may connect with a client certificate (etcd's narrowing; the
    # native transport checks them: native/src/narrowing.rs).  Lists as
    # etcd's flags split them: on every comma, nothing trimmed.
    client_cert_allowed_cn: list[str] = field(default_factory=list)
    client_cert_allowed_hostname: list[str] = field(default_factory=list)
    client_crl_file: str = ""  # a DER CRL, as etcd reads it
    grpc_keepalive_min_time: float = DEFAULT_GRPC_KEEPALIVE_MIN_TIME  # seconds
    grpc_keepalive_interval: float = DEFAULT_GRPC_KEEPALIVE_INTERVAL
    grpc_keepalive_timeout: float = DEFAULT_GRPC_KEEPALIVE_TIMEOUT
    log_level: str = "info"
    log_format: str = "text"
    grpc_workers: int = DEFAULT_GRPC_WORKERS
    # "native": every listener is served by brain's own transport
    # (brain._transport through brain.api.native_front); "grpcio": grpcio only.
    grpc_front: str = "native"
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    # engine tuning (brain-only flags); None leaves the engine's default
    checkpoint_interval: float | None = None  # seconds
    checkpoint_journal_bytes: int | None = None
    checkpoint_memtable_records: int | None = None
    journal_segment_bytes: int | None = None
    watch_progress_notify_interval: float | None = None  # seconds (etcd's flag; default 10 min)
    watch_queue_events: int | None = None  # undelivered events per watch stream before catch-up mode
    # etcd's --socket-reuse-port: SO_REUSEPORT on client listeners (replicas
    # of one cluster on one machine share a port; the kernel spreads clients)
    socket_reuse_port: bool = False
    # cluster replica (brain.cluster): the shared journal and the election's timings
    journal_url: str = ""
    election_timeout: int = 500  # ms
    heartbeat_interval: int = 100  # ms
    journal_replicas: int = 0  # 0: by the NATS cluster's size
    # the leader reads alone within its election lease (docs/cluster.md,
    # "The read lease"); off by default: reads confirmed by the journal's
    # quorum rest on no clock, as etcd's ReadIndex
    read_lease: bool = False
    # auth (etcd's flags): the token provider ("simple", or "jwt,pub-key=...,
    # priv-key=...,sign-method=..."), a simple token's life unused, the
    # bcrypt cost of password hashes
    auth_token: str = "simple"
    auth_token_ttl: int = 300  # seconds
    bcrypt_cost: int = 10

    def __post_init__(self) -> None:
        if not self.data_dir:
            self.data_dir = f"{self.name}.brain"
        if self.quota_backend_bytes == 0:
            self.quota_backend_bytes = DEFAULT_QUOTA_BACKEND_BYTES

    @property
    def grpc_max_recv_bytes(self) -> int:
        return self.max_request_bytes + GRPC_RECV_OVERHEAD

    def rustls_cipher_suites(self) -> list[str]:
        """--cipher-suites as the native transport names them (TLS 1.2
        suites only; TLS 1.3 names are accepted and change nothing)."""
        return [_TLS12_SUITES[n] for n in self.cipher_suites if n in _TLS12_SUITES]

    def listeners(self) -> list[ListenURL]:
        return [parse_listen_url(u) for u in self.listen_client_urls]

    def validate(self) -> None:
        """Raise ConfigError for values that cannot work (checked at startup)."""
        if not self.name:
            raise ConfigError("--name must not be empty")
        if not self.listen_client_urls:
            raise ConfigError("--listen-client-urls must name at least one URL")
        listeners = self.listeners()
        if any(lu.secure for lu in listeners) and not (self.cert_file and self.key_file):
            bad = next(lu.url for lu in listeners if lu.secure)
            raise ConfigError(
                f"TLS key/cert (--cert-file, --key-file) must be provided for client url {bad} with HTTPS scheme"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("--cert-file and --key-file must be given together")
        for name in self.cipher_suites:
            if name in _GO_UNSUPPORTED_SUITES:
                raise ConfigError(f"--cipher-suites: {name} is not supported by brain's TLS "
                                  "(use ECDHE suites with AES-GCM or ChaCha20-Poly1305)")
            if name not in _TLS12_SUITES and name not in _TLS13_SUITES:
                raise ConfigError(f'unexpected TLS cipher suite "{name}"')
        for flag, v in (("--tls-min-version", self.tls_min_version), ("--tls-max-version", self.tls_max_version)):
            if v not in TLS_VERSIONS:
                raise ConfigError(f'{flag}: unknown TLS version "{v}" (use TLS1.2 or TLS1.3)')
        if self.tls_min_version == "TLS1.3" and self.tls_max_version == "TLS1.2":
            raise ConfigError("--tls-min-version is greater than --tls-max-version")
        if self.cipher_suites and self.tls_min_version == "TLS1.3":
            raise ConfigError("cipher suites cannot be configured when only TLS1.3 is enabled")
        for flag, v in (("--grpc-keepalive-min-time", self.grpc_keepalive_min_time),
                        ("--grpc-keepalive-interval", self.grpc_keepalive_interval),
                        ("--grpc-keepalive-timeout", self.grpc_keepalive_timeout)):
            if v <= 0:
                raise ConfigError(f"{flag} must be positive, got {v}")
        if self.client_cert_auth and not self.trusted_ca_file:
            raise ConfigError("--client-cert-auth requires --trusted-ca-file")
        self._validate_narrowing()
        if self.max_request_bytes <= 0:
            raise ConfigError(f"--max-request-bytes must be positive, got {self.max_request_bytes}")
        if self.max_txn_ops <= 0:
            raise ConfigError(f"--max-txn-ops must be positive, got {self.max_txn_ops}")
        if not 0 < self.max_concurrent_streams <= MAX_UINT32:
            raise ConfigError(f"--max-concurrent-streams must be between 1 and {MAX_UINT32}, "
                              f"got {self.max_concurrent_streams}")
        for flag, v in (("--max-connections", self.max_connections),
                        ("--max-watchers-per-stream", self.max_watchers_per_stream),
                        ("--max-leases", self.max_leases)):
            if v <= 0:
                raise ConfigError(f"{flag} must be positive, got {v}")
        if self.max_connection_bytes < self.grpc_max_recv_bytes:
            # a request at the receive limit must fit in one connection's budget
            raise ConfigError(f"--max-connection-bytes must be at least --max-request-bytes + 512 KiB "
                              f"({self.grpc_max_recv_bytes}), got {self.max_connection_bytes}")
        if self.auto_compaction_mode not in COMPACTION_MODES:
            raise ConfigError(
                f"unknown auto-compaction-mode {self.auto_compaction_mode!r} (use 'periodic' or 'revision')"
            )
        parse_retention(self.auto_compaction_mode, self.auto_compaction_retention)
        if self.shards is not None and self.shards < 1:
            raise ConfigError(f"--shards must be at least 1, got {self.shards}")
        if self.shard_boundaries is not None:
            problem = layout_problem(self.shards, self.shard_boundaries)
            if problem is not None:
                raise ConfigError(problem)
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.grpc_workers < 1:
            raise ConfigError(f"--grpc-workers must be at least 1, got {self.grpc_workers}")
        if self.grpc_front not in GRPC_FRONTS:
            raise ConfigError(f"--grpc-front must be one of {', '.join(GRPC_FRONTS)}, got {self.grpc_front!r}")
        if self.shutdown_grace < 0:
            raise ConfigError(f"--shutdown-grace must not be negative, got {self.shutdown_grace}")
        if self.journal_url:
            from brain.journal.natsio import parse_journal_url

            try:
                parse_journal_url(self.journal_url)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if self.election_timeout < 200:
            raise ConfigError(f"--election-timeout must be at least 200 ms, got {self.election_timeout}")
        if not 0 < self.heartbeat_interval * 2 <= self.election_timeout:
            raise ConfigError(f"--heartbeat-interval must be positive and at most half of --election-timeout, "
                              f"got {self.heartbeat_interval}")
        if self.journal_replicas not in (0, 1, 3, 5):
            raise ConfigError(f"--journal-replicas must be 0 (automatic), 1, 3 or 5, got {self.journal_replicas}")
        for flag, v in (
            ("--checkpoint-interval", self.checkpoint_interval),
            ("--checkpoint-journal-bytes", self.checkpoint_journal_bytes),
            ("--checkpoint-memtable-records", self.checkpoint_memtable_records),
            ("--journal-segment-bytes", self.journal_segment_bytes),
            ("--watch-progress-notify-interval", self.watch_progress_notify_interval),
            ("--watch-queue-events", self.watch_queue_events),
        ):
            if v is not None and v <= 0:
                raise ConfigError(f"{flag} must be positive, got {v}")

    def narrowing_flags(self) -> list[str]:
        """The client certificate narrowing flags that are set."""
        return [flag for flag, v in (("--client-cert-allowed-cn", self.client_cert_allowed_cn),
                                     ("--client-cert-allowed-hostname", self.client_cert_allowed_hostname),
                                     ("--client-crl-file", self.client_crl_file)) if v]

    def _validate_narrowing(self) -> None:
        cns, hosts = self.client_cert_allowed_cn, self.client_cert_allowed_hostname
        if cns and hosts:
            # etcd's TLSInfo refuses the pair in these words (and exits)
            raise ConfigError(f"--client-cert-allowed-cn and --client-cert-allowed-hostname are mutually exclusive "
                              f"(cns={go_quoted(cns)}, hostnames={go_quoted(hosts)})")
        flags = self.narrowing_flags()
        if flags and self.grpc_front != "native":
            raise ConfigError(f"{flags[0]} needs --grpc-front native: grpcio's TLS cannot narrow client "
                              "certificates, and brain does not serve without the narrowing it was given")

    def effective_shards(self) -> int | None:
        if self.shards is not None:
            return self.shards
        if self.shard_boundaries is not None:
            return len(self.shard_boundaries) + 1
        return None


# ---------------------------------------------------------------------------
# value parsers
# ---------------------------------------------------------------------------


def parse_listen_url(url: str) -> ListenURL:
    """Parse one client URL the way etcd accepts them.

    http://host:port and https://host:port listen on TCP ("localhost" means
    127.0.0.1, as etcd resolves it); unix://path and unixs://path listen on
    a Unix socket at ``path`` (relative paths are relative to the working
    directory, like etcd).
    """
    raw = url.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise ConfigError(f"URL scheme must be http, https, unix, or unixs: {url}")
    scheme = scheme.lower()
    if scheme in ("unix", "unixs"):
        if not rest:
            raise ConfigError(f"unix socket URL without a path: {url}")
        return ListenURL(raw, scheme, "unix:" + rest, rest)
    if scheme not in ("http", "https"):
        raise ConfigError(f"URL scheme must be http, https, unix, or unixs: {url}")
    parts = urlsplit(raw)
    if parts.path not in ("", "/"):
        raise ConfigError(f'expected URL without path but got "{url}"')
    try:
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"invalid port in URL {url}: {e}") from None
    if port is None:
        raise ConfigError(f"URL address does not have the form \"host:port\": {url}")
    host = parts.hostname or ""
    if host == "localhost":
        host = "127.0.0.1"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return ListenURL(raw, scheme, f"{host}:{port}")


def split_urls(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


def split_list(text: str) -> list[str]:
    """A comma-separated list as etcd's flags.StringsValue splits it: on
    every comma, nothing trimmed or dropped (an empty entry stays)."""
    return text.split(",")


def go_quoted(items: list[str]) -> str:
    """A list of strings as Go's ``%q`` prints a []string: ["a" "b"]."""
    return "[" + " ".join(json.dumps(i, ensure_ascii=False) for i in items) + "]"


_ESCAPES = {"\\": "\\", ",": ",", "n": "\n", "t": "\t", "r": "\r", "0": "\0"}


def parse_shard_boundaries(text: str) -> list[bytes]:
    """Split ``k1,k2,...`` into keys (UTF-8).

    A backslash escapes the next character: ``\\,`` is a comma inside a key,
    ``\\\\`` a backslash, ``\\n \\t \\r \\0`` the usual control characters and
    ``\\xHH`` any byte.
    """
    keys: list[bytes] = []
    cur = bytearray()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                raise ConfigError("--shard-boundaries: dangling backslash at the end")
            e = text[i + 1]
            if e == "x":
                hexdigits = text[i + 2 : i + 4]
                if len(hexdigits) != 2 or not re.fullmatch(r"[0-9a-fA-F]{2}", hexdigits):
                    raise ConfigError(f"--shard-boundaries: bad \\x escape at offset {i}")
                cur.append(int(hexdigits, 16))
                i += 4
                continue
            if e not in _ESCAPES:
                raise ConfigError(f"--shard-boundaries: unknown escape \\{e} at offset {i}")
            cur += _ESCAPES[e].encode()
            i += 2
            continue
        if c == ",":
            keys.append(bytes(cur))
            cur.clear()
        else:
            cur += c.encode()
        i += 1
    keys.append(bytes(cur))
    return keys


def format_key(key: bytes) -> str:
    """A key for log lines: text when printable, else escaped."""
    try:
        s = key.decode("utf-8")
        if s.isprintable():
            return s
    except UnicodeDecodeError:
        pass
    return repr(key)[2:-1]


def parse_seconds(text: str) -> float:
    """A Go duration ("700ms", "1m") or a bare number of seconds."""
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        return go_duration.seconds(t)


def parse_retention(mode: str, text: str) -> float | int:
    """etcd's --auto-compaction-retention for ``mode``, as the engine's
    compactor parses it (brain.engine.compactor.parse_retention).

    periodic: seconds to keep; a bare integer counts hours ("1" = 1h), else a
    Go duration ("5m", "1h30m").  revision: the number of revisions to keep.
    0 turns auto compaction off in both modes.
    """
    try:
        return compactor.parse_retention(mode, text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "t", "true", "yes", "on"):
        return True
    if t in ("0", "f", "false", "no", "off", ""):
        return False
    raise ValueError(f"invalid boolean {text!r}")
