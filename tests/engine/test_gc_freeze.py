"""brain.engine.gc_freeze: what survives a full collection is frozen, so the
next full collection walks only what came since; garbage cycles made after
a freeze are still collected; installing twice registers once."""

from __future__ import annotations

import gc

import pytest

from brain.engine import gc_freeze


@pytest.fixture
def policy():
    gc_freeze.install()
    try:
        yield
    finally:
        gc_freeze.uninstall()
        gc.unfreeze()


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the cyclic GC frees it


def test_the_survivors_of_a_full_collection_are_frozen(policy):
    gc_freeze.install()  # a second install is the first
    assert gc.callbacks.count(gc_freeze._after_collection) == 1
    live = [[i] for i in range(200_000)]  # long-lived, tracked
    gc.collect()
    assert gc.get_freeze_count() >= len(live)
    # the next full collection walks only what is new: the generations it
    # walks no longer hold them (the permanent one does)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(x) in tracked for x in live)
    del live


def test_cycles_made_after_a_freeze_are_still_collected(policy):
    gc.collect()
    node = Node()
    del node
    assert gc.collect() >= 1


def test_uninstall_stops_freezing():
    gc_freeze.install()
    gc_freeze.uninstall()
    assert not gc_freeze.installed() and gc_freeze._after_collection not in gc.callbacks
    gc.unfreeze()
    keep = [[i] for i in range(1000)]
    gc.collect()
    assert gc.get_freeze_count() == 0
    del keep
