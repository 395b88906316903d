"""The deploy files work as docs/kubernetes.md says, run in a scratch root.

Each test gives tests/deploy/scratch-node.sh a scratch node: an overlay of
this machine's root filesystem (writes in a tmpfs, in a mount namespace of
its own, so the real /etc, /opt and /var are untouched), runs the docs'
steps there with deploy/brain-node.sh (a venv from the wheel of this
checkout, the brain user, the certificates), and then:

* systemd: boots that root with systemd (systemd-nspawn, private network)
  and checks what an operator would: deploy/brain.service enabled and
  active, running /opt/brain/bin/brain as brain (uid 65532), /readyz ok,
  etcdctl over mutual TLS with the apiserver's client certificate and over
  the unix socket, Documentation= a file the install put there,
  `systemd-analyze verify` silent about the unit, a clean stop (exit 0) and
  the data still there after a restart;
* static pod: with no kubelet here, runs the manifest's container command
  the way the kubelet and the runtime would (runAsUser/runAsGroup, no
  supplementary groups, capabilities dropped, no_new_privs, hostPath volumes
  checked for their type and bind-mounted, read-only where the manifest
  says), checks it becomes ready, serves mutual TLS, exits 0 on SIGTERM and
  wrote its data as 65532; and that the node as it was before the fix
  (root's data dir, root's key) fails with a message naming the cause.

The container image is not built here (no Docker engine): the "image" is the
node's root with brain's venv first on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brain.etcd_version import ETCD_VERSION

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("scratch-node.sh")


def _need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _require_scratch_roots() -> None:
    _need(os.geteuid() == 0, "scratch roots need root (mount namespaces, overlayfs, chroot)")
    for tool in ("unshare", "nsenter", "chroot", "setpriv", "openssl", "etcdctl", "ip"):
        _need(shutil.which(tool) is not None, f"{tool} is missing (make deps-system installs it)")
    _need(Path("/usr/bin/python3").exists(), "Debian's python3 is missing")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, yaml"], capture_output=True)
    _need(probe.returncode == 0, "python3-venv and python3-yaml are missing (make deps-system installs them)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    _require_scratch_roots()
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    wheels = list(out.glob("brain_etcd-*.whl"))
    assert len(wheels) == 1, "the wheel is named after the distribution, brain-etcd"
    return wheels[0]


def scratch_node(mode: str, wheel: Path, tmp_path: Path) -> dict[str, str]:
    scratch = tmp_path / "node"
    scratch.mkdir()
    p = subprocess.run(["unshare", "--mount", "bash", str(DRIVER), mode, str(scratch), str(wheel)],
                       capture_output=True, text=True, timeout=900, cwd=REPO)
    checks = {}
    for line in p.stdout.splitlines():
        if line.startswith("check "):
            _, name, value = (line.split(" ", 2) + [""])[:3]
            checks[name] = value
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    checks["_output"] = p.stdout + p.stderr
    return checks


def test_systemd_unit_boots_and_serves(wheel, tmp_path):
    _need(shutil.which("systemd-nspawn") is not None, "systemd-nspawn is missing (Debian's systemd-container)")
    c = scratch_node("systemd", wheel, tmp_path)
    out = c.pop("_output")
    expected = {
        "enabled": "enabled",
        "active": "active",
        "readyz": "ok",
        "main-uid": "65532",
        "main-user": "brain",
        "command": "/opt/brain/bin/brain serve",
        "documentation": "file:///usr/share/doc/brain/kubernetes.md",
        "doc-file": "present",
        "verify": "0",
        "put": "OK",
        "unix-get": "yes",
        "socket-dir": "brain:brain 750",
        "data-dir": "brain:brain 700",
        "stop-status": "0 success",
        "after-restart": "yes",
        "halted": "yes",
    }
    assert {k: c.get(k) for k in expected} == expected, out
    assert c["system"] in ("running", "degraded"), out
    assert c["version"] == ETCD_VERSION, out


def _log_message(line: str) -> str:
    return json.loads(line)["msg"]  # the manifest asks for --log-format=json


def test_static_pod_runs_as_65532_on_a_prepared_node(wheel, tmp_path):
    c = scratch_node("static-pod", wheel, tmp_path)
    out = c.pop("_output")
    expected = {
        "manifest": "present",
        "pod-user": "65532:65532",
        "data-owner": "65532:65532 700",
        "key-owner": "65532:65532 600",
        "ready": "yes",
        "brain-uid": "65532",
        "brain-caps": "0000000000000000",
        "put": "OK",
        "exit": "0",
        "unprepared": "hostPath type check failed: /var/lib/brain is not a directory",
    }
    assert {k: c.get(k) for k in expected} == expected, out
    assert c["data-files"].startswith("0 not-owned ") and not c["data-files"].endswith(" 0 files"), out
    # The node before the fix: the kubelet's root-owned DirectoryOrCreate dir, a root-owned key.
    assert _log_message(c["root-data-dir"]) == (
        "cannot create data dir /var/lib/brain/data: permission denied "
        "(brain runs as uid 65532 gid 65532; /var/lib/brain is owned by 0:0 with mode 0755)"), out
    assert _log_message(c["root-key"]) == (
        "--key-file /etc/brain/pki/server.key: Permission denied "
        "(brain runs as uid 65532 gid 65532; /etc/brain/pki/server.key is owned by 0:0 with mode 0600)"), out
