"""The server harness the tests and the benchmarks share.

A server under test or under benchmark is a process in a session of its
own (so its whole process group can be signalled), with stdout and stderr
appended to a log file after a ``=== start: <command>`` line, on free
loopback ports; it is ready when a probe of the caller's choosing answers,
and it is stopped with SIGTERM to its group, then SIGKILL after a grace
period.  This module holds that much and nothing else: the tests' policy
(leak-check marks, skip or fail, temp dirs on /dev/shm) stays in
tests/support/servers.py, the benchmarks' (server flavours, /proc readings,
a readiness that counts keys) in benchmarks/servers.py.  The TLS material
both use is tests/support/tls.py.

Nothing here imports pytest: the benchmarks run without it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerStartError(RuntimeError):
    """A server did not become ready; the message includes its log tail."""


# Ports handed to test servers come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default), which the kernel
# draws from for every outgoing connection's source port and every bind to
# port 0.  A port picked by binding 0 and closing can be taken by one of the
# thousands of connections a suite opens before the server binds it (seen in
# CI: nats-server "bind: address already in use"); a port below that range is
# taken only by another explicit pick, which the cycle below does not repeat
# for thousands of picks.  Fixed ports the project uses (2379, 4222, 12379,
# 22379 ...) are all below the start.
_PORT_RANGE = (23000, 32700)
_next_port = [0]


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port free right now, from outside the kernel's
    ephemeral range so no outgoing connection takes it before the server
    binds it (another explicit pick still may: see ``port_taken``)."""
    low, high = _PORT_RANGE
    high = min(high, _ephemeral_floor())
    span = high - low
    if span < 1000:  # an unusual ephemeral range: the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if not _next_port[0]:
        # Each process starts somewhere else, so two test processes picking
        # at once rarely walk the same ports.
        _next_port[0] = low + (os.getpid() * 7919 + time.monotonic_ns()) % span
    for _ in range(span):
        port = _next_port[0]
        _next_port[0] = low + (port + 1 - low) % span
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {low}-{high}")


def port_taken(error: Exception) -> bool:
    """The start failed because a port picked by ``free_port`` was taken
    meanwhile: a start on fresh ports may succeed."""
    return "address already in use" in str(error).lower()


def brain_env(env: dict) -> dict:
    """``env`` with this checkout first on PYTHONPATH, so ``python -m brain``
    runs the code under test whatever is installed."""
    env = dict(env)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + pp if pp else "")
    return env


def log_tail(path: Path, nbytes: int) -> str:
    """The last ``nbytes`` of a log file (decoded leniently), or why there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<no log: {e}>"


class ServerProcess:
    """One server process at a time, logging to ``log_path``; ``proc`` is the
    running one (None before the first spawn and after a stop or kill)."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, cmd: Sequence[str], env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
        """Start ``cmd`` in a new session, its output appended to the log."""
        with open(self.log_path, "ab", buffering=0) as log:
            log.write(("\n=== start: " + " ".join(cmd) + "\n").encode())
            self.proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        return self.proc

    def log_tail(self, nbytes: int) -> str:
        return log_tail(self.log_path, nbytes)

    def poll_ready(self, probe: Callable[[float], str | None], deadline: float, what: str, *,
                   pause: float, detail: Callable[[], str] = lambda: "") -> None:
        """Call ``probe(seconds left)`` every ``pause`` seconds until it returns
        None (ready); it returns the error of a failed attempt otherwise.  A
        process that exits first, or a ``deadline`` (time.monotonic) that
        passes, is a ServerStartError naming ``what`` and ending in ``detail()``."""
        timeout = deadline - time.monotonic()
        last = "not attempted"
        while True:
            if not self.running:
                rc = None if self.proc is None else self.proc.returncode
                raise ServerStartError(f"{what} exited during startup (exit code {rc}){detail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerStartError(f"{what} not ready after {timeout:.0f}s (last error: {last}){detail()}")
            error = probe(remaining)
            if error is None:
                return
            last = error
            time.sleep(pause)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the process group (to the process alone if the group is gone)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float, kill_wait: float = 30.0) -> None:
        """SIGTERM to the group, up to ``grace`` seconds for the process to
        exit, then SIGKILL; the group's stragglers get SIGKILL either way."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                proc.wait(timeout=kill_wait)
        self._reap_group()
        self.proc = None

    def kill(self, kill_wait: float = 30.0) -> None:
        """SIGKILL to the group: no clean shutdown (the data dir is kept)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.signal_group(signal.SIGKILL)
            proc.wait(timeout=kill_wait)
        self._reap_group()
        self.proc = None

    def _reap_group(self) -> None:
        # What is left of the group once its leader exited (nothing, usually).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
