"""tests/support/watchdog.py: servers do not outlive a test process that dies,
nor their lifetime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from tests.support.servers import REPO_ROOT

# A child test process: starts a watchdog over `directory`, a fake server
# whose command line names it, prints the server's pid, then exits or waits.
_CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    from pathlib import Path
    from tests.support.watchdog import Watchdog
    directory, lifetime, then = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dog = Watchdog(directory, lifetime)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(directory)],
                              start_new_session=True)
    dog.track("server", server)
    print(server.pid, flush=True)
    if then == "die":
        os._exit(0)
    time.sleep(float(then))
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _child(tmp_path, lifetime: float, then: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(lifetime), then],
                             stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    pid = int(child.stdout.readline())
    return child, pid


def test_servers_die_with_the_test_process(tmp_path):
    child, pid = _child(tmp_path, lifetime=300, then="die")
    child.wait(timeout=10)
    try:
        assert _wait_dead(pid, 5), "the server outlived the test process by 5 s"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_servers_die_when_their_lifetime_ends(tmp_path):
    child, pid = _child(tmp_path, lifetime=1, then="30")
    try:
        assert _alive(pid)
        assert _wait_dead(pid, 6), "the server outlived its 1 s lifetime by 5 s"
        assert child.poll() is None  # the test process itself is left alone
    finally:
        child.kill()
        child.wait(timeout=10)
        if _alive(pid):
            os.kill(pid, 9)
