"""Value stores behind the MVCC core.

Every store implements :class:`Backend`; ``tests/backend/test_contract.py``
runs one contract suite over all of them.
"""

from __future__ import annotations

import os

from . import protocol
from .lmdb_backend import DEFAULT_MAP_SIZE, LmdbBackend
from .memory import MemoryBackend
from .protocol import *  # noqa: F403 - the contract's names are the package's (protocol.__all__)
from .protocol import Backend

__all__ = [*protocol.__all__, "BACKEND_KINDS", "DEFAULT_MAP_SIZE", "LmdbBackend", "MemoryBackend", "open_backend"]

BACKEND_KINDS = ("lmdb", "memory")


def open_backend(
    kind: str, path: str | os.PathLike[str] | None, shards: int, **options: object
) -> Backend:
    """Open a backend by name.

    ``kind`` is ``"lmdb"`` (``path`` is the environment directory; options:
    ``map_size``, ``max_readers``) or ``"memory"`` (``path`` is ignored;
    option: ``max_bytes``).  Raises ``ValueError`` for an unknown kind, and
    whatever the backend's constructor raises (notably
    :class:`ShardCountMismatchError`).
    """
    if kind == "lmdb":
        if path is None:
            raise ValueError("the lmdb backend needs a path")
        return LmdbBackend(path, shards, **options)  # type: ignore[arg-type]
    if kind == "memory":
        return MemoryBackend(shards, **options)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {BACKEND_KINDS}")
