"""The spare: the next segment preallocated ahead of need, on a real
filesystem that runs out of space (a small tmpfs and a file filling it).

* a rollover on a full filesystem takes the spare and allocates nothing:
  the append succeeds and every record is there after a reopen; only the
  next spare cannot be made (``reserve_error``: ENOSPC), and ``reserve()``
  makes it once there is space again;
* without a spare, or for a frame larger than a segment, an append on a
  full filesystem fails with JournalWriteError (ENOSPC), leaves no file
  behind and the journal usable;
* the spare outlives a restart, and what a crash leaves of one (its
  temporary file, a spare that got its header but no new name) is cleaned
  up or reused.

Mounting needs root: under CI its absence fails the test.
"""

from __future__ import annotations

import errno
import os

import pytest

from brain.journal import JournalWriteError, SegmentJournal, frame_size
from brain.journal.segment import SPARE_NAME, SPARE_TEMP_NAME, SegmentHeader, encode_segment_header
from tests.support.small_fs import SmallFilesystem
from .journal_support import segment_paths

SEGMENT = 64 << 10


@pytest.fixture
def small_fs(tmp_path):
    fs = SmallFilesystem(tmp_path / "fs", "1m")
    yield fs
    fs.unmount()


def names(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n != "filler")


def fill_segment(journal: SegmentJournal, record: bytes, before: int = 0) -> list[int]:
    """Append ``record`` until the active segment (of SEGMENT bytes, after
    segments holding ``before`` bytes) has no room for another."""
    appended = []
    while journal.statistics().bytes - before + frame_size(len(record)) <= SEGMENT:
        appended.append(journal.append(record))
    return appended


def test_a_rollover_on_a_full_filesystem_takes_the_spare(small_fs):
    jdir = str(small_fs.path)
    record = os.urandom(3000)
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        assert SPARE_NAME in names(jdir) and journal.reserve_error is None
        first = fill_segment(journal, record)
        journal.sync()
        small_fs.fill(SEGMENT // 2)
        # the rollover: the spare becomes the second segment
        completed = journal.statistics().bytes
        second = [journal.append(record)] + fill_segment(journal, record, completed)
        journal.sync()
        assert len(segment_paths(jdir)) == 2
        err = journal.reserve_error
        assert err is not None and err.errno == errno.ENOSPC, err
        assert names(jdir) == [os.path.basename(p) for p in segment_paths(jdir)], names(jdir)
        with pytest.raises(JournalWriteError) as caught:
            journal.reserve()
        assert caught.value.errno == errno.ENOSPC
        # no spare now: the next rollover needs space and fails, leaving the journal usable
        with pytest.raises(JournalWriteError) as caught:
            journal.append(record)
        assert caught.value.errno == errno.ENOSPC
        assert names(jdir) == [os.path.basename(p) for p in segment_paths(jdir)], names(jdir)
        assert journal.last_index == second[-1]
        small_fs.release()
        journal.reserve()
        assert journal.reserve_error is None and SPARE_NAME in names(jdir)
        third = journal.append(record)
        journal.sync()
        assert third == second[-1] + 1
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        got = list(journal.records())
    assert [i for i, _ in got] == first + second + [third]
    assert all(payload == record for _, payload in got)


def test_a_frame_larger_than_a_segment_needs_space(small_fs):
    jdir = str(small_fs.path)
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        journal.append(b"small")
        journal.sync()
        small_fs.fill(SEGMENT // 2)
        big = os.urandom(2 * SEGMENT)
        with pytest.raises(JournalWriteError) as caught:
            journal.append(big)
        assert caught.value.errno == errno.ENOSPC
        assert journal.reserve_error is None and SPARE_NAME in names(jdir)  # the spare is kept
        assert len(segment_paths(jdir)) == 1
        assert journal.append(b"fits") == 2
        small_fs.release()
        assert journal.append(big) == 3
        journal.sync()
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        assert [p for _, p in journal.records()] == [b"small", b"fits", big]


def test_the_spare_outlives_a_restart_and_a_crash(tmp_path):
    jdir = str(tmp_path / "journal")
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT):
        pass
    spare = os.path.join(jdir, SPARE_NAME)
    inode = os.stat(spare).st_ino
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        assert os.stat(spare).st_ino == inode, "a whole spare is kept"
        assert journal.append(b"one") == 1
        journal.sync()
    # A crash while a spare was made leaves its temporary file; one while
    # the spare became a segment, a spare with a header and its old name.
    with open(os.path.join(jdir, SPARE_TEMP_NAME), "wb") as f:
        f.write(b"\0" * 100)
    frame, _ = encode_segment_header(SegmentHeader(2, 12345, SEGMENT))
    with open(spare, "r+b") as f:
        f.write(frame)
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        assert SPARE_TEMP_NAME not in os.listdir(jdir)
        journal.append(os.urandom(SEGMENT // 2))
        journal.append(os.urandom(SEGMENT // 2))  # rolls over into the spare
        journal.sync()
        assert len(segment_paths(jdir)) == 2 and SPARE_NAME in os.listdir(jdir)
    with SegmentJournal.open(jdir, segment_bytes=SEGMENT) as journal:
        assert [i for i, _ in journal.records()] == [1, 2, 3]
    # a spare of another segment size (the flag changed) is replaced
    with SegmentJournal.open(jdir, segment_bytes=2 * SEGMENT) as journal:
        assert os.stat(spare).st_size == 2 * SEGMENT and journal.reserve_error is None
