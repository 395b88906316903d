"""strace attached to a running server: syscall tampering (``-e inject``)
from outside, on chosen syscalls and files (``-P path``).

``Strace(pid, args, log)`` starts ``strace -f -qq -p pid *args -o log`` and
returns once every thread of ``pid`` is traced by it (an injection must not
miss a thread that was not attached yet); ``detach()`` ends it with
SIGTERM, on which strace detaches and lets the process go on.  Only one
tracer can hold a process: detach one before attaching the next.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.support.servers import require_tool


def traced_by(pid: int, tracer: int) -> bool:
    """Whether every thread of ``pid`` is traced by ``tracer``."""
    tids = os.listdir(f"/proc/{pid}/task")
    for tid in tids:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        line = next(ln for ln in status.splitlines() if ln.startswith("TracerPid:"))
        if int(line.split()[1]) != tracer:
            return False
    return bool(tids)


def _state(path: str) -> str:
    stat = Path(path).read_text()
    return stat[stat.rindex(")") + 2]


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (T, or t while traced),
    twice 0.1 s apart: a group stop, not traced threads that happen to be
    between two syscalls at once."""
    for look in range(2):
        if look:
            time.sleep(0.1)
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                if _state(f"/proc/{pid}/task/{tid}/stat") not in "tT":
                    return False
            except OSError:
                continue
    return True


class Strace:
    def __init__(self, pid: int, args: list[str], log: Path, timeout: float = 30) -> None:
        require_tool("strace", "strace")
        self.log = log
        self.proc = subprocess.Popen(["strace", "-f", "-qq", "-p", str(pid), *args, "-o", str(log)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        while not traced_by(pid, self.proc.pid):
            if self.proc.poll() is not None:
                raise AssertionError(f"strace exited: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.detach()
                raise AssertionError("strace did not attach to every thread")
            time.sleep(0.05)

    def detach(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


class LmdbCommitFault:
    """Fail lmdb's next commit at its meta page, and not at a lone data
    page before it (both are pwrite64 on data.mdb; strace cannot tell them
    apart): ``arm()`` stops the process at its next fdatasync on
    ``data_mdb`` (an injected SIGSTOP: the commit's, after its data pages);
    once ``stopped()``, ``fire()`` attaches a second strace that fails every
    pwrite64 on data.mdb with ``err`` and lets the process go on: its next
    one is the meta page's.  lmdb then refuses every transaction
    (MDB_PANIC) until the environment is opened again."""

    def __init__(self, pid: int, data_mdb: str, err: str, logs: Path) -> None:
        self.pid, self.data_mdb, self.err, self.logs = pid, data_mdb, err, logs
        self.tracer: Strace | None = None

    def arm(self) -> None:
        self.detach()
        self.tracer = Strace(self.pid, ["-P", self.data_mdb, "-e", "trace=fdatasync",
                                        "-e", "inject=fdatasync:signal=SIGSTOP:when=1"], self.logs / "stop.out")

    def stopped(self) -> bool:
        return stopped(self.pid)

    def fire(self) -> None:
        self.detach()
        self.tracer = Strace(self.pid, ["-P", self.data_mdb, "-e", "trace=pwrite64",
                                        "-e", f"inject=pwrite64:error={self.err}"], self.logs / "fail.out")
        os.kill(self.pid, signal.SIGCONT)

    def output(self) -> str:
        return self.tracer.output() if self.tracer else ""

    def failed_the_meta_page(self) -> bool:
        """Whether a 120-byte pwrite64 (lmdb's meta page) was failed."""
        out = self.tracer.output() if self.tracer else ""
        return re.search(r"pwrite64\(\d+, .*, 120, \d+\) = -1 E\w+ .*\(INJECTED\)", out) is not None

    def detach(self) -> None:
        if self.tracer is not None:
            self.tracer.detach()
            self.tracer = None
