"""Standalone differential runner.

    python -m tests.differential.run --seed S --ops N --etcd ENDPOINT --brain ENDPOINT

Both endpoints must be *fresh* servers (revision 1, empty keyspace), since
the generated stream relies on revisions lining up.  Omit ``--etcd`` and/or
``--brain`` to have fresh ones started here (``--shards`` picks the brain
shard setting; ``--brain etcd`` compares two fresh etcds).  Prints the first
difference (op number, op, both responses) and exits 1, or exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # allow "python tests/differential/run.py"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.differential"

from tests.support.etcd_tools import ORACLE_VERSIONS, start_oracle  # noqa: E402
from tests.support.servers import kv_stub, start_brain  # noqa: E402

from .compare import render  # noqa: E402
from .harness import run_differential  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.differential.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, action="append",
                    help="seed (repeatable; each seed needs fresh servers, so repeating "
                         "only works when this runner starts them)")
    ap.add_argument("--ops", type=int, default=300, help="operations per seed")
    ap.add_argument("--etcd", help="reference endpoint (host:port or http://host:port); "
                                   "default: start a fresh etcd")
    ap.add_argument("--brain", help="endpoint under test; default: start a fresh brain; "
                                    "'etcd': start a second fresh etcd")
    ap.add_argument("--shards", type=int, default=1, help="shards for a brain started here")
    ap.add_argument("--etcd-version", choices=ORACLE_VERSIONS, default="3.4",
                    help="version of the etcds started here (3.6 and 3.7 are built by benchmarks/build.sh)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every op and result")
    args = ap.parse_args(argv)
    seeds = args.seed or [1]
    if len(seeds) > 1 and (args.etcd or (args.brain and args.brain != "etcd")):
        ap.error("several seeds need fresh servers per seed: omit --etcd/--brain endpoints")

    other_label = "etcd#2" if args.brain == "etcd" else "brain"
    total = 0
    for seed in seeds:
        started = []
        try:
            if args.etcd:
                ref_ep = args.etcd
            else:
                srv = start_oracle(args.etcd_version)
                started.append(srv)
                ref_ep = srv.endpoint
            if args.brain and args.brain != "etcd":
                other_ep = args.brain
            else:
                srv = start_oracle(args.etcd_version) if args.brain == "etcd" else start_brain(args.shards)
                started.append(srv)
                other_ep = srv.endpoint

            log = None
            if args.verbose:
                def log(i, op, a, b):
                    print(f"#{i} {op.describe()}\n  etcd : {render(a)}\n  {other_label}: {render(b)}")

            with kv_stub(ref_ep) as a, kv_stub(other_ep) as b:
                res = run_differential(a.kv, b.kv, seed, args.ops,
                                       labels=("etcd", other_label), log=log)
            total += res.ops_compared
            print(res.summary())
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
