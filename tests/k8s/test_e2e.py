"""pytest wrapper for tests/k8s/e2e.py.

Skipped unless BRAIN_E2E=1 (``make e2e`` sets it): the first run builds the
Kubernetes control plane from the Go module proxy (see build.sh), and a full
run takes minutes. One test per transport: the full profile over TCP (then,
in the same invocation, the same scenario on etcd 3.6 as the baseline), the
smoke profile over mutual TLS and over a unix socket, the full profile over a
3-replica brain cluster, the smoke profile over `brain groups` (Leases and
Events in a group of their own); then Kubernetes' storage conformance suite
(tests/k8s/conformance, go test). Each scenario must pass every check and run
exactly as many as it has. Extra driver flags can be passed in BRAIN_E2E_ARGS
(e.g. "--keep --configmaps 1000"); the work directories are under the test's
tmp_path.
"""

from __future__ import annotations

import json
import os
import re
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


# How many checks each scenario runs when it runs to the end (a scenario that
# stops early records "scenario ran to the end" failed and skips the rest), so
# a check that silently stops running fails the test too.
# One server: bring-up 3, nodes 1, watch 1, ConfigMaps 4, CRD 4, Deployment 1,
# SIGTERM restart 10, kill -9 restart 12, scale/roll/delete 4, events and
# compaction 3, /readyz 1, metrics 5, apiserver log 1, clean exit 1.
SINGLE_SERVER_CHECKS = 51
# A brain cluster: the two restarts are one leader kill (12 checks).
CLUSTER_CHECKS = 48
# brain groups: in place of the restarts, where the keys are 4, resourceVersions 4 (Events listed, a Lease,
# an Event, a pod), the kill -9 of a group 4; and the second group's compaction 1.
GROUPS_CHECKS = 42


def run_e2e(tmp_path: Path, transport: str, profile: str) -> dict[str, int]:
    """Run the e2e driver; returns each run's number of checks (by its work
    directory's name: <transport>-<profile>[-<baseline>])."""
    argv = [sys.executable, "-m", "tests.k8s.e2e", "--transport", transport, "--profile", profile,
            *shlex.split(os.environ.get("BRAIN_E2E_ARGS", "")), "--workdir", str(tmp_path)]
    r = subprocess.run(argv, cwd=REPO_ROOT, timeout=3500)
    assert r.returncode == 0, f"{' '.join(argv[1:])} failed; the summary above names the failed checks"
    return {p.parent.name: len(json.loads(p.read_text())["checks"])
            for p in sorted(tmp_path.glob("brain-e2e-*/*/summary.json"))}


@pytest.mark.parametrize("transport,profile", [("tcp", "full"), ("tls", "smoke"), ("unix", "smoke")])
def test_control_plane_on_brain(transport, profile, tmp_path):
    want = {f"{transport}-{profile}": SINGLE_SERVER_CHECKS}
    extra = " ".join(shlex.split(os.environ.get("BRAIN_E2E_ARGS", "")))
    if (transport, profile) == ("tcp", "full") and not re.search(r"--baseline[= ]none", extra):
        want["tcp-full-etcd-3.6"] = SINGLE_SERVER_CHECKS  # the same scenario on etcd 3.6
    assert run_e2e(tmp_path, transport, profile) == want


def test_control_plane_on_a_brain_cluster(tmp_path):
    """The full scenario with --etcd-servers listing a 3-replica brain
    cluster on NATS JetStream; the brain leader is killed mid-run (in place
    of the single server's SIGTERM restart and kill -9).  About 165 s, the
    smoke profile about 100 s (measured on 2 shared cores)."""
    assert run_e2e(tmp_path, "cluster", "full") == {"tcp-full-brain-cluster": CLUSTER_CHECKS}


def test_control_plane_on_brain_groups(tmp_path):
    """The smoke scenario on `brain groups`: node Leases and Events in a group of
    their own, kube-apiserver given the flags `brain groups --print-flags` prints;
    the Leases-and-Events group killed with kill -9 mid-run (about 85 s, measured
    on 2 shared cores)."""
    assert run_e2e(tmp_path, "groups", "smoke") == {"tcp-smoke-brain-groups": GROUPS_CHECKS}


def test_storage_conformance_suite():
    """Kubernetes' storage conformance suite (k8s.io/apiserver/pkg/storage/testing)
    over the real etcd3 store, one brain per test: tests/k8s/conformance."""
    if shutil.which("go") is None:
        pytest.fail("go is not on PATH")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOMAXPROCS="2", BRAIN_PYTHON=sys.executable)
    r = subprocess.run(["go", "test", "-count=1", "-p", "1", "-timeout", "25m", "./conformance/"],
                       cwd=Path(__file__).resolve().parent, env=env, timeout=1800)
    assert r.returncode == 0, "go test ./conformance failed; see its output above"
