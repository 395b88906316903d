"""A size-limited tmpfs for full-disk tests, and a file that fills it.

A real filesystem that runs out of space, not a failing syscall: what
brain writes on it gets ENOSPC (or a short write) from the kernel.
Mounting needs root; without it (or without mount) the test fails under
CI and is skipped, and listed, elsewhere.  Always unmount: ``unmount()``
(falling back to a lazy unmount while a process of the test still holds
a file there).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.servers import require_tool, unavailable


class SmallFilesystem:
    """A tmpfs of ``size`` (mount's syntax: "1m", "8m") mounted at ``path``
    (made if missing), and ``filler``, a file of the test's that takes its
    free space."""

    def __init__(self, path: Path, size: str, filler: str = "filler") -> None:
        require_tool("mount", "mount")
        if os.geteuid() != 0:
            unavailable("mounting a tmpfs needs root")
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            unavailable(f"cannot mount a tmpfs: {r.stderr.strip()}")
        self.path = path
        self.filler = path / filler

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """Take all the free space but ``leave`` bytes (page-rounded)."""
        have = self.filler.stat().st_size if self.filler.exists() else 0
        take = self.free() - leave
        if take > 0:
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, have, take)
            finally:
                os.close(fd)
        assert self.free() <= leave, (self.free(), leave)

    def release(self) -> None:
        """Give the filler's space back."""
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        r = subprocess.run(["umount", str(self.path)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:  # still busy (a process of ours not yet reaped): detach it
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)
