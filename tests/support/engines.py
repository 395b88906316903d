"""Engines opened in a test's directory, for tests that open several (a
source and a restored copy, or one engine again after a restart)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from brain.engine import Engine, EngineConfig
from brain.mvcc.requests import RangeRequest

BOUNDARIES = {1: [], 3: [b"f", b"p"]}  # the layouts by shard count


def cfg(path, shards: int = 3, **kw) -> EngineConfig:
    return EngineConfig(str(path), shards=shards, shard_boundaries=BOUNDARIES[shards], **kw)


@contextmanager
def opened_engines(root) -> Iterator[Callable[..., Engine]]:
    """make(name, shards=3, **config) opens the engine of root/name; every
    engine opened is closed on exit (one closed already is left as it is)."""
    opened = []

    def make(name: str, shards: int = 3, **kw) -> Engine:
        eng = Engine.open(cfg(root / name, shards, **kw))
        opened.append(eng)
        return eng

    try:
        yield make
    finally:
        for eng in opened:
            try:
                eng.close()
            except Exception:
                pass


def dump(engine: Engine, rev: int = 0) -> list:
    """Every key at `rev` (0: the current revision) with all its fields."""
    res = engine.range(RangeRequest(b"\x00", b"\x00", revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in res.kvs]
