"""Standalone watch / lease differential runner.

    python -m tests.differential.watch_run --seed S --ops N [--shards K]

Starts a fresh etcd and a fresh brain (or a second etcd with ``--brain
etcd``) per seed, drives both in lockstep through the seeded sequence of KV
writes, compactions, Watch stream actions and Lease calls, then (unless
``--no-expiry``) lets a 2 s lease expire on both.  Prints the first
difference (op number, op, both sides' answers) and exits 1, or exits 0.
``-v`` prints every op as it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # allow "python tests/differential/watch_run.py"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.differential"

from tests.support.etcd_tools import ORACLE_VERSIONS, start_oracle  # noqa: E402
from tests.support.servers import start_brain  # noqa: E402

from .watch_generator import AVOIDABLE  # noqa: E402
from .watch_harness import run_watch_differential  # noqa: E402


def main(argv=None) -> int:
    avoid_help = "; ".join(f"{k}: {v}" for k, v in AVOIDABLE.items())
    ap = argparse.ArgumentParser(prog="python -m tests.differential.watch_run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, action="append", help="seed (repeatable)")
    ap.add_argument("--ops", type=int, default=100, help="operations per seed")
    ap.add_argument("--shards", type=int, default=1, help="brain shard setting")
    ap.add_argument("--etcd-version", choices=ORACLE_VERSIONS, default="3.4",
                    help="version of the etcds started here (3.6 and 3.7 are built by benchmarks/build.sh)")
    ap.add_argument("--brain", choices=["brain", "etcd"], default="brain",
                    help="what to compare etcd with ('etcd': a second etcd, to check the harness)")
    ap.add_argument("--streams", type=int, default=3, help="watch streams per server")
    ap.add_argument("--quiet-ms", type=int, default=300, help="quiescence window")
    ap.add_argument("--round", type=int, default=10, help="compare watch streams every N ops")
    ap.add_argument("--no-leases", action="store_true", help="no Lease calls (and no expiry phase)")
    ap.add_argument("--no-expiry", action="store_true", help="skip the lease expiry phase")
    ap.add_argument("--avoid", help="comma-separated features to leave out (default: the test's default for "
                                    f"the etcd version, see test_watch_lease_vs_etcd.py): {avoid_help}")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every op")
    args = ap.parse_args(argv)
    if args.avoid is None:
        from .test_watch_lease_vs_etcd import DEFAULT_AVOID

        args.avoid = DEFAULT_AVOID[args.etcd_version]
    avoid = tuple(a for a in args.avoid.split(",") if a)
    unknown = [a for a in avoid if a not in AVOIDABLE]
    if unknown:
        ap.error(f"unknown --avoid feature(s) {unknown}; known: {sorted(AVOIDABLE)}")
    other_label = "etcd#2" if args.brain == "etcd" else "brain"
    extra = f" --shards {args.shards}" if args.shards != 1 else ""
    if args.brain == "etcd":
        extra += " --brain etcd"
    if args.etcd_version != "3.4":
        extra += f" --etcd-version {args.etcd_version}"
    log = (lambda i, op: print(f"#{i} {op.describe()}", flush=True)) if args.verbose else None
    total = 0
    for seed in args.seed or [1]:
        started = []
        try:
            ref = start_oracle(args.etcd_version)
            started.append(ref)
            other = start_oracle(args.etcd_version) if args.brain == "etcd" else start_brain(args.shards)
            started.append(other)
            res = run_watch_differential(
                ref.endpoint, other.endpoint, seed, args.ops, labels=("etcd", other_label),
                n_streams=args.streams, quiet=args.quiet_ms / 1000, round_len=args.round,
                leases=not args.no_leases, expiry=not args.no_expiry, avoid=avoid,
                label=f"{other_label} shards={args.shards}" if args.brain != "etcd" else "etcd vs etcd",
                repro_extra=extra, log=log)
            total += res.ops_done
            print(res.summary(), flush=True)
            if res.diff is not None:
                print(res.diff.report())
                return 1
        finally:
            for srv in started:
                srv.cleanup()
    print(f"OK: {total} operations compared, no differences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
