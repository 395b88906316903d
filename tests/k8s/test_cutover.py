"""pytest wrapper for tests/k8s/cutover.py: a Kubernetes cluster moved from
etcd 3.6 to brain (brain mirror) and back (etcdctl snapshot save, etcdutl
snapshot restore), every resourceVersion kept, an informer's watch resumed
across both cutovers without a 410.  Skipped unless BRAIN_E2E=1 (`make e2e`
sets it); the Kubernetes binaries come from tests/k8s/build.sh, etcd 3.6 and
etcdutl from benchmarks/build.sh (both cached)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(os.environ.get("BRAIN_E2E") != "1",
                       reason="Kubernetes e2e: set BRAIN_E2E=1 or run `make e2e`"),
]


def test_cutover_from_etcd_to_brain_and_back():
    r = subprocess.run([sys.executable, "-m", "tests.k8s.cutover"], cwd=REPO_ROOT, timeout=2300)
    assert r.returncode == 0, "tests.k8s.cutover failed; the lines above name the failed checks"
