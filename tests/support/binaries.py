"""The cluster tests' binaries, built from source by the repository's build
scripts (cached, so only the first call of a machine pays for the build).

Each getter returns a path or raises ``ToolMissing``; ``require(getter)`` turns
that into a skip (a failure under CI, where a missing tool must not pass
silently). An environment variable points at a binary built elsewhere:

  etcd36_binary()       benchmarks/build.sh etcd-3.6     $ETCD36_BIN
  nats_server_binary()  tests/cluster/build.sh           $NATS_SERVER_BIN
  clustercheck_binary() tests/cluster/build.sh           $CLUSTERCHECK_BIN
  toxiproxy_binary()    tests/cluster/build.sh toxiproxy $TOXIPROXY_BIN
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.servers import REPO_ROOT, in_ci


class ToolMissing(RuntimeError):
    """A binary the cluster tests need could not be found or built."""


def built_binary(script: Path, name: str, env_var: str) -> str:
    """The path of ``name`` from a build script's "<name> built|cached <s> s <path>" lines."""
    override = os.environ.get(env_var)
    if override:
        if not os.access(override, os.X_OK):
            raise ToolMissing(f"{env_var}={override} is not an executable file")
        return override
    rel = script.relative_to(REPO_ROOT)
    try:
        out = subprocess.run(["bash", str(script), name], capture_output=True, text=True,
                             timeout=1800, cwd=REPO_ROOT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissing(f"{rel} {name}: {e}") from e
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == name and parts[1] in ("built", "cached"):
            return parts[-1]
    raise ToolMissing(f"{rel} {name} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")


def require(getter):
    """``getter()`` (a binary path), or skip the calling test; under CI, fail it."""
    try:
        return getter()
    except ToolMissing as e:
        import pytest

        if in_ci():
            pytest.fail(str(e))
        pytest.skip(str(e))


def etcd36_binary() -> str:
    return built_binary(REPO_ROOT / "benchmarks" / "build.sh", "etcd-3.6", "ETCD36_BIN")


def nats_server_binary() -> str:
    return built_binary(REPO_ROOT / "tests" / "cluster" / "build.sh", "nats-server", "NATS_SERVER_BIN")


def clustercheck_binary() -> str:
    return built_binary(REPO_ROOT / "tests" / "cluster" / "build.sh", "clustercheck", "CLUSTERCHECK_BIN")


def toxiproxy_binary() -> str:
    return built_binary(REPO_ROOT / "tests" / "cluster" / "build.sh", "toxiproxy", "TOXIPROXY_BIN")
