"""brain.engine.checkpoint_meta: the checkpoint format, and data
directories whose checkpoint an earlier brain wrote."""

from __future__ import annotations

import json

import pytest

from brain import backend as backend_mod
from brain.engine import Engine, EngineConfig
from brain.engine.checkpoint_meta import META_CHECKPOINT, CheckpointMeta
from brain.mvcc.requests import CompactRequest, PutRequest, RangeRequest

# As the engine wrote them before CheckpointMeta: epoch and leader_id always,
# compact_done_rev -1 while a physical compaction was in progress.
ENGINE_WRITTEN = b'{"revision": 9, "compact_rev": 5, "compact_done_rev": -1, "journal_index": 4, ' \
                 b'"leases": [[7, 60]], "epoch": 0, "leader_id": 0}'
# As restore wrote it: no epoch, an etcd import's older finished compaction.
RESTORE_WRITTEN = b'{"revision": 12, "compact_rev": 10, "compact_done_rev": 8, "journal_index": 0, "leases": []}'
NOTHING_COMPACTED = b'{"revision": 1, "compact_rev": -1, "compact_done_rev": -1, "journal_index": 0, "leases": []}'


def test_checkpoints_of_earlier_writers_decode():
    assert CheckpointMeta.decode(ENGINE_WRITTEN) == CheckpointMeta(
        revision=9, journal_index=4, compact_revision=5, compaction_finished=False, leases=((7, 60),))
    assert CheckpointMeta.decode(RESTORE_WRITTEN) == CheckpointMeta(
        revision=12, compact_revision=10, compaction_finished=False)
    assert CheckpointMeta.decode(NOTHING_COMPACTED) == CheckpointMeta(revision=1)


@pytest.mark.parametrize("meta", [
    CheckpointMeta(revision=1),
    CheckpointMeta(revision=9, journal_index=4, compact_revision=5, compaction_finished=False, leases=((7, 60),)),
    CheckpointMeta(revision=30, journal_index=20, compact_revision=30, epoch=3, leader_id=0xabc),
])
def test_encoding_round_trips_and_keeps_the_earlier_field_meanings(meta):
    assert CheckpointMeta.decode(meta.encode()) == meta
    raw = json.loads(meta.encode())
    # what an earlier brain reads: -1 for "none" and "unfinished"
    assert raw["compact_rev"] == (-1 if meta.compact_revision is None else meta.compact_revision)
    assert (raw["compact_done_rev"] == raw["compact_rev"]) == meta.compaction_finished
    assert raw.get("epoch", 0) == meta.epoch and raw.get("leader_id", 0) == meta.leader_id


def test_an_unfinished_compaction_needs_its_revision():
    with pytest.raises(ValueError):
        CheckpointMeta(revision=3, compaction_finished=False)


def test_a_data_dir_with_an_earlier_checkpoint_opens_and_resumes_its_compaction(tmp_path):
    """A checkpoint in the earlier engine's words (compact_done_rev -1: the
    physical compaction to 3 was under way) opens, and the compaction
    finishes."""
    config = EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[])
    eng = Engine.open(config)
    for i in range(4):
        eng.put(PutRequest(b"k", b"v%d" % i))  # revisions 2..5
    eng.checkpoint()
    index = eng.journal.last_index
    eng.close()
    be = backend_mod.open_backend("lmdb", str(tmp_path / "data" / "values"), 1)
    be.write(backend_mod.WriteBatch(meta={META_CHECKPOINT: json.dumps({
        "revision": 5, "compact_rev": 3, "compact_done_rev": -1, "journal_index": index,
        "leases": [], "epoch": 0, "leader_id": 0}).encode()}))
    be.close()
    eng = Engine.open(config)
    try:
        assert eng.statistics().compact_revision == 3
        assert [kv.value for kv in eng.range(RangeRequest(b"k", revision=3)).kvs] == [b"v1"]
        eng.compact(CompactRequest(4, physical=True))  # waits for physical compaction, the resumed one first
        assert eng.checkpoint_index() == index
        assert [kv.value for kv in eng.range(RangeRequest(b"k")).kvs] == [b"v3"]
    finally:
        eng.close()
