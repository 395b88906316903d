"""Restart of one loaded data dir by two versions of brain, in one run.

    python3 -m benchmarks.restart_compare --before <commit> [--keys 100000 --keys 1000000]

For each key count: one `brain serve` (this checkout) loads the keys
(brainload load, 1 KiB values, then a fifth of them written again so keys
with history are in the index) and is stopped by SIGTERM, which leaves the
template data dir.  Then for this checkout and for `--before` (exported
with git archive into the run's directory, with this checkout's native
transport copied beside it) in turn, on a fresh copy of the template:
start (a restart after SIGTERM), SIGTERM (the shutdown is timed), start
again, kill -9, start again (a restart after kill -9).  A start is timed
from spawn until a linearizable Get of one key answers (the harness's
readiness probe, benchmarks/probes.py), then the keys are counted, untimed;
its CPU seconds are printed beside it, since other load on the machine moves
the wall time.  Needs brainload (benchmarks/build.sh).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from benchmarks.probes import count_prefix
from benchmarks.servers import Brain, Server, StartOptions, make_root
from benchmarks.tools import ToolError, ToolRunner
from tests.support.harness import REPO_ROOT

PREFIX = "/bench/restart/"
VALUE_BYTES = 1024
REWRITTEN = 5  # one key in REWRITTEN is written twice
QUOTA = 8 << 30


class BrainAt(Brain):
    """brain run from another source tree (a commit exported for comparison)."""

    def __init__(self, source: Path, label: str) -> None:
        self.source = source
        self.name = label

    def env(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.source)
        return env

    def cwd(self):
        return str(self.source)


def export(commit: str, into: Path) -> Path:
    """`commit` of this repository as a source tree under `into`, with the
    native transport (git-ignored, built once) copied from this checkout."""
    tree = into / f"brain-{commit}"
    tree.mkdir(parents=True)
    archive = into / f"{commit}.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    shutil.copy2(REPO_ROOT / "brain" / "_transport.abi3.so", tree / "brain" / "_transport.abi3.so")
    return tree


def load_template(root: Path, keys: int, tools: ToolRunner) -> Path:
    srv = Server(Brain(), root / f"load-{keys}", StartOptions(quota_bytes=QUOTA), ready_timeout=600)
    tools.target = srv
    srv.start()
    try:
        for start, count in ((0, keys), (0, keys // REWRITTEN)):
            res = tools.brainload("load", srv.endpoint, [
                "--count", count, "--start", start, "--clients", 64, "--conns", 8, "--prefix", PREFIX,
                "--val-size", VALUE_BYTES], 3600, srv.root / "tools", f"load-{start}-{count}")
            if res.get("_error") or (res.get("ops") or 0) < count:
                raise ToolError(f"load of {count} keys: {res.get('_error') or 'short'}")
    finally:
        srv.stop(grace=120)
    return srv.data_dir


def restarts(flavor: Brain, template: Path, root: Path, keys: int) -> dict:
    srv = Server(flavor, root, StartOptions(quota_bytes=QUOTA), ready_timeout=max(600.0, keys / 1000))
    shutil.copytree(template, srv.data_dir)
    out = {}
    try:
        for label, stop in (("after SIGTERM", "sigterm"), ("after SIGTERM, again", "kill"),
                            ("after kill -9", None)):
            seconds = srv.start()
            counted = count_prefix(srv.endpoint, PREFIX.encode(), timeout=600)
            if counted != keys:
                raise RuntimeError(f"{flavor.name}: {counted} keys counted, {keys} loaded")
            out[label] = (seconds, srv.ready_cpu_s)
            if stop == "sigterm":
                out["shutdown on SIGTERM"] = (srv.stop(grace=120), None)
            elif stop == "kill":
                srv.kill()
    finally:
        srv.stop(grace=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit to compare this checkout with")
    ap.add_argument("--keys", type=int, action="append", help="key counts (default 100000 and 1000000)")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (data dirs, server logs)")
    args = ap.parse_args()
    root = make_root()
    tools = ToolRunner()
    try:
        flavors = [BrainAt(export(args.before, root), f"before ({args.before})"), Brain()]
        for keys in args.keys or [100_000, 1_000_000]:
            template = load_template(root, keys, tools)
            print(f"{keys} keys of {VALUE_BYTES} B, {keys // REWRITTEN} written twice "
                  f"(seconds to the first count, CPU seconds)", flush=True)
            for i, flavor in enumerate(flavors):
                name = flavor.name if i == 0 else "this checkout"
                for label, (seconds, cpu) in restarts(flavor, template, root / f"{keys}-{i}", keys).items():
                    cpu_note = "" if cpu is None else f", {cpu:.1f} CPU s"
                    print(f"  {name:<24} {label:<22} {seconds:6.2f} s{cpu_note}", flush=True)
            shutil.rmtree(template.parent, ignore_errors=True)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
