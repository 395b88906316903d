"""Recovery: torn tails are erased, any other damage is reported, never dropped."""

from __future__ import annotations

import os

import pytest

from brain.journal import JournalCorruptError, SegmentJournal, segment_name
from brain.journal.segment import HEADER_FRAME_SIZE, decode_segment_header
from .journal_support import (
    patch_bytes,
    payload_for,
    read_bytes,
    record_frames,
    rewrite_as_legacy,
    segment_paths,
)


def build(jdir, count, *, segment_bytes=1 << 20, preallocate=True, max_len=300) -> dict[int, bytes]:
    written = {}
    with SegmentJournal.open(jdir, segment_bytes=segment_bytes, preallocate=preallocate) as journal:
        for index in range(1, count + 1):
            written[index] = payload_for(index, max_len) + b"tail" * 20  # no tiny payloads
            assert journal.append(written[index]) == index
        journal.sync()
    return written


def snapshot(jdir) -> dict[str, bytes]:
    return {name: read_bytes(os.path.join(jdir, name)) for name in os.listdir(jdir)}


# --- torn tails ----------------------------------------------------------------


def truncate_mid_frame(path, frame):
    os.truncate(path, frame.offset + 8 + len(frame.payload) // 2)


def truncate_mid_header(path, frame):
    os.truncate(path, frame.offset + 4)


def truncate_after_header(path, frame):
    os.truncate(path, frame.offset + 8)


def truncate_at_frame_start(path, frame):
    os.truncate(path, frame.offset)


def zero_tail_bytes(path, frame):
    start = frame.offset + 8 + len(frame.payload) // 3
    patch_bytes(path, start, bytes(frame.end - start))


def zero_whole_frame(path, frame):
    patch_bytes(path, frame.offset, bytes(frame.end - frame.offset))


def garbage_in_payload(path, frame):
    patch_bytes(path, frame.offset + 8 + 5, os.urandom(len(frame.payload) - 10))


def garbage_in_crc_field(path, frame):
    patch_bytes(path, frame.offset + 4, b"\xde\xad\xbe\xef")


# What a write cut short by a crash can leave: the file keeps its length.
TORN = [
    zero_tail_bytes,
    zero_whole_frame,
    garbage_in_payload,
    garbage_in_crc_field,
]
# A shorter file: only the torn tail of a segment written before sizes were
# recorded (one created without preallocation ended where its data did).
TRUNCATIONS = [
    truncate_mid_frame,
    truncate_mid_header,
    truncate_after_header,
]


@pytest.mark.parametrize("damage, legacy", [(d, False) for d in TORN] + [(d, True) for d in TORN + TRUNCATIONS],
                         ids=lambda x: x.__name__ if callable(x) else ("legacy" if x else "sized"))
@pytest.mark.parametrize("preallocate", [True, False], ids=["prealloc", "no-prealloc"])
@pytest.mark.parametrize("segment_bytes", [1 << 20, 2048], ids=["one-segment", "many-segments"])
def test_torn_tail_recovers_exactly_the_complete_records(jdir, damage, legacy, preallocate, segment_bytes):
    written = build(jdir, 30, segment_bytes=segment_bytes, preallocate=preallocate)
    if legacy:
        rewrite_as_legacy(jdir, keep_length=preallocate)
    last = segment_paths(jdir)[-1]
    frames = record_frames(last)
    damage(last, frames[-1])
    with SegmentJournal.open(jdir, segment_bytes=segment_bytes, preallocate=preallocate) as journal:
        assert journal.last_index == 29
        assert dict(journal.records()) == {i: written[i] for i in range(1, 30)}
        # The erased tail is zero (or gone), so a later crash cannot revive it.
        assert not any(read_bytes(last)[frames[-1].offset:])
        assert journal.append(b"replacement") == 30
        journal.append(b"next")
        journal.sync()
    with SegmentJournal.open(jdir, segment_bytes=segment_bytes, preallocate=preallocate) as journal:
        expected = {i: written[i] for i in range(1, 30)} | {30: b"replacement", 31: b"next"}
        assert dict(journal.records()) == expected


def test_torn_first_record_of_last_legacy_segment(jdir):
    written = build(jdir, 30, segment_bytes=2048)
    rewrite_as_legacy(jdir, keep_length=False)
    last = segment_paths(jdir)[-1]
    frames = record_frames(last)
    first_in_last = 31 - len(frames)
    os.truncate(last, frames[0].offset + 20)
    with SegmentJournal.open(jdir, segment_bytes=2048) as journal:
        assert journal.last_index == first_in_last - 1
        assert dict(journal.records()) == {i: written[i] for i in range(1, first_in_last)}


def test_legacy_segments_are_read_and_appended_to(jdir):
    """A journal written before segment sizes were recorded opens as it
    did, takes appends, and its next segment records its size."""
    written = build(jdir, 30, segment_bytes=2048, preallocate=False)
    rewrite_as_legacy(jdir, keep_length=False)
    with SegmentJournal.open(jdir, segment_bytes=2048) as journal:
        assert dict(journal.records()) == written
        for index in range(31, 61):
            written[index] = payload_for(index) + b"tail" * 20
            assert journal.append(written[index]) == index
        journal.sync()
    paths = segment_paths(jdir)
    sizes = [decode_segment_header(read_bytes(p), p)[0].size for p in paths]
    assert sizes[0] == 0 and sizes[-1] == 2048, sizes
    with SegmentJournal.open(jdir, segment_bytes=2048) as journal:
        assert dict(journal.records()) == written


# --- segments cut short: damage, not a crash --------------------------------------


@pytest.mark.parametrize("cut", TRUNCATIONS + [truncate_at_frame_start], ids=lambda f: f.__name__)
@pytest.mark.parametrize("preallocate", [True, False], ids=["prealloc", "no-prealloc"])
@pytest.mark.parametrize("segment_bytes", [1 << 20, 2048], ids=["one-segment", "many-segments"])
def test_last_segment_cut_short_is_refused(jdir, cut, preallocate, segment_bytes):
    """Issue 27: the records after the cut were acknowledged; a segment is
    never shorter than its recorded size after a crash, so this is refused,
    at a frame boundary too, where the rest of the file would look clean."""
    build(jdir, 30, segment_bytes=segment_bytes, preallocate=preallocate)
    last = segment_paths(jdir)[-1]
    victim = record_frames(last)[-3]
    cut(last, victim)
    error = open_expecting_corruption(jdir, last, victim.offset, segment_bytes=segment_bytes,
                                      preallocate=preallocate)
    assert "cut short" in error.reason and f"the {segment_bytes} it was created with" in error.reason


@pytest.mark.parametrize("length", [0, 4, 20, HEADER_FRAME_SIZE - 1], ids=lambda n: f"{n}-bytes")
@pytest.mark.parametrize("which", [0, -1], ids=["older", "newest"])
def test_segment_cut_inside_its_header_is_refused(jdir, length, which):
    build(jdir, 60, segment_bytes=2048)
    path = segment_paths(jdir)[which]
    os.truncate(path, length)
    error = open_expecting_corruption(jdir, path, 0, segment_bytes=2048)
    assert "cut short" in error.reason


def test_older_segment_cut_at_a_frame_boundary_is_refused_by_name(jdir):
    # Before sizes were recorded this was reported against the next segment
    # ("records ... are missing"), not the one that was cut.
    build(jdir, 60, segment_bytes=2048)
    path = segment_paths(jdir)[0]
    victim = record_frames(path)[-2]
    os.truncate(path, victim.offset)
    error = open_expecting_corruption(jdir, path, victim.offset, segment_bytes=2048)
    assert "cut short" in error.reason


def test_a_full_segment_is_not_cut_short(jdir):
    """A segment whose frames end exactly at its size is whole."""
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        journal.append(os.urandom(1024 - HEADER_FRAME_SIZE - 8))
        journal.append(b"next")
        journal.sync()
    first = segment_paths(jdir)[0]
    assert os.path.getsize(first) == 1024 and record_frames(first)[-1].end == 1024
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert journal.last_index == 2


def test_torn_large_frame(jdir):
    big = os.urandom(300_000)
    with SegmentJournal.open(jdir, segment_bytes=1 << 20) as journal:
        journal.append(b"first")
        journal.append(big)
        journal.sync()
    (path,) = segment_paths(jdir)
    frame = record_frames(path)[-1]
    patch_bytes(path, frame.offset + 8 + 150_000, bytes(frame.end - frame.offset - 8 - 150_000))
    with SegmentJournal.open(jdir) as journal:
        assert list(journal.records()) == [(1, b"first")]


# --- corruption that must be reported -------------------------------------------


def open_expecting_corruption(jdir, path, offset, **options) -> JournalCorruptError:
    before = snapshot(jdir)
    with pytest.raises(JournalCorruptError) as caught:
        SegmentJournal.open(jdir, **options)
    error = caught.value
    assert error.path == path
    assert error.offset == offset
    assert path in str(error) and str(offset) in str(error)
    assert snapshot(jdir) == before, "a failed open must not modify the journal"
    return error


def test_flipped_byte_in_an_earlier_record(jdir):
    build(jdir, 10)
    (path,) = segment_paths(jdir)
    victim = record_frames(path)[2]
    patch_bytes(path, victim.offset + 8 + 3, bytes([victim.payload[3] ^ 0x40]))
    error = open_expecting_corruption(jdir, path, victim.offset)
    assert "crc mismatch" in error.reason


@pytest.mark.parametrize("which", ["first", "last"])
def test_flipped_byte_in_a_segment_that_is_not_the_last(jdir, which):
    build(jdir, 60, segment_bytes=2048)
    path = segment_paths(jdir)[1]
    frames = record_frames(path)
    victim = frames[0] if which == "first" else frames[-1]
    patch_bytes(path, victim.offset + 8, bytes([victim.payload[0] ^ 1]))
    error = open_expecting_corruption(jdir, path, victim.offset, segment_bytes=2048)
    assert "not the last" in error.reason


def test_deleted_middle_segment(jdir):
    build(jdir, 60, segment_bytes=2048)
    paths = segment_paths(jdir)
    assert len(paths) >= 3
    os.unlink(paths[1])
    error = open_expecting_corruption(jdir, paths[2], 0, segment_bytes=2048)
    assert "missing" in error.reason


def test_truncated_segment_that_is_not_the_last(jdir):
    build(jdir, 60, segment_bytes=2048, preallocate=False)
    path = segment_paths(jdir)[0]
    victim = record_frames(path)[-1]
    os.truncate(path, victim.offset + 12)
    error = open_expecting_corruption(jdir, path, victim.offset, segment_bytes=2048)
    assert "cut short" in error.reason


def test_zeroed_header_in_the_middle(jdir):
    build(jdir, 10)
    (path,) = segment_paths(jdir)
    victim = record_frames(path)[4]
    patch_bytes(path, victim.offset, bytes(8))
    error = open_expecting_corruption(jdir, path, victim.offset)
    assert "non-zero data follows" in error.reason


@pytest.mark.parametrize("preallocate", [True, False], ids=["prealloc", "no-prealloc"])
def test_damaged_length_field_does_not_hide_later_records(jdir, preallocate):
    # A larger length makes the frame claim the rest of the data, so "zeros
    # after the bad frame" alone would call it torn and drop records 3..10.
    build(jdir, 10, preallocate=preallocate)
    (path,) = segment_paths(jdir)
    victim = record_frames(path)[2]
    bogus = len(victim.payload) + (8192 if preallocate else 1 << 24)
    patch_bytes(path, victim.offset, bogus.to_bytes(4, "little"))
    error = open_expecting_corruption(jdir, path, victim.offset, preallocate=preallocate)
    assert "damaged length" in error.reason


def test_garbage_after_the_end_of_the_last_segment(jdir):
    build(jdir, 10, segment_bytes=1 << 16)
    (path,) = segment_paths(jdir)
    end = record_frames(path)[-1].end
    patch_bytes(path, 40_000, b"junk")
    error = open_expecting_corruption(jdir, path, end, segment_bytes=1 << 16)
    assert "40000" in error.reason


def test_garbage_in_last_payload_with_data_after_it(jdir):
    build(jdir, 10, segment_bytes=1 << 16)
    (path,) = segment_paths(jdir)
    victim = record_frames(path)[-1]
    patch_bytes(path, victim.offset + 9, b"\xff")
    patch_bytes(path, victim.end + 800, b"\x01")
    open_expecting_corruption(jdir, path, victim.offset, segment_bytes=1 << 16)


def test_damaged_segment_header(jdir):
    build(jdir, 60, segment_bytes=2048)
    path = segment_paths(jdir)[-1]
    patch_bytes(path, 8, b"XXXX")  # inside the magic
    open_expecting_corruption(jdir, path, 0, segment_bytes=2048)


def test_segment_name_must_match_its_header(jdir):
    build(jdir, 5)
    (path,) = segment_paths(jdir)
    renamed = os.path.join(jdir, segment_name(7))
    os.rename(path, renamed)
    error = open_expecting_corruption(jdir, renamed, 0)
    assert "name says 7" in error.reason


def test_segment_from_another_chain(jdir, tmp_path):
    # Same indexes and sizes, different history: the crc chain does not continue.
    written = build(jdir, 60, segment_bytes=2048)
    other = str(tmp_path / "other")
    with SegmentJournal.open(other, segment_bytes=2048) as journal:
        for index in range(1, 61):
            journal.append(bytes(b ^ 1 for b in written[index]))
        journal.sync()
    mine, theirs = segment_paths(jdir), segment_paths(other)
    assert [os.path.basename(p) for p in mine] == [os.path.basename(p) for p in theirs]
    os.replace(theirs[1], mine[1])
    error = open_expecting_corruption(jdir, mine[1], 0, segment_bytes=2048)
    assert "crc chain" in error.reason
