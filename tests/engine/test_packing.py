"""The index packed whole once writes stop (brain.engine.packing): a store
whose last writes rewrote keys that sat in blocks keeps them lifted (hot)
and its floor of recent keys in the overlay while it takes writes; once it
applied none for the quiet period the committer folds every one of them,
and every read answers as before, at old revisions too."""

from __future__ import annotations

import random
import threading
import time

from brain.engine import Engine, EngineConfig, packing
from brain.engine.packing import QuietPacker
from brain.mvcc.requests import PutRequest, TxnRequest
from tests.engine.test_index_merge import BATCH, NEW_KEYS, PREFIXES, Model, expected_pages, keys_only_pages, listing


class FakeStore:
    """What the packer reads of a Store: its revision, its unmerged entries,
    and a merge step that folds ``folds`` of them."""

    def __init__(self, unmerged: int = 10, folds: int = 10) -> None:
        self.revision = 1
        self.left = unmerged
        self.folds = folds
        self.steps: list[tuple[int, bool]] = []

    def unmerged(self) -> int:
        return self.left

    @property
    def packed(self) -> bool:
        return self.left == 0

    def merge_step(self, budget: int, *, everything: bool = False) -> None:
        self.steps.append((budget, everything))
        self.left = max(0, self.left - self.folds)


def test_due_only_after_the_quiet_period_with_the_revision_unchanged():
    now = [100.0]
    packer, store = QuietPacker(clock=lambda: now[0]), FakeStore()
    assert not packer.due(store)  # first sight of this revision
    now[0] += packing.QUIET_SECONDS - 0.1
    assert not packer.due(store)
    store.revision = 2  # a write: the quiet period starts again
    now[0] += 0.2
    assert not packer.due(store)
    now[0] += packing.QUIET_SECONDS
    assert packer.due(store)
    packer.step(store, threading.Lock(), 500)
    assert store.steps == [(500, True)]
    assert not packer.due(store)  # packed: nothing to do


def test_a_step_that_folds_nothing_waits_another_quiet_period():
    """The keys left sit in the block a paused compaction stopped inside:
    the committer would otherwise step again at once, forever."""
    now = [0.0]
    packer, store = QuietPacker(clock=lambda: now[0]), FakeStore(unmerged=5, folds=0)
    packer.due(store)
    now[0] += packing.QUIET_SECONDS
    assert packer.due(store)
    packer.step(store, threading.Lock(), 100)
    assert not packer.due(store)
    now[0] += packing.QUIET_SECONDS - 0.1
    assert not packer.due(store)
    now[0] += 0.2
    assert packer.due(store)
    store.folds = 2  # progress: the next step comes at once
    packer.step(store, threading.Lock(), 100)
    assert packer.due(store)


def test_a_quiet_store_folds_its_hot_keys_and_floor_and_reads_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(packing, "QUIET_SECONDS", 0.5)
    config = EngineConfig(str(tmp_path / "data"), shards=2, shard_boundaries=[b"n/"], max_txn_ops=BATCH)
    rng = random.Random(23)
    model = Model()
    eng = Engine.open(config)
    try:
        def write(keys: list[bytes]) -> int:
            res = eng.txn(TxnRequest(success=[PutRequest(k, b"v%d" % rng.randrange(1000)) for k in keys]))
            for k in keys:
                model.put(res.revision, k, b"")
            return res.revision

        new = [PREFIXES[i % 2] + b"key-%06d" % i for i in range(NEW_KEYS)]
        rng.shuffle(new)
        revs = [write(new[at:at + BATCH]) for at in range(0, len(new), BATCH)]
        # rewrites of keys that by now sit in blocks: lifted, and hot (written again soon after)
        revs += [write(rng.sample(new, BATCH)) for _ in range(3)]
        shards = eng.store.shards
        assert all(s.blocks for s in shards)
        assert any(s.rewritten for s in shards), "no key was lifted hot: the test does not reach the case"
        assert not eng.store.packed
        before = {rev: [listing(eng, b"a/", b"o", rev)] for rev in (revs[2], revs[-2], revs[-1])}
        pages = [keys_only_pages(eng, p, p[:-1] + b"0", 500) for p in PREFIXES]

        deadline = time.monotonic() + 30
        while not eng.store.packed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.store.packed, [s.unmerged() for s in shards]
        assert all(not s.overlay and not s.lifted for s in shards)
        for rev, listed in before.items():
            assert [listing(eng, b"a/", b"o", rev)] == listed
        assert [keys_only_pages(eng, p, p[:-1] + b"0", 500) for p in PREFIXES] == pages
        newest = eng.committed_rev
        assert pages == [expected_pages(model, newest, p, p[:-1] + b"0", 500) for p in PREFIXES]

        write(new[:10])  # a write after packing lifts what it touches again
        assert not eng.store.packed
    finally:
        eng.close()


class SlowPacker:
    """A packer whose every step holds the engine lock and the interpreter
    for STEP seconds, as a real merge step does."""

    STEP = 0.02

    def __init__(self, steps: int) -> None:
        self.left = steps

    def due(self, store) -> bool:
        return self.left > 0

    def step(self, store, lock, budget: int) -> None:
        with lock:
            end = time.perf_counter() + self.STEP
            while time.perf_counter() < end:
                pass
            self.left -= 1


def test_a_reader_waits_at_most_about_one_background_step(tmp_path):
    """Back-to-back steps of an idle committer would hand the lock straight
    back to the committer (a lock is not fair): a read right after a bulk
    load waited for the whole packing.  The committer rests as long as a step
    held the lock, so a reader waits for one step, not for all of them."""
    eng = Engine.open(EngineConfig(str(tmp_path / "data")))
    try:
        eng.put(PutRequest(b"k", b"v"))
        packer = SlowPacker(steps=100)  # 2 s of packing
        eng.committer.packer = packer  # seen at the idle committer's next look (0.2 s)
        waits = []
        while packer.left > 5:
            t0 = time.perf_counter()
            with eng.committer.lock:
                waits.append(time.perf_counter() - t0)
        # without the rest some reader waited 0.18-0.56 s (9-28 steps) in each of 3 runs
        assert len(waits) >= 50, len(waits)
        assert max(waits) < 6 * SlowPacker.STEP, sorted(waits)[-5:]
    finally:
        eng.close()
