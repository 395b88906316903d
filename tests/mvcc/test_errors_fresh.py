"""The module's shared EtcdError instances never collect tracebacks: every
raise site raises a fresh copy (a re-raised instance chains each raise's
traceback onto itself and keeps the frames alive: a leak in a server that
answers millions of failing requests)."""

from __future__ import annotations

import ast
import pathlib
import traceback

from brain.mvcc import errors
from brain.mvcc.requests import RangeRequest
from brain.mvcc.store import Store
from brain.backend.memory import MemoryBackend

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_no_raise_site_raises_a_shared_instance():
    shared = {name for name, v in vars(errors).items() if isinstance(v, errors.EtcdError)}
    offenders = []
    # tests too: a model or fake engine raising a shared instance taints it
    # for every later test in the same process
    for path in [*(ROOT / "brain").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc
                name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", None)
                if name in shared:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"raise a fresh copy (ErrX.fresh()): {offenders}"


def test_a_thousand_failed_reads_leave_the_shared_error_clean():
    store = Store(MemoryBackend(1), [])
    for _ in range(1000):
        try:
            store.range(RangeRequest(b"k", revision=50), 1)
        except errors.EtcdError as e:
            assert e == errors.ErrFutureRev
    tb = errors.ErrFutureRev.__traceback__
    assert tb is None, "the shared ErrFutureRev was raised here:\n" + "".join(traceback.format_tb(tb))
