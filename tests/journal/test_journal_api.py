"""Journal behaviour without failures: append, rollover, replay, release."""

from __future__ import annotations

import os

import pytest

from brain.journal import JournalError, SegmentJournal, SegmentJournalStatistics, parse_segment_name, segment_name
from brain.journal.segment import HEADER_FRAME_SIZE, decode_segment_header
from .journal_support import payload_for, read_bytes, record_frames, segment_paths


def fill(journal: SegmentJournal, count: int) -> dict[int, bytes]:
    written = {}
    for _ in range(count):
        index = journal.last_index + 1
        payload = payload_for(index)
        assert journal.append(payload) == index
        written[index] = payload
    return written


def test_indexes_start_at_one_and_replay_after_reopen(jdir):
    with SegmentJournal.open(jdir) as journal:
        assert journal.last_index == 0 and journal.first_index == 1
        assert list(journal.records()) == []
        written = fill(journal, 50)
        assert dict(journal.records()) == written  # visible before sync
        journal.sync()
    with SegmentJournal.open(jdir) as journal:
        assert journal.last_index == 50
        assert list(journal.records()) == sorted(written.items())
        assert journal.append(b"more") == 51


@pytest.mark.parametrize("preallocate", [True, False])
def test_rollover_and_replay_across_segments(jdir, preallocate):
    with SegmentJournal.open(jdir, segment_bytes=2048, preallocate=preallocate) as journal:
        written = fill(journal, 200)
        journal.sync()
        assert journal.statistics().segments == len(segment_paths(jdir)) > 5
    paths = segment_paths(jdir)
    # Names follow the first index, and each segment continues the previous.
    expected_first = 1
    for path in paths:
        assert parse_segment_name(os.path.basename(path)) == expected_first
        assert os.path.basename(path) == segment_name(expected_first)
        size = os.path.getsize(path)
        assert size == 2048 if preallocate else size <= 2048
        expected_first += len(record_frames(path))
    assert expected_first == 201
    with SegmentJournal.open(jdir, segment_bytes=2048, preallocate=preallocate) as journal:
        assert list(journal.records()) == sorted(written.items())


def test_a_payload_larger_than_a_segment_gets_its_own(jdir):
    big = os.urandom(10_000)
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        journal.append(b"small")
        assert journal.append(big) == 2
        assert journal.append(b"after") == 3
        journal.sync()
    paths = segment_paths(jdir)
    assert [len(record_frames(p)) for p in paths] == [1, 1, 1]
    assert os.path.getsize(paths[1]) >= 10_000 + HEADER_FRAME_SIZE
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert list(journal.records()) == [(1, b"small"), (2, big), (3, b"after")]


def test_a_big_first_payload_grows_the_empty_segment(jdir):
    big = os.urandom(5000)
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert journal.append(big) == 1
        journal.sync()
    (path,) = segment_paths(jdir)
    # replaced by a larger segment, which records its own size
    header, _ = decode_segment_header(read_bytes(path), path)
    assert header.size == os.path.getsize(path) >= 5000 + HEADER_FRAME_SIZE
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert list(journal.records()) == [(1, big)]


def test_records_after_index(jdir):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        written = fill(journal, 60)
        for after in range(0, 62):
            assert list(journal.records(after)) == [(i, written[i]) for i in range(after + 1, 61)]
        with pytest.raises(ValueError):
            journal.records(-1)


def test_records_skip_whole_segments_without_reading_them(jdir):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        written = fill(journal, 60)
        journal.sync()
        first_segment = segment_paths(jdir)[0]
        last_of_first = len(record_frames(first_segment))
        # Damage the first segment behind the journal's back: a replay that
        # starts after it must not even open it.
        with open(first_segment, "r+b") as f:
            f.write(bytes(HEADER_FRAME_SIZE + 8))
        assert list(journal.records(last_of_first)) == [
            (i, written[i]) for i in range(last_of_first + 1, 61)
        ]


