"""`brain mirror --from URL --data-dir DIR`: copy a running etcd into a new
brain data directory with every revision kept, then follow it until
stopped (see brain/migrate/mirror.py and docs/migration.md).

  brain mirror --from https://etcd:2379 --cacert ca.crt --cert client.crt --key client.key \\
               --data-dir /var/lib/brain [--listen-metrics-urls http://127.0.0.1:2381]

Progress and lag lines go to stdout.  SIGTERM or Ctrl-C drains: the mirror
applies etcd's revisions up to etcd's revision at that moment, then exits;
`brain serve --data-dir DIR` continues from exactly there.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Sequence

from brain.cli import flags as cli_flags
from brain import config as C


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brain mirror",
        description="Copy a running etcd into a new brain data directory, revisions kept, and follow it.")
    p.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="etcd client URL (http://, https://, host:port or unix://)")
    p.add_argument("--data-dir", required=True, help="brain data directory to create (must not exist or be empty)")
    cli_flags.add_tls_flags(p)
    cli_flags.add_layout_flags(p)
    p.add_argument("--listen-metrics-urls", type=C.split_urls, default=[],
                   help="serve /metrics (lag included) and /health on these http://host:port URLs")
    p.add_argument("--lease-poll-interval", type=cli_flags.seconds_type, default=1.0,
                   help="how often etcd's leases are listed ('1s', '500ms'; default 1s)")
    p.add_argument("--progress-interval", type=cli_flags.seconds_type, default=5.0,
                   help="seconds between progress lines (default 5s)")
    p.add_argument("--drain-timeout", type=cli_flags.seconds_type, default=120.0,
                   help="on stop, how long to wait to reach etcd's revision (default 2m)")
    p.add_argument("--log-level", default="info", help="debug, info, warn or error (default %(default)s)")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from brain import logging_setup
    from brain.api.etcd_client import ClientAuth, ClientTLS, EtcdClient
    from brain.migrate.etcddb import EtcdDbError
    from brain.migrate.mirror import Mirror, MirrorError
    from brain.migrate.restore import RestoreError
    from brain.migrate.source import SourceError

    logging_setup.configure(args.log_level, "text")
    log = logging.getLogger("brain.mirror")
    try:
        boundaries = cli_flags.layout(args.shards, args.shard_boundaries)
    except ValueError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stop.is_set():
            print("mirror: stopping at once (second signal); the data directory is consistent but may be behind",
                  file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    client = None
    mirror = None
    metrics = None
    try:
        client = EtcdClient(args.source, ClientTLS(args.cacert, args.cert, args.key),
                            auth=ClientAuth(*cli_flags.user_and_password(args)))
        cluster_id, version, revision = client.status()
        print(f"mirror: etcd {version} at {args.source} (cluster-id {cluster_id:x}) is at revision {revision}",
              flush=True)
        mirror = Mirror(client, args.data_dir, boundaries=boundaries, name=args.name, replace=args.replace,
                        interval=args.progress_interval, lease_poll=args.lease_poll_interval)
        res = mirror.copy()
        print(f"mirror: copied etcd's revision {res.revision} ({res.keys} keys, {res.records} revisions, "
              f"{res.leases} leases) into {res.data_dir}; following", flush=True)
        engine = mirror.open_engine()
        if args.listen_metrics_urls:
            from brain.metrics import MetricsServer
            from brain.migrate.metrics import MirrorCollector

            metrics = MetricsServer(engine, args.listen_metrics_urls)
            metrics.registry.registry.register(MirrorCollector(mirror))
            metrics.start()
            print(f"mirror: metrics on {','.join(metrics.endpoints)}", flush=True)
        mirror.follow(stop, drain_timeout=args.drain_timeout)
        final = mirror.applied_revision
        print(f"mirror: stopped at revision {final} (etcd's revision when asked to stop); serve it with "
              f"`brain serve --data-dir {mirror.data_dir}`", flush=True)
        return 0
    except (SourceError, MirrorError, EtcdDbError, RestoreError, C.ConfigError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1
    except Exception:  # noqa: BLE001 - reported, then a clean exit code
        log.exception("mirror failed")
        return 1
    finally:
        if metrics is not None:
            metrics.stop()
        if mirror is not None:
            try:
                mirror.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the data directory failed")
        if client is not None:
            client.close()
        for s, h in previous.items():
            signal.signal(s, h)
