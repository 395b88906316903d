"""Stable cluster and member IDs.

etcd derives them from the cluster token and peer URLs; a single brain member
has neither, so they are drawn at random when a data directory is created
and kept in its value store.  Clients only need them non-zero and stable.
"""

from __future__ import annotations

import secrets


def new_id() -> int:
    """A random positive 63-bit ID (never zero, fits etcd's uint64 and int64)."""
    while True:
        v = secrets.randbits(63)
        if v:
            return v