def test_records_is_a_snapshot(jdir):
    with SegmentJournal.open(jdir) as journal:
        fill(journal, 3)
        iterator = journal.records()
        journal.append(b"late")
        assert [i for i, _ in iterator] == [1, 2, 3]


def test_release(jdir):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        written = fill(journal, 100)
        journal.sync()
        ranges = []
        first = 1
        for path in segment_paths(jdir):
            count = len(record_frames(path))
            ranges.append((path, first, first + count - 1))
            first += count
        assert len(ranges) >= 4
        _, _, last_of_second = ranges[1]
        # One short of the second segment's end keeps it.
        assert journal.release(last_of_second - 1) == 1
        assert segment_paths(jdir) == [p for p, _, _ in ranges[1:]]
        assert journal.release(last_of_second) == 1
        assert journal.first_index == last_of_second + 1
        assert list(journal.records(last_of_second)) == [
            (i, written[i]) for i in range(last_of_second + 1, 101)
        ]
        with pytest.raises(JournalError, match="released"):
            journal.records(last_of_second - 1)
        # Releasing everything still keeps the active segment.
        journal.release(10**9)
        assert segment_paths(jdir) == [ranges[-1][0]]
        assert journal.append(b"x") == 101
        journal.sync()
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert journal.first_index == ranges[-1][1]
        assert journal.last_index == 101
        assert list(journal.records(journal.first_index - 1))[-1] == (101, b"x")


def test_statistics(jdir):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        stats = journal.statistics()
        assert stats == SegmentJournalStatistics(1, HEADER_FRAME_SIZE, 0, 0, 0.0, 0.0)
        fill(journal, 40)
        journal.sync()
        journal.sync()  # nothing new: no fdatasync
        stats = journal.statistics()
    assert stats.appended_records == 40
    assert stats.segments == len(segment_paths(jdir))
    assert stats.bytes == sum(record_frames(p)[-1].end for p in segment_paths(jdir))
    # One sync per completed segment plus the explicit one.
    assert stats.syncs == stats.segments
    assert 0 < stats.last_sync_seconds <= stats.total_sync_seconds
    with pytest.raises(Exception):
        stats.syncs = 0  # frozen


def test_second_open_is_refused_while_open(jdir):
    with SegmentJournal.open(jdir):
        with pytest.raises(JournalError, match="already open"):
            SegmentJournal.open(jdir)
    SegmentJournal.open(jdir).close()


def test_closed_journal_refuses_use(jdir):
    journal = SegmentJournal.open(jdir)
    journal.close()
    journal.close()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        journal.append(b"x")
    with pytest.raises(JournalError, match="closed"):
        journal.sync()
    with pytest.raises(JournalError, match="closed"):
        journal.records()


def test_empty_payload_is_refused(jdir):
    with SegmentJournal.open(jdir) as journal:
        with pytest.raises(ValueError):
            journal.append(b"")
        assert journal.append(b"ok") == 1


def test_leftover_temporary_segment_is_removed(jdir):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        written = fill(journal, 5)
        journal.sync()
    leftover = os.path.join(jdir, segment_name(6) + ".tmp")
    with open(leftover, "wb") as f:
        f.write(b"half-made segment")
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert not os.path.exists(leftover)
        assert dict(journal.records()) == written


def test_unsynced_appends_survive_a_clean_close(jdir):
    with SegmentJournal.open(jdir) as journal:
        written = fill(journal, 10)
    with SegmentJournal.open(jdir) as journal:
        assert dict(journal.records()) == written


def test_preallocated_space_stays_zero_after_records(jdir):
    with SegmentJournal.open(jdir, segment_bytes=4096) as journal:
        fill(journal, 3)
        journal.sync()
    (path,) = segment_paths(jdir)
    data = read_bytes(path)
    assert len(data) == 4096
    assert not any(data[record_frames(path)[-1].end:])
