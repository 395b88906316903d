"""A watchdog that bounds the lifetime of the servers a test starts.

Servers are started in their own session (so a kill -9 of one does not touch
the test), which also means they would outlive a test runner that is killed
or that hangs. A ``Watchdog`` is a small shell loop, started once per group of
servers, that SIGKILLs every process it tracks when either

- the test process that started it is gone (checked every second), or
- ``lifetime`` seconds have passed since it started.

It tracks processes through pid files in its directory; before killing a pid
it checks the process's command line still mentions that directory, so a pid
reused by an unrelated process is never touched. ``stop()`` ends the loop
without killing anything (the owner stops its servers itself).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

_SCRIPT = r"""
parent="$1"; deadline="$2"; piddir="$3"; dir="$4"
while kill -0 "$parent" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 1
done
if kill -0 "$parent" 2>/dev/null; then
    echo "watchdog: lifetime over, killing the servers under $dir" >&2
fi
for f in "$piddir"/*.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir"; then
        kill -9 "$pid" 2>/dev/null
    fi
done
"""


class Watchdog:
    """Kill tracked processes when the test process dies or ``lifetime`` ends.

    ``directory`` must appear in every tracked process's command line (a
    config file or data dir inside it does).
    """

    def __init__(self, directory: Path, lifetime: float):
        import time

        self.directory = Path(directory)
        self.lifetime = lifetime
        self.deadline = time.time() + lifetime
        self._pid_dir = self.directory / "pids"
        self._pid_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.directory / "watchdog.log", "ab", buffering=0)
        self._proc = subprocess.Popen(
            ["bash", "-c", _SCRIPT, "watchdog", str(os.getpid()), str(int(self.deadline) + 1),
             str(self._pid_dir), str(self.directory)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def track(self, name: str, proc: subprocess.Popen) -> None:
        """Record ``proc`` (replacing an earlier process of the same name)."""
        (self._pid_dir / f"{name}.pid").write_text(str(proc.pid))

    def stop(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=10)
        self._log.close()
