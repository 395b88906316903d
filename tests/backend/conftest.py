"""Fixtures that let one contract suite run over every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.backend import Backend, open_backend

KINDS = ("memory", "lmdb")


class BackendFactory:
    """Opens backends of one kind; closes whatever it opened at teardown."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.directory = directory
        #: Whether a closed store can be reopened with its data.
        self.persistent = kind == "lmdb"
        self._opened: list[Backend] = []

    def open(self, shards: int = 4, *, name: str = "store", capacity: int | None = None) -> Backend:
        """Open (or reopen, for persistent kinds) the store called ``name``.

        ``capacity`` is a size limit in bytes: ``map_size`` for LMDB,
        ``max_bytes`` for the memory backend.
        """
        options: dict[str, object] = {}
        if capacity is not None:
            options["map_size" if self.kind == "lmdb" else "max_bytes"] = capacity
        backend = open_backend(self.kind, self.directory / name, shards, **options)
        self._opened.append(backend)
        return backend

    def close_all(self) -> None:
        for backend in self._opened:
            backend.close()


@pytest.fixture(params=KINDS)
def factory(request: pytest.FixtureRequest, tmp_path: Path):
    f = BackendFactory(request.param, tmp_path)
    yield f
    f.close_all()


@pytest.fixture(params=[k for k in KINDS if BackendFactory(k, Path()).persistent])
def persistent_factory(request: pytest.FixtureRequest, tmp_path: Path):
    """Only the kinds whose data survives a close (the memory backend's does not)."""
    f = BackendFactory(request.param, tmp_path)
    yield f
    f.close_all()


@pytest.fixture
def backend(factory: BackendFactory) -> Backend:
    return factory.open(shards=4)
