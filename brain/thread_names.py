"""The operating system's name of a thread, set from its Python name.

Per-thread tools read the kernel's name (Linux: /proc/<pid>/task/<tid>/comm,
``top -H``, the benchmark's CPU of the thread that decides writes); Python
only sets it itself from 3.14 on, so before that every thread of brain is
"python".  The kernel keeps 15 bytes of a name, and a new thread starts
with the OS name of the thread that made it: a thread the committer starts
(lease clocks, compactor, checkpoint, syncer) names itself first, or it too
would be counted as "brain-committer".
"""

from __future__ import annotations

import ctypes
import sys
import threading

_PR_SET_NAME = 15  # prctl(2)
_KERNEL_NAME_BYTES = 15


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its Python name) as its OS name, cut to what the kernel
    keeps.  False where that cannot be done (not Linux, no prctl): the name is a convenience, never needed."""
    if not sys.platform.startswith("linux"):
        return False
    raw = (name if name is not None else threading.current_thread().name).encode(errors="replace")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw[:_KERNEL_NAME_BYTES]), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
