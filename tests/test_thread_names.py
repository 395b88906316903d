"""A thread's OS name: the kernel's name of the calling thread is set from its Python name, and the
engine's committer carries its name there (the node-capacity benchmark reads its CPU by it)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from brain.engine import Engine, EngineConfig
from brain.mvcc.requests import PutRequest
from brain.thread_names import name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc task names are Linux's")


def _os_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


def test_the_calling_thread_gets_its_python_name_cut_to_fifteen_bytes():
    seen = {}

    def body():
        seen["ok"] = name_os_thread()
        seen["name"] = _os_name(threading.get_native_id())

    t = threading.Thread(target=body, name="brain-a-rather-long-name")
    t.start()
    t.join()
    assert seen == {"ok": True, "name": "brain-a-rather-"}


def test_an_explicit_name_wins_over_the_python_one():
    seen = {}

    def body():
        name_os_thread("brain-other")
        seen["name"] = _os_name(threading.get_native_id())

    t = threading.Thread(target=body, name="brain-python-name")
    t.start()
    t.join()
    assert seen["name"] == "brain-other"


def test_the_engine_committer_is_named_brain_committer(tmp_path):
    # Counted among the threads this engine adds: engines other tests of the run left open have theirs.
    before = set(_committers())
    eng = Engine.open(EngineConfig(str(tmp_path / "data")))
    try:
        eng.put(PutRequest(b"k", b"v"))  # the committer has run a turn (and started its lease clock)
        ours = set(_committers()) - before
        assert len(ours) == 1, _tasks()
    finally:
        eng.close()
    # the name goes with the engine (join returns just before the OS thread is gone: a moment's wait)
    deadline = time.monotonic() + 10
    while ours & set(_committers()):
        assert time.monotonic() < deadline, _tasks()
        time.sleep(0.01)


def _committers() -> list[int]:
    return [tid for tid, name in _tasks().items() if name == "brain-committer"]


def _tasks() -> dict[int, str]:
    """Thread id -> OS name of every thread of this process."""
    tasks = {}
    for p in Path("/proc/self/task").glob("*/comm"):
        try:
            tasks[int(p.parent.name)] = p.read_text().strip()
        except OSError:  # the thread ended meanwhile
            pass
    return tasks
