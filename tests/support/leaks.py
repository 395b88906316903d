"""Find the processes a test run left behind.

Every process a test starts inherits the test process's environment, so the
pytest session marks it there (tests/conftest.py): ``BRAIN_TEST_RUN`` is a
token unique to the session, ``BRAIN_TEST_ID`` the node id of the test being
run, ``BRAIN_TEST_SCOPE`` the scope of the fixture being set up (``function``
in the test itself), ``BRAIN_TEST_FIXTURE`` that fixture's name and
``BRAIN_TEST_SETUP`` a number naming that one setup of it.  Servers
of tests.support.servers keep the marks of the moment they were created, so a
module fixture's server restarted by a test still belongs to the fixture.

``/proc/<pid>/environ`` holds the environment a process was started with:
a scan of /proc finds every live process carrying this run's token, and no
process of another run, another helper or the machine (none carries it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

RUN = "BRAIN_TEST_RUN"
TEST_ID = "BRAIN_TEST_ID"
SCOPE = "BRAIN_TEST_SCOPE"
FIXTURE = "BRAIN_TEST_FIXTURE"
SETUP = "BRAIN_TEST_SETUP"
MARKS = (RUN, TEST_ID, SCOPE, FIXTURE, SETUP)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def begin_run() -> str:
    """Give this process (and so every process it starts) a fresh run token,
    and no marks of a run that started this one."""
    for var in MARKS:
        os.environ.pop(var, None)
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    os.environ[RUN] = token
    return token


def current_marks() -> dict[str, str]:
    """The marks set in this process right now ({} outside a marked run)."""
    return {k: os.environ[k] for k in MARKS if k in os.environ}


@contextlib.contextmanager
def marked(**values: str | None):
    """Set marks (test_id=, scope=, fixture=, setup=; None removes one) for
    the processes started inside the block; the old values come back after."""
    names = {"test_id": TEST_ID, "scope": SCOPE, "fixture": FIXTURE, "setup": SETUP}
    saved = {}
    for key, value in values.items():
        var = names[key]
        saved[var] = os.environ.get(var)
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    start_ticks: int  # /proc/<pid>/stat starttime: with the pid, names the process across pid reuse
    cmdline: str
    marks: dict

    @property
    def age(self) -> float:
        """Seconds since the process started."""
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - self.start_ticks / _CLOCK_TICKS

    def describe(self) -> str:
        owner = self.marks.get(TEST_ID, "<no test: started outside any test>")
        fixture = self.marks.get(FIXTURE)
        by = f"fixture {fixture} ({self.marks.get(SCOPE, '?')} scope) of {owner}" if fixture else owner
        return f"pid {self.pid} (running {self.age:.0f} s), started by {by}: {self.cmdline[:400]}"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start ticks) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return rest[0], int(rest[1]), int(rest[19])


def _read(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return None


def _process(pid: int, environ: bytes) -> Process | None:
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X"):  # a zombie has exited; it only waits to be reaped
        return None
    env = dict(item.split(b"=", 1) for item in environ.split(b"\0") if b"=" in item)
    marks = {k: env[k.encode()].decode("utf-8", "replace") for k in MARKS if k.encode() in env}
    cmdline = (_read(pid, "cmdline") or b"").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return Process(pid, stat[1], stat[2], cmdline, marks)


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def marked_processes(token: str) -> list[Process]:
    """Every live process started (directly or not) by the run of ``token``."""
    needle = f"{RUN}={token}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        environ = _read(pid, "environ")
        if not environ or needle not in environ.split(b"\0"):
            continue
        p = _process(pid, environ)
        if p is not None:
            found.append(p)
    return found


def live_children(parent: int | None = None) -> list[Process]:
    """The live (not zombie) children of ``parent`` (default: this process),
    marked or not: a child started with an environment of its own carries no
    token but is still this run's."""
    parent = os.getpid() if parent is None else parent
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if stat is None or stat[1] != parent:
            continue
        p = _process(pid, _read(pid, "environ") or b"")
        if p is not None:
            found.append(p)
    return found


def survivors(find, grace: float = 5.0) -> list[Process]:
    """``find()``'s processes that are still alive ``grace`` seconds on (a
    server stopped without waiting takes a moment to exit); returns at once
    when there are none."""
    deadline = time.monotonic() + grace
    while True:
        procs = find()
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.1)


def kill(procs: list[Process]) -> None:
    """SIGKILL each process, unless its pid now names another process."""
    for p in procs:
        stat = _stat(p.pid)
        if stat is None or stat[2] != p.start_ticks:
            continue
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
