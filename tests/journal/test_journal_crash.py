"""kill -9 a writer at random moments; every record it saw synced must survive.

kill -9 keeps the page cache, so some cycles also simulate a power loss:
everything in the last segment after the last synced record may be lost,
which is modelled by zeroing a random suffix of that unsynced region.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

from brain.journal import SegmentJournal, parse_segment_name
from brain.journal.segment import HEADER_FRAME_SIZE
from .journal_support import crash_payload, patch_bytes, read_bytes, record_frames, segment_paths

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHILD = os.path.join(HERE, "journal_crash_child.py")
SEGMENT_BYTES = 1 << 16
CYCLES = 8
TIME_BUDGET = 40.0  # seconds; stop early rather than run long


def run_child_until_killed(directory: str, seed: int, rng: random.Random) -> tuple[int, list[int]]:
    """Start a writer, kill -9 it at a random moment; return (its start index, synced indexes)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        [sys.executable, CHILD, directory, str(seed), str(SEGMENT_BYTES)],
        stdout=subprocess.PIPE, env=env,
    )
    lines: list[bytes] = []
    opened = threading.Event()

    def drain() -> None:
        for line in child.stdout:
            lines.append(line)
            opened.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert opened.wait(30), "child did not start"
        time.sleep(rng.uniform(0.0, 0.3))
    finally:
        child.kill()  # SIGKILL
        child.wait()
        reader.join(10)
    header, *rest = lines
    assert header.startswith(b"open "), header
    # A line cut by the kill has no newline and proves nothing.
    synced = [int(line) for line in rest if line.endswith(b"\n")]
    return int(header.split()[1]), synced


def lose_unsynced_tail(directory: str, synced_upto: int, rng: random.Random) -> None:
    """Zero a random suffix of the last segment after its last synced record."""
    path = segment_paths(directory)[-1]
    first = parse_segment_name(os.path.basename(path))
    frames = record_frames(path)
    durable = synced_upto - first + 1  # synced records in this segment
    assert durable <= len(frames)
    synced_end = frames[durable - 1].end if durable > 0 else HEADER_FRAME_SIZE
    data = read_bytes(path)
    data_end = len(data.rstrip(b"\0"))
    if data_end > synced_end:
        cut = rng.randint(synced_end, data_end)
        patch_bytes(path, cut, bytes(data_end - cut))


def test_kill_9_never_loses_a_synced_record(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    directory = str(tmp_path / "journal")
    synced_upto = 0
    started = time.monotonic()
    cycles = 0
    while cycles < CYCLES and time.monotonic() - started < TIME_BUDGET:
        cycles += 1
        start_index, synced = run_child_until_killed(directory, rng.getrandbits(32), rng)
        context = f"seed {seed}, cycle {cycles}"
        assert start_index >= synced_upto, f"{context}: child reopened without synced records"
        assert synced == list(range(start_index + 1, start_index + 1 + len(synced))), context
        synced_upto = max([synced_upto, *synced])
        if rng.random() < 0.5:
            lose_unsynced_tail(directory, synced_upto, rng)
        with SegmentJournal.open(directory, segment_bytes=SEGMENT_BYTES) as journal:
            assert journal.first_index == 1
            assert journal.last_index >= synced_upto, context
            count = 0
            for index, payload in journal.records():
                count += 1
                assert index == count, context
                assert payload == crash_payload(index), f"{context}: record {index} differs"
            assert count == journal.last_index, context
    assert cycles >= 3, "too few crash cycles ran within the time budget"
    assert synced_upto > 0, f"seed {seed}: nothing was ever synced"
