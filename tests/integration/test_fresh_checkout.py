"""The README's first command on a fresh machine: `make serve` in a new
clone, with nothing but the system's Python on PATH.

The checkout's HEAD is cloned into a temporary directory and `make serve`
runs there in a clean environment: HOME is a new empty directory (no pip
cache, no user site, no config), PATH holds the system's directories and
cargo's and no venv (neither this test's nor a pyenv), so `python3` is the
system's, which (on Debian) refuses a plain `pip install` (PEP 668).  The
command must make its own venv, install brain into it with its runtime
dependencies only, show cargo's lines, and serve on the port given with
`make serve ARGS=...`; the test waits for /health there, then stops it.

What is kept from this environment: how it reaches the package index
(proxy and certificate variables) and the Rust toolchain (rustup's homes:
with HOME elsewhere, rustup would find no toolchain).  CARGO_TARGET_DIR
points at this checkout's shared cargo cache (.cache/cargo-target, or the
CARGO_TARGET_DIR given to the test run): the clone's own would be empty and
its transport would be built from nothing, minutes of CI time for a
question the cold `make test` install already answers; with the cache,
cargo rebuilds only the crates that depend on the new venv's interpreter
and the clone's path (pyo3 and brain's own crate).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import leaks
from tests.support.harness import free_port
from tests.support.servers import REPO_ROOT, http_get, unavailable

pytestmark = pytest.mark.timeout(1200)

SYSTEM_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
# How this machine reaches the package index and crates: not Python's business, kept.
NETWORK_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                     "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
                     "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_DEFAULT_TIMEOUT",
                     "CARGO_HTTP_CAINFO", "CARGO_NET_OFFLINE")
SERVE_TIMEOUT = 900  # a cold pip install: downloads, maturin, cargo on a busy 2-core machine


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not on PATH")
    return path


def _clean_env(home: Path) -> dict[str, str]:
    cargo = Path(_tool("cargo")).resolve()
    env = {k: os.environ[k] for k in NETWORK_VARIABLES if k in os.environ}
    env.update({k: v for k, v in leaks.current_marks().items()})  # what the leak check knows its processes by
    real_home = Path(os.path.expanduser("~"))
    env["CARGO_HOME"] = os.environ.get("CARGO_HOME") or str(real_home / ".cargo")
    env["RUSTUP_HOME"] = os.environ.get("RUSTUP_HOME") or str(real_home / ".rustup")
    env["CARGO_TARGET_DIR"] = os.environ.get("CARGO_TARGET_DIR") or str(REPO_ROOT / ".cache" / "cargo-target")
    env["HOME"] = str(home)
    env["LANG"] = "C.UTF-8"
    env["PATH"] = os.pathsep.join([str(cargo.parent), *SYSTEM_PATH])
    return env


def test_make_serve_runs_as_written_on_a_fresh_clone(tmp_path):
    git, _make = _tool("git"), _tool("make")
    python3 = shutil.which("python3", path=os.pathsep.join(SYSTEM_PATH))
    if python3 is None:
        unavailable("no python3 in the system's directories")
    clone = tmp_path / "brain"
    r = subprocess.run([git, "clone", "--quiet", str(REPO_ROOT), str(clone)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        unavailable(f"git clone of {REPO_ROOT} failed: {r.stderr.strip()}")
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home)
    port = free_port()
    log_path = tmp_path / "make-serve.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(["make", "serve", f"ARGS=--listen-client-urls http://127.0.0.1:{port}"],
                                cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT
        health = None
        while time.monotonic() < deadline and make.poll() is None:
            try:
                health = http_get(f"http://127.0.0.1:{port}/health", timeout=2)
            except OSError:
                health = None
            if health is not None:
                break
            time.sleep(1)
        out = log_path.read_text(errors="replace")
        assert health is not None, f"make serve exited {make.poll()} or timed out before serving:\n{out[-6000:]}"
        assert health[0] == 200 and '"health":"true"' in health[1], health

        venv_python = clone / ".venv" / "bin" / "python"
        assert venv_python.exists(), "make serve made no venv in the checkout"
        assert "Compiling brain-transport" in out and "Finished `release` profile" in out, \
            f"cargo's lines are not shown:\n{out[-6000:]}"
        probe = subprocess.run([str(venv_python), "-c", "import pytest"], capture_output=True, env=env)
        assert probe.returncode != 0, "make serve installed the test extras: it must install what serving needs"
        assert subprocess.run([str(venv_python), "-c", "import nats, grpc, lmdb"], env=env).returncode == 0
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGTERM)
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(timeout=10)
    out = log_path.read_text(errors="replace")
    lines = out.splitlines()
    assert any("received SIGTERM, shutting down" in ln for ln in lines), out[-3000:]
    assert any(ln.endswith(": stopped") for ln in lines), out[-3000:]


def test_make_clean_removes_what_serve_and_cluster_leave(tmp_path):
    """`make cluster` left cluster.brain/ untracked in the checkout and `make
    clean` kept it; the venv stays (distclean removes it)."""
    git = _tool("git")
    _tool("make")
    clone = tmp_path / "brain"
    r = subprocess.run([git, "clone", "--quiet", str(REPO_ROOT), str(clone)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        unavailable(f"git clone of {REPO_ROOT} failed: {r.stderr.strip()}")
    for d in ("default.brain", "cluster.brain/b0", "cluster.brain/nats0", ".venv/bin"):
        (clone / d).mkdir(parents=True)
        (clone / d / "file").write_text("x")
    status = subprocess.run([git, "status", "--porcelain"], cwd=clone, capture_output=True, text=True, timeout=60)
    assert status.stdout == "", f"left untracked in the checkout:\n{status.stdout}"
    r = subprocess.run(["make", "clean"], cwd=clone, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (clone / "default.brain").exists() and not (clone / "cluster.brain").exists()
    assert (clone / ".venv" / "bin" / "file").exists()
