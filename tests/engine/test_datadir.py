"""Which directories brain serves and builds into: empty or its own, never
etcd's or another program's; a new data directory appears whole or not at
all; --replace swaps brain data only when no server holds it."""

from __future__ import annotations

import fcntl
import os

import pytest

from brain.engine import Engine, EngineConfig, datadir
from brain.migrate.restore import DataDirBuilder, RestoreError
from brain.mvcc.requests import PutRequest, RangeRequest


def etcd_dir(path):
    (path / "member" / "snap").mkdir(parents=True)
    (path / "member" / "wal").mkdir()
    (path / "member" / "snap" / "db").write_bytes(b"\0" * 4096)
    return path


def test_inspect_kinds(tmp_path):
    assert datadir.inspect(str(tmp_path / "nope")).kind == datadir.MISSING
    (tmp_path / "empty").mkdir()
    assert datadir.inspect(str(tmp_path / "empty")).kind == datadir.EMPTY
    (tmp_path / "fs-root" / "lost+found").mkdir(parents=True)
    assert datadir.inspect(str(tmp_path / "fs-root")).kind == datadir.EMPTY
    assert datadir.inspect(str(etcd_dir(tmp_path / "default.etcd"))).kind == datadir.ETCD
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "photo.jpg").write_bytes(b"x")
    c = datadir.inspect(str(tmp_path / "other"))
    assert (c.kind, c.entries) == (datadir.FOREIGN, ("photo.jpg",))
    (tmp_path / "file").write_text("x")
    assert datadir.inspect(str(tmp_path / "file")).kind == datadir.NOT_A_DIR


def test_serve_refuses_etcd_and_foreign_directories(tmp_path):
    etcd = etcd_dir(tmp_path / "default.etcd")
    with pytest.raises(datadir.DataDirError) as e:
        Engine.open(EngineConfig(str(etcd)))
    msg = str(e.value)
    assert f"{etcd} is an etcd data directory" in msg
    assert f"brain import {etcd} --data-dir {tmp_path / 'default.brain'}" in msg
    assert sorted(os.listdir(etcd)) == ["member"]  # nothing written into it

    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("mine")
    with pytest.raises(datadir.DataDirError, match=r"holds files that are not brain's \(a\.txt\)"):
        Engine.open(EngineConfig(str(other)))
    assert sorted(os.listdir(other)) == ["a.txt"]

    root = tmp_path / "mnt"
    (root / "lost+found").mkdir(parents=True)
    eng = Engine.open(EngineConfig(str(root), shards=1))  # a fresh filesystem's root is fine
    eng.put(PutRequest(b"k", b"v"))
    eng.close()
    eng = Engine.open(EngineConfig(str(root), shards=1))  # and so is brain's own directory
    assert eng.range(RangeRequest(b"k")).kvs[0].value == b"v"
    eng.close()


def _build(path, value: bytes, replace=False):
    with DataDirBuilder(str(path), [], replace=replace) as b:
        b.add(1 << 32, (b"k", value, 1 << 32, 1, 0))
        b.commit(revision=1, compact_rev=-1)


def _value(path) -> bytes:
    eng = Engine.open(EngineConfig(str(path), shards=1))
    try:
        return eng.range(RangeRequest(b"k")).kvs[0].value
    finally:
        eng.close()


def test_builder_is_all_or_nothing_and_replaces_only_when_asked(tmp_path):
    dest = tmp_path / "d"
    with pytest.raises(RuntimeError):
        with DataDirBuilder(str(dest), []) as b:
            b.add(1 << 32, (b"k", b"v", 1 << 32, 1, 0))
            raise RuntimeError("interrupted")
    assert not dest.exists() and not [p for p in tmp_path.iterdir()]

    _build(dest, b"one")
    assert _value(dest) == b"one"
    with pytest.raises(RestoreError, match="pass --replace"):
        _build(dest, b"two")
    assert _value(dest) == b"one"
    _build(dest, b"two", replace=True)
    assert _value(dest) == b"two"
    assert not [n for n in os.listdir(dest) if n.startswith(".brain")]

    # a server holding the directory cannot have it replaced under its feet
    fd = os.open(dest / "LOCK", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RestoreError, match="in use by a running brain"):
            _build(dest, b"three", replace=True)
    finally:
        os.close(fd)
    assert _value(dest) == b"two"


def test_an_interrupted_swap_is_refused_not_served(tmp_path):
    dest = tmp_path / "d"
    _build(dest, b"one")
    (dest / datadir.INCOMPLETE_MARKER).write_text("")  # what a crash midway through a swap leaves
    with pytest.raises(datadir.DataDirError, match="was interrupted"):
        Engine.open(EngineConfig(str(dest), shards=1))
    with pytest.raises(RestoreError, match="interrupted import or restore; pass --replace"):
        _build(dest, b"two")
    _build(dest, b"two", replace=True)
    assert _value(dest) == b"two" and not (dest / datadir.INCOMPLETE_MARKER).exists()
