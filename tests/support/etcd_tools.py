"""Go-built etcd tools for tests: etcd/etcdctl/etcdutl 3.5, 3.6 and 3.7.

They come from ``benchmarks/build.sh`` (cached under $BRAIN_BENCH_CACHE or
.cache/bench; a cold build of a group takes minutes).  A binary already in
the cache is used as it is (its version is pinned by its wrapper go.mod), so
these tests never rebuild what the benchmarks share.  ``$BRAIN_BENCH_BIN``
points at prebuilt binaries instead.  A test that needs a tool that cannot
be had is skipped, or fails under $CI.

etcd 3.7 is also the differential tests' third oracle: ``start_oracle``
starts a fresh etcd of any of ORACLE_VERSIONS (through tests.support.servers).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.servers import ETCD_VERSIONS, REPO_ROOT, in_ci, require_etcd, start_etcd

BUILD = REPO_ROOT / "benchmarks" / "build.sh"


def _unavailable(msg: str) -> None:
    import pytest

    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)


@functools.lru_cache(maxsize=None)
def _build(name: str) -> str:
    """Path of binary `name` (building its group if needed), or an error
    message starting with '!'."""
    explicit = os.environ.get("BRAIN_BENCH_BIN")
    if explicit:
        p = Path(explicit) / name
        return str(p) if p.is_file() else f"!{name} is not in $BRAIN_BENCH_BIN ({explicit})"
    cached = Path(os.environ.get("BRAIN_BENCH_CACHE", REPO_ROOT / ".cache" / "bench")) / "bin" / name
    if cached.is_file():
        return str(cached)
    if shutil.which("go") is None:
        return f"!go is not on PATH and {name} is not built"
    r = subprocess.run(["bash", str(BUILD), name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return f"!benchmarks/build.sh {name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return str(Path(r.stdout.strip().splitlines()[-1]) / name)


def etcd_tool(name: str) -> str:
    """The path of `name` (etcd-, etcdctl- or etcdutl- then 3.5, 3.6 or
    3.7), or skip/fail the calling test."""
    got = _build(name)
    if got.startswith("!"):
        _unavailable(got[1:])
    return got


# The differential tests' oracles: every etcd tests.support.servers starts.
ORACLE_VERSIONS = ETCD_VERSIONS


def require_oracle(version: str) -> None:
    """Skip the calling test when etcd ``version`` is missing (fail under $CI)."""
    require_etcd(version)


def start_oracle(version: str = "3.4", **kw):
    """A started fresh etcd of ``version`` (3.4, 3.6 or 3.7); the caller cleans it up."""
    return start_etcd(version=version, **kw)
