"""`brain import SOURCE --data-dir DIR`: etcd's data, with its history, into
a new brain data directory.

SOURCE is an etcd data directory (etcd stopped; the one given to etcd's
--data-dir, holding member/snap/db) or a snapshot file (`etcdctl snapshot
save`, checked against its sha256).  etcd 3.4, 3.5 and 3.6 files are read.
DIR gets every revision still in etcd's file (same keys, values, create and
mod revisions, versions, leases, tombstones), the compaction revision, the
current revision and the leases; `brain serve --data-dir DIR` then answers
as that etcd did.  DIR must not exist or be empty; a brain data directory is
replaced only with --replace.  Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from brain.cli import flags as cli_flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brain import",
        description="Import an etcd data directory or snapshot, with its history, into a new brain data directory.",
        epilog="Example: brain import /var/lib/etcd --data-dir /var/lib/brain (with etcd stopped)")
    p.add_argument("source", metavar="SOURCE",
                   help="etcd data directory (with member/snap/db; etcd stopped) or snapshot file")
    p.add_argument("--data-dir", required=True, help="brain data directory to create (must not exist or be empty)")
    cli_flags.add_layout_flags(p)
    p.add_argument("--skip-hash-check", action="store_true",
                   help="read a snapshot whose sha256 trailer is wrong")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from brain.migrate.etcd_import import import_etcd
    from brain.migrate.restore import RestoreError
    from brain.cli.snapshot import SKIP_HASH_CHECK_HINT
    from brain.migrate.etcddb import DigestMismatch, EtcdDbError

    try:
        boundaries = cli_flags.layout(args.shards, args.shard_boundaries)
    except ValueError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    try:
        res = import_etcd(args.source, args.data_dir, boundaries=boundaries, name=args.name, replace=args.replace,
                          skip_hash_check=args.skip_hash_check)
    except DigestMismatch as e:
        print(f"Error: {e} ({SKIP_HASH_CHECK_HINT})", file=sys.stderr)
        return 1
    except (EtcdDbError, RestoreError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    what = {"data-dir": "etcd data directory", "snapshot": "etcd snapshot", "db": "etcd database"}[res.source_kind]
    compacted = f"compacted at {res.compact_revision}" if res.compact_revision > 0 else "never compacted"
    print(f"imported {what} {res.source} (etcd {res.storage_version} storage) at revision {res.revision} "
          f"({compacted}; {res.keys} keys, {res.records} revisions, {res.leases} leases) into {res.data_dir}: "
          f"{res.shards} shard(s), cluster-id {res.cluster_id:x}, member-id {res.member_id:x}, "
          f"in {res.seconds:.1f}s")
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0
