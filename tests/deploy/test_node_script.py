"""deploy/brain-node.sh's settings are the ones docs/kubernetes.md lists, and
the docs' way to make the certificates without the brain user runs as
written (no root-only paths, no scratch root: seconds).

A user who ran `pki` on a machine without the brain user got "user brain
does not exist", and the variables that move the paths and name another
user were only in the script's header."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "brain-node.sh"
DOC = REPO / "docs" / "kubernetes.md"

pytestmark = pytest.mark.timeout(120)


def _require_openssl() -> None:
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is missing (make deps-system installs it)")
        pytest.skip("openssl is missing (make deps-system installs it)")


def test_every_setting_of_the_script_is_in_the_docs_with_its_default():
    settings = dict(re.findall(r'^([A-Z_]+)="\$\{\1:-([^}]*)\}"', SCRIPT.read_text(), re.M))
    assert {"BRAIN_USER", "BRAIN_PKI_DIR", "KUBE_PKI_DIR", "BRAIN_CA_KEY"} <= set(settings), settings
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)` \|", DOC.read_text(), re.M))
    assert rows == settings


def test_the_docs_way_to_make_certificates_without_the_brain_user_runs(tmp_path):
    _require_openssl()
    text = DOC.read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "brain-node.sh pki" in b and "BRAIN_USER" in b]
    # as written, from the checkout; mktemp -d lands in this test's directory
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    [made] = [d for d in tmp_path.iterdir() if d.is_dir()]
    key = made / "brain" / "server.key"
    assert key.stat().st_uid == os.getuid() and key.stat().st_mode & 0o777 == 0o600
    for cert in (made / "brain" / "server.crt", made / "kube" / "apiserver-brain-client.crt"):
        v = subprocess.run(["openssl", "verify", "-CAfile", str(made / "brain" / "ca.crt"), str(cert)],
                           capture_output=True, text=True, timeout=30)
        assert v.returncode == 0, v.stdout + v.stderr
    assert (made / "ca" / "ca.key").is_file()
    assert f"{made}/brain/{{ca.crt,server.crt,server.key}}" in p.stdout


def test_a_missing_user_is_refused_naming_the_setting(tmp_path):
    _require_openssl()
    user = "brain-test-no-such-user"
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    env = dict(os.environ, BRAIN_USER=user, BRAIN_PKI_DIR=str(tmp_path / "b"), KUBE_PKI_DIR=str(tmp_path / "k"),
               BRAIN_CA_KEY=str(tmp_path / "ca" / "ca.key"))
    p = subprocess.run(["bash", str(SCRIPT), "pki"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"user {user} (who gets server.key) does not exist" in p.stderr, p.stderr
    assert "BRAIN_USER=" in p.stderr and "docs/kubernetes.md" in p.stderr, p.stderr
    assert not (tmp_path / "b").exists()
