"""Freed memory handed back to the operating system.

CPython frees a large object (a value, a block's arrays) to the C
allocator, and glibc's malloc keeps freed chunks for reuse: after a
checkpoint drops a memtable of a hundred megabytes, or the merges fold a
bulk load's overlay into packed blocks, the process would go on holding
that memory although nothing uses it.  ``malloc_trim(0)`` returns the
free pages of every malloc arena.  It costs a walk of the free lists
(milliseconds), so it is called after those events, not per write.
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("brain.engine")

_trim = None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = _libc.malloc_trim
    _trim.argtypes = [ctypes.c_size_t]
    _trim.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc
    _trim = None


def release_free_memory() -> None:
    """Give the free pages of the C heap back to the operating system."""
    if _trim is not None:
        _trim(0)
