"""`brain serve`: open the engine (or join a cluster), serve until
SIGTERM/SIGINT, drain in-flight calls, close.

Start-up order matters, and each step is reported before the next begins:

1. the configuration is valid and every module it needs imports (the native
   transport, a replica's NATS client);
2. preflight: listeners can bind and TLS files load, then the data dir is
   usable (brain.cli.preflight) -- recovery of a large data dir takes a
   while, so a taken port is reported before it, not after;
3. the engine recovers (or the replica joins its cluster);
4. metrics and health listen, then the client port: whoever sees the
   client port accept finds /health too;
5. a replica starts following or leading.

The wiring lives here so that brain.api imports only what it serves.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from brain import __version__
from brain import cluster
from brain.api import convert
from brain.api.server import ApiServer, ListenError, check_auth_token, check_front
from brain.backend import BackendError, BackendFullError
from brain.cli import preflight
from brain.config import ConfigError, ServerConfig, format_key
from brain.engine import Engine, EngineConfig, gc_freeze
from brain.journal import JournalError
from brain.journal.natsio import NatsClientMissing, import_nats
from brain.metrics import MetricsServer
from brain.mvcc.shard_map import default_boundaries

log = logging.getLogger("brain.cli.serve")

# A second SIGTERM/SIGINT this long after the first exits without draining;
# sooner, it is the first one delivered twice (see on_signal).
REPEAT_SIGNAL_SECONDS = 1.0


def check_modules(config: ServerConfig) -> None:
    """Every module the configuration needs imports, before anything is
    bound or created: the transport, and a cluster replica's NATS client."""
    check_front(config)
    check_auth_token(config)
    if config.journal_url:
        try:
            import_nats()
        except NatsClientMissing as e:
            raise ConfigError(str(e)) from None


def make_engine_config(config: ServerConfig) -> EngineConfig:
    """The engine's settings from the serve flags (unset tuning flags keep
    the engine's defaults)."""
    kw = dict(
        data_dir=config.data_dir,
        name=config.name,
        max_txn_ops=config.max_txn_ops,
        max_watchers_per_stream=config.max_watchers_per_stream,
        max_leases=config.max_leases,
        quota_backend_bytes=config.quota_backend_bytes,
        auto_compaction_mode=config.auto_compaction_mode,
        auto_compaction_retention=config.auto_compaction_retention,
        auth_token_ttl=float(config.auth_token_ttl),
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


def open_replica(config: ServerConfig, engine_config: EngineConfig) -> cluster.Replica:
    """A cluster replica (brain.cluster) for --journal-url."""
    options = cluster.ClusterOptions(
        journal_url=config.journal_url, name=config.name,
        client_urls=tuple(config.advertise_client_urls or config.listen_client_urls),
        election_timeout_ms=config.election_timeout, heartbeat_interval_ms=config.heartbeat_interval,
        journal_replicas=config.journal_replicas, read_lease=config.read_lease,
        read_txn=convert.forwarded_txn_reader())
    return cluster.Replica.open(options, engine_config)


def describe_layout(engine_config: EngineConfig) -> str:
    """The shard layout for the start-up log line."""
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
    try:
        config.validate()
        engine_config = make_engine_config(config)
    except (ConfigError, ValueError, TypeError) as e:
        log.error("invalid configuration: %s", e)
        return 2
    try:
        check_modules(config)
        preflight.check_before_data_dir(config)  # listeners and TLS files, then the data dir
    except (preflight.StartupError, ConfigError) as e:
        log.error("%s", e)
        return 1

    stop = threading.Event()
    replica = None
    first_signal_at: list[float] = []

    def on_signal(signum, _frame) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            # One request often arrives twice at once: a process group's
            # signal and the same one passed on by a parent (make, a shell
            # wrapper, a cgroup's kill).  Only a later one means "now".
            if time.monotonic() - first_signal_at[0] < REPEAT_SIGNAL_SECONDS:
                return
            log.warning("received %s again, exiting without draining", name)
            os._exit(1)
        first_signal_at.append(time.monotonic())
        log.info("received %s, shutting down", name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            if config.journal_url:
                replica = open_replica(config, engine_config)
                engine = replica.engine
            else:
                engine = Engine.open(engine_config)
        except Exception as e:  # noqa: BLE001 - reported, then a clean exit code
            # expected refusals (dir locked, layout mismatch, I/O, no space) need no traceback
            expected = isinstance(e, (OSError, ValueError, RuntimeError, JournalError, BackendError))
            full = isinstance(e, BackendFullError) or getattr(e, "errno", None) in preflight.NO_SPACE_ERRNOS
            space = f"; {preflight.free_space(config.data_dir)}" if full else ""
            log.error("cannot open data dir %s: %s%s", config.data_dir, e, space, exc_info=not expected)
            return 1
        close = replica.close if replica is not None else engine.close
        gc_freeze.install()  # full collections walk only what is new (brain.engine.gc_freeze)
        if stop.is_set():  # told to stop while recovering
            close()
            return 0
        api = ApiServer(engine, config, replica=replica)
        # Metrics and health listen before the client port: whoever sees the
        # client port accept can rely on /health being there too.
        metrics = None
        if config.listen_metrics_urls:
            metrics = MetricsServer(engine, config.listen_metrics_urls, grpc_stats=api.grpc_stats,
                                    transport_stats=api.transport_stats,
                                    cert_file=config.cert_file, key_file=config.key_file)
            try:
                metrics.start()
            except (ConfigError, OSError, ValueError) as e:
                log.error("%s", e)
                close()
                return 1
            log.info("serving metrics and health on %s", ",".join(metrics.endpoints))
        try:
            api.start()
        except (ListenError, ConfigError) as e:
            log.error("%s", e)
            if metrics is not None:
                metrics.stop()
            close()
            return 1
        if replica is not None:
            replica.on_removed = stop.set
            replica.start()
        log.info(
            "brain %s serving client requests",
            __version__,
            extra={
                "fields": {
                    "name": config.name,
                    "data-dir": os.path.abspath(config.data_dir),
                    "endpoints": ",".join(api.endpoints),
                    "grpc-front": api.front_kind,
                    "advertise": ",".join(config.advertise_client_urls) or "-",
                    "layout": describe_layout(engine_config),
                    "cluster-id": f"{engine.cluster_id:x}",
                    "member-id": f"{engine.member_id:x}",
                    "pid": os.getpid(),
                    "python": sys.version.split()[0],
                }
            },
        )
        while not stop.wait(1.0):
            pass
        if metrics is not None:
            metrics.stop()
        log.info("stopping gRPC server (grace %.1fs)", config.shutdown_grace)
        api.stop(config.shutdown_grace)
        log.info("closing engine")
        close()
        log.info("stopped")
        return 0
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
