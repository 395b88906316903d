"""A checkpoint load reports its progress: load_records calls its progress
callback while scanning and packing, and recovery's LoadProgressLog turns
the calls into log lines."""

from __future__ import annotations

import logging

from brain.backend import MemoryBackend, WriteBatch
from brain.engine.recovery import LoadProgressLog
from brain.mvcc.replay import PROGRESS_STEP
from brain.mvcc.requests import PutRequest
from brain.mvcc.store import Store

KEYS = PROGRESS_STEP + 1000


def test_checkpoint_load_reports_records_scanned_and_keys_packed(caplog):
    store = Store(MemoryBackend(1))
    for start in range(0, KEYS, 1000):
        store.apply([PutRequest(b"/k/%06d" % i, b"v") for i in range(start, min(start + 1000, KEYS))])
    cut = store.checkpoint_cut()
    store.backend.write(WriteBatch(puts=list(cut.records())))
    store.checkpoint_done()

    calls: list[tuple[int, int]] = []
    log_lines = LoadProgressLog(KEYS, every=0.0)

    def progress(scanned: int, packed: int) -> None:
        calls.append((scanned, packed))
        log_lines(scanned, packed)

    restored = Store(store.backend)
    with caplog.at_level(logging.INFO, logger="brain.engine"):
        restored.load_records([], progress)
    assert calls[0] == (PROGRESS_STEP, 0)  # during the scan
    assert calls[-1] == (KEYS, KEYS)  # the last block packed
    assert [packed for _, packed in calls] == sorted(packed for _, packed in calls)
    assert restored.keys_total() == KEYS
    assert f"loading checkpoint: {PROGRESS_STEP} of {KEYS} records scanned" in caplog.text
    assert f"{KEYS} of {KEYS} records scanned" in caplog.text
