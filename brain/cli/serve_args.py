"""`brain [serve] [flags]`: the serve flags, with etcd's names, parsed into a ServerConfig.

`brain` without a subcommand serves, like `etcd`.  Every serve flag can also
come from the environment as ETCD_<FLAG> (etcd's convention, e.g.
ETCD_DATA_DIR, ETCD_LISTEN_CLIENT_URLS) or BRAIN_<FLAG>, which wins over
ETCD_<FLAG>; a flag on the command line wins over both.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Sequence

from brain import __version__
from brain import config as C
from brain.cli.flags import boundaries_type, seconds_type
from brain.engine.config import EngineConfig
from brain.etcd_version import ETCD_API_VERSION
from brain.mvcc.shard_map import DEFAULT_SHARDS

SERVE_DESCRIPTION = "Serve the etcd v3 gRPC API on the client URLs."
SUBCOMMANDS = ("serve",)


def _version_text() -> str:
    return (
        f"brain Version: {__version__}\n"
        f"API version: {ETCD_API_VERSION}\n"
        f"Python Version: {platform.python_version()}\n"
        f"OS/Arch: {sys.platform}/{platform.machine()}"
    )


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version_text())
        parser.exit()


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


def _bool(text: str) -> bool:
    try:
        return C.parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# The engine tuning flags' defaults are the engine's own (ServerConfig leaves them None).
_ENGINE = EngineConfig(data_dir="")

# (flag, dest, type, help); bool flags take an optional value (--client-cert-auth[=true|false]).
_SERVE_FLAGS: list[tuple[str, str, object, str]] = [
    ("--name", "name", str, "human-readable name for this member (default %(default)s)"),
    ("--data-dir", "data_dir", str, "path to the data directory (default <name>.brain)"),
    ("--listen-client-urls", "listen_client_urls", C.split_urls,
     "comma-separated URLs to serve clients on: http://host:port, https://host:port, "
     "unix://path, unixs://path (default http://localhost:2379, which binds 127.0.0.1:2379 like etcd)"),
    ("--advertise-client-urls", "advertise_client_urls", C.split_urls,
     "comma-separated client URLs to advertise (informational for a single member)"),
    ("--listen-metrics-urls", "listen_metrics_urls", C.split_urls,
     "comma-separated http(s)://host:port URLs serving /metrics, /health, /livez and /readyz"),
    ("--max-request-bytes", "max_request_bytes", _int,
     "largest client write request in bytes (default %(default)s)"),
    ("--max-txn-ops", "max_txn_ops", _int, "most operations in one txn branch (default %(default)s)"),
    ("--max-concurrent-streams", "max_concurrent_streams", _int,
     "maximum concurrent streams that each client can open at a time (default math.MaxUint32)"),
    ("--max-connections", "max_connections", _int,
     "client connections open at once; a connection beyond is closed as soon as it is accepted "
     "(native front; default %(default)s)"),
    ("--max-connection-bytes", "max_connection_bytes", _int,
     "bytes one client connection may make the server hold, on each side: requests received and not yet "
     "answered (then it reads no more from the connection), answers queued on its streams and not yet "
     "written (then its streams pause) (native front; default %(default)s, 16 MiB)"),
    ("--max-watchers-per-stream", "max_watchers_per_stream", _int,
     "watchers one watch stream may have; a create beyond is canceled with 'mvcc: too many watchers on "
     "the WatchStream' (default %(default)s)"),
    ("--max-leases", "max_leases", _int,
     "leases at once; a grant beyond is refused with 'etcdserver: too many leases' (default %(default)s)"),
    ("--quota-backend-bytes", "quota_backend_bytes", _int,
     "backend size quota in bytes; 0 means the default 2 GiB, negative disables the quota"),
    ("--auto-compaction-mode", "auto_compaction_mode", str,
     "periodic or revision (default %(default)s)"),
    ("--auto-compaction-retention", "auto_compaction_retention", str,
     "history to keep: periodic '1h', '5m' or a number of hours; revision: a number of revisions; "
     "'0' disables auto compaction (default %(default)s)"),
    ("--shards", "shards", _int,
     f"number of keyspace shards (default {DEFAULT_SHARDS}, or one more than --shard-boundaries gives)"),
    ("--shard-boundaries", "shard_boundaries", boundaries_type,
     "comma-separated first keys of shards 2..N; backslash escapes \\, \\\\ \\xHH"),
    ("--backend", "backend", str, "value store: lmdb (the default) or memory (for tests: values are not "
     "durable)"),
    ("--cert-file", "cert_file", str, "client server TLS certificate file"),
    ("--key-file", "key_file", str, "client server TLS key file"),
    ("--trusted-ca-file", "trusted_ca_file", str, "client server TLS trusted CA certificate file"),
    ("--client-cert-auth", "client_cert_auth", _bool, "require client certificates signed by the trusted CA"),
    ("--client-cert-allowed-cn", "client_cert_allowed_cn", C.split_list,
     "comma-separated list of allowed CNs for client cert authentication (etcd takes these in its config "
     "file only, as client-transport-security's allowed-cn)"),
    ("--client-cert-allowed-hostname", "client_cert_allowed_hostname", C.split_list,
     "comma-separated list of allowed SAN hostnames for client cert authentication"),
    ("--client-crl-file", "client_crl_file", str, "path to the client certificate revocation list file (DER)"),
    ("--auth-token", "auth_token", str,
     "auth tokens: simple, or jwt,pub-key=<file>,priv-key=<file>,sign-method=<RS256|ES256|EdDSA|HS256|...>"
     "[,ttl=<duration>] (default %(default)s)"),
    ("--auth-token-ttl", "auth_token_ttl", _int, "seconds a simple token lives unused (default %(default)s)"),
    ("--bcrypt-cost", "bcrypt_cost", _int, "bcrypt cost of hashed passwords, 4 to 31 (default %(default)s)"),
    ("--cipher-suites", "cipher_suites", C.split_urls,
     "comma-separated TLS 1.2 cipher suites, Go's names (default: rustls' AEAD ECDHE suites)"),
    ("--tls-min-version", "tls_min_version", str, "minimum TLS version: TLS1.2 or TLS1.3 (default TLS1.2)"),
    ("--tls-max-version", "tls_max_version", str, "maximum TLS version: TLS1.2 or TLS1.3 (default: the highest)"),
    ("--grpc-keepalive-min-time", "grpc_keepalive_min_time", seconds_type,
     "minimum interval a client should wait before pinging the server (default 5s)"),
    ("--grpc-keepalive-interval", "grpc_keepalive_interval", seconds_type,
     "how often the server pings an idle connection (default 2h)"),
    ("--grpc-keepalive-timeout", "grpc_keepalive_timeout", seconds_type,
     "how long the server waits for a ping's answer before closing the connection (default 20s)"),
    ("--log-level", "log_level", str, "debug, info, warn or error (default %(default)s)"),
    ("--log-format", "log_format", str, "text or json (default %(default)s)"),
    ("--grpc-workers", "grpc_workers", _int,
     "grpcio front: handler threads, one per open Watch or LeaseKeepAlive stream; native front: at most 16 "
     "serve the rare calls, Snapshot and HTTP requests (default %(default)s)"),
    ("--grpc-front", "grpc_front", str,
     "native: serve every listener (http, https, unix, unixs: gRPC and etcd's HTTP endpoints) with "
     "brain's own transport; grpcio: grpcio for gRPC, no HTTP endpoints on the client port "
     "(default %(default)s)"),
    ("--shutdown-grace", "shutdown_grace", _float,
     "seconds to let running calls finish on SIGTERM/SIGINT (default %(default)s)"),
    ("--checkpoint-interval", "checkpoint_interval", seconds_type,
     f"engine tuning: start a checkpoint at least this often ('60s', '700ms' or seconds; default "
     f"{_ENGINE.checkpoint_interval_seconds:g}s)"),
    ("--checkpoint-journal-bytes", "checkpoint_journal_bytes", _int,
     f"engine tuning: start a checkpoint after this many journal bytes (default "
     f"{_ENGINE.checkpoint_journal_bytes}, {_ENGINE.checkpoint_journal_bytes >> 20} MiB)"),
    ("--checkpoint-memtable-records", "checkpoint_memtable_records", _int,
     f"engine tuning: start a checkpoint when the memtable holds this many records (default "
     f"{_ENGINE.checkpoint_memtable_records})"),
    ("--journal-segment-bytes", "journal_segment_bytes", _int,
     f"engine tuning: roll journal segments over at this size in bytes (default {_ENGINE.segment_bytes}, "
     f"{_ENGINE.segment_bytes >> 20} MiB)"),
    ("--watch-progress-notify-interval", "watch_progress_notify_interval", seconds_type,
     "interval between watch progress notifications ('10m', '300ms' or seconds; default 10m)"),
    ("--watch-queue-events", "watch_queue_events", _int,
     "undelivered events per watch stream before its watchers fall back to catch-up reads (a stream "
     "whose client does not read falls back at once) (default 20000)"),
    ("--socket-reuse-port", "socket_reuse_port", _bool,
     "set SO_REUSEPORT on client listeners: several servers (replicas of one cluster) may share a port "
     "and the kernel spreads connections over them"),
    ("--journal-url", "journal_url", str,
     "run as a replica of a brain cluster whose journal is a NATS JetStream stream: "
     "nats://host:4222[,host:4222...][/cluster-name] (default: a local journal in the data dir)"),
    ("--election-timeout", "election_timeout", _int,
     "cluster: milliseconds without a leader heartbeat before another replica takes the lead "
     "(default %(default)s)"),
    ("--heartbeat-interval", "heartbeat_interval", _int,
     "cluster: milliseconds between the leader's heartbeats (default %(default)s)"),
    ("--read-lease", "read_lease", _bool,
     "cluster: every linearizable read is confirmed by a barrier record the journal's quorum "
     "acknowledged, as etcd's ReadIndex, resting on no clock (false, the default); true: the leader "
     "answers them without a journal round trip while its hold on the election key lasts, which rests "
     "on clock rates and breaks where a hypervisor pauses the VM (docs/cluster.md, \"The read lease\") "
     "(default %(default)s)"),
    ("--journal-replicas", "journal_replicas", _int,
     "cluster: JetStream replicas of a journal this replica creates; 0 means 3 when the NATS cluster "
     "has 3 servers or more, else 1 (default %(default)s)"),
]
_BOOL_DESTS = {"client_cert_auth", "socket_reuse_port", "read_lease"}


def flag_names() -> list[str]:
    """Every `brain serve` flag's name without its dashes: `brain groups`
    refuses a layout key that is none of them before it starts anything."""
    return [flag[2:] for flag, _dest, _typ, _help in _SERVE_FLAGS]


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    defaults = C.ServerConfig()
    for flag, dest, typ, help_ in _SERVE_FLAGS:
        default = getattr(defaults, dest)
        if dest == "data_dir":
            default = None  # derived from --name
        elif dest == "listen_client_urls":
            default = list(C.DEFAULT_LISTEN_CLIENT_URLS)
        if dest in _BOOL_DESTS:
            p.add_argument(flag, dest=dest, type=typ, nargs="?", const=True, default=default, help=help_)
        else:
            p.add_argument(flag, dest=dest, type=typ, default=default, help=help_)
    p.add_argument("--version", action=_Version, help="print the version and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brain",
        description="A Kubernetes storage backend speaking the etcd v3 API.",
        epilog="Without a subcommand, brain serves (flags as for `brain serve`).",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the etcd v3 API (the default)", allow_abbrev=False,
                           description=SERVE_DESCRIPTION)
    _add_serve_flags(serve)
    sub.add_parser("snapshot", help="save, restore and inspect snapshots (brain snapshot -h)", add_help=False)
    sub.add_parser("import", help="import an etcd data directory or snapshot, history included (brain import -h)",
                   add_help=False)
    sub.add_parser("mirror", help="copy a running etcd, revisions kept, and follow it (brain mirror -h)",
                   add_help=False)
    sub.add_parser("groups", help="run brain as several groups, each owning some Kubernetes resources, and "
                                  "print kube-apiserver's flags for them (brain groups -h)", add_help=False)
    return parser


def build_serve_parser() -> argparse.ArgumentParser:
    """`brain serve` on its own, so that a flag it does not know is reported
    with its usage (through the top-level parser argparse would print
    `brain [-h] [--version] COMMAND` instead)."""
    parser = argparse.ArgumentParser(prog="brain serve", allow_abbrev=False, description=SERVE_DESCRIPTION)
    _add_serve_flags(parser)
    return parser


def _env_value(dest: str, environ) -> tuple[str, str] | None:
    """(variable, value) of the variable that sets ``dest``, BRAIN_ before ETCD_."""
    name = dest.upper()
    for prefix in ("BRAIN_", "ETCD_"):
        v = environ.get(prefix + name)
        if v is not None:
            return prefix + name, v
    return None


def _apply_env(serve_args: list[str], environ, parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, str]]:
    """Turn BRAIN_*/ETCD_* variables into flags placed before the command
    line's, so that explicit flags (parsed later) win.  Returns them and,
    per flag, the variable that set it.  A value its flag would refuse is
    reported here, naming the variable: argparse would name the flag alone,
    and the user who never typed it would look for it on the command line."""
    given = set()
    for a in serve_args:
        if a.startswith("--"):
            given.add(a[2:].split("=", 1)[0])
    extra: list[str] = []
    sources: dict[str, str] = {}
    for flag, dest, typ, _help in _SERVE_FLAGS:
        if flag[2:] in given:
            continue
        found = _env_value(dest, environ)
        if found is None:
            continue
        var, v = found
        try:
            typ(v)
        except (argparse.ArgumentTypeError, ValueError) as e:
            parser.error(f"invalid value {v!r} for {var} (the environment variable for {flag}): {e}")
        extra.append(f"{flag}={v}")
        sources[flag] = f"{var}={v}"
    return extra, sources


def config_from_args(ns: argparse.Namespace) -> C.ServerConfig:
    kw = {dest: getattr(ns, dest) for _f, dest, _t, _h in _SERVE_FLAGS}
    if kw["data_dir"] is None:
        kw["data_dir"] = ""
    return C.ServerConfig(**kw)


def parse_serve(argv: Sequence[str], environ=None) -> C.ServerConfig:
    """Parse ``brain [serve] ...`` into a ServerConfig (exits on bad flags)."""
    environ = os.environ if environ is None else environ
    args = list(argv)
    if args and args[0] in ("-h", "--help"):
        build_parser().parse_args(args)  # the top-level help; exits
    if args and args[0] in SUBCOMMANDS:
        args = args[1:]
    parser = build_serve_parser()
    from_env, sources = _apply_env(args, environ, parser)
    ns = parser.parse_args([*from_env, *args])
    cfg = config_from_args(ns)
    try:
        cfg.validate()
    except C.ConfigError as e:
        message = str(e)
        flag = message.split(" ", 1)[0].rstrip(":")
        if flag in sources:
            message += f" (set by the environment: {sources[flag]})"
        parser.exit(2, f"brain: {message}\n")
    return cfg
