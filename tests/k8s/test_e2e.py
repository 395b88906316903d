"""pytest wrapper for tests/k8s/e2e.py.

Skipped unless BRAIN_E2E=1 (``make e2e`` sets it): the first run builds the
Kubernetes control plane from the Go module proxy (see build.sh), and a full
run takes minutes. One test per transport: the full profile over TCP (then,
in the same invocation, the same scenario on etcd 3.6 as the baseline), the
smoke profile over mutual TLS and over a unix socket; then Kubernetes' storage
conformance suite (tests/k8s/conformance, go test). Extra driver flags can be
passed in BRAIN_E2E_ARGS (e.g. "--keep --configmaps 1000").
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.environ.get("BRAIN_E2E") != "1",
                       reason="Kubernetes e2e: set BRAIN_E2E=1 or run `make e2e`"),
]


@pytest.mark.parametrize("transport,profile", [("tcp", "full"), ("tls", "smoke"), ("unix", "smoke")])
def test_control_plane_on_brain(transport, profile):
    argv = [sys.executable, "-m", "tests.k8s.e2e", "--transport", transport, "--profile", profile,
            *shlex.split(os.environ.get("BRAIN_E2E_ARGS", ""))]
    r = subprocess.run(argv, cwd=REPO_ROOT, timeout=3500)
    assert r.returncode == 0, f"{' '.join(argv[1:])} failed; the summary above names the failed checks"


def test_storage_conformance_suite():
    """Kubernetes' storage conformance suite (k8s.io/apiserver/pkg/storage/testing)
    over the real etcd3 store, one brain per test: tests/k8s/conformance."""
    if shutil.which("go") is None:
        pytest.fail("go is not on PATH")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOMAXPROCS="2", BRAIN_PYTHON=sys.executable)
    r = subprocess.run(["go", "test", "-count=1", "-p", "1", "-timeout", "25m", "./conformance/"],
                       cwd=Path(__file__).resolve().parent, env=env, timeout=1800)
    assert r.returncode == 0, "go test ./conformance failed; see its output above"
