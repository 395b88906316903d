"""Pure frame encoding/decoding: round trips, truncation, damage, chaining."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brain.journal.framing import DecodeEnd, Frame, Stop, decode_frames, encode_frame, frame_size
from brain.journal.framing import data_end, find_chained_frame, first_nonzero

payloads = st.lists(st.binary(min_size=1, max_size=300), max_size=20)
crcs = st.integers(min_value=0, max_value=0xFFFFFFFF)


def encode_all(items: list[bytes], prev_crc: int) -> tuple[bytes, list[int]]:
    out, chain = [], []
    crc = prev_crc
    for payload in items:
        frame, crc = encode_frame(payload, crc)
        out.append(frame)
        chain.append(crc)
    return b"".join(out), chain


def decode_all(buffer: bytes, start: int = 0, prev_crc: int = 0) -> tuple[list[Frame], DecodeEnd]:
    items = list(decode_frames(buffer, start, prev_crc))
    *frames, end = items
    assert all(isinstance(f, Frame) for f in frames)
    assert isinstance(end, DecodeEnd)
    return frames, end


def test_frame_layout_matches_the_spec():
    payload = b"hello"
    frame, crc = encode_frame(payload, 1234)
    assert crc == zlib.crc32(struct.pack("<I", 5) + payload, 1234)
    assert frame[:8] == struct.pack("<II", 5, crc)
    assert frame[8:13] == payload
    assert frame[13:] == bytes(3)
    assert len(frame) == frame_size(5) == 16


@given(payloads, crcs, st.integers(min_value=0, max_value=4))
def test_round_trip(items, prev_crc, zero_words):
    buffer, chain = encode_all(items, prev_crc)
    frames, end = decode_all(buffer + bytes(8 * zero_words), 0, prev_crc)
    assert [bytes(f.payload) for f in frames] == items
    assert [f.crc for f in frames] == chain
    offsets = [f.offset for f in frames]
    assert all(o % 8 == 0 for o in offsets)
    assert [f.end for f in frames] == (offsets[1:] + [len(buffer)] if frames else [])
    assert end.stop is Stop.CLEAN
    assert end.offset == len(buffer)
    assert end.crc == (chain[-1] if chain else prev_crc)


@given(payloads, crcs, st.data())
def test_truncation_yields_a_prefix(items, prev_crc, data):
    buffer, _ = encode_all(items, prev_crc)
    cut = data.draw(st.integers(min_value=0, max_value=len(buffer)))
    frames, end = decode_all(buffer[:cut], 0, prev_crc)
    assert [bytes(f.payload) for f in frames] == items[: len(frames)]
    boundaries = {0, len(buffer)} | {f.end for f in decode_all(buffer, 0, prev_crc)[0]}
    if cut in boundaries:
        assert end.stop is Stop.CLEAN and end.offset == cut
    else:
        assert end.stop is Stop.INCOMPLETE
        assert end.offset == (frames[-1].end if frames else 0)


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=10), crcs, st.data())
def test_a_flipped_bit_is_never_accepted(items, prev_crc, data):
    buffer, _ = encode_all(items, prev_crc)
    good, _ = decode_all(buffer, 0, prev_crc)
    victim = data.draw(st.integers(min_value=0, max_value=len(items) - 1))
    frame = good[victim]
    # Any header or payload bit (padding is not covered by the crc).
    position = data.draw(st.integers(min_value=frame.offset, max_value=frame.offset + 8 + len(items[victim]) - 1))
    bit = data.draw(st.integers(min_value=0, max_value=7))
    damaged = bytearray(buffer)
    damaged[position] ^= 1 << bit
    frames, end = decode_all(bytes(damaged), 0, prev_crc)
    assert len(frames) == victim
    assert [bytes(f.payload) for f in frames] == items[:victim]
    assert end.offset == frame.offset
    assert end.stop in (Stop.CORRUPT, Stop.INCOMPLETE, Stop.CLEAN)


def test_chained_crc_rejects_a_stale_frame():
    # Old contents: a, b, c. New contents overwrite only the first frame with
    # a same-sized one; b and c are stale and must not validate.
    old, _ = encode_all([b"a" * 10, b"b" * 10, b"c" * 10], 0)
    new, _ = encode_all([b"x" * 10], 0)
    frames, end = decode_all(new + old[len(new):])
    assert [bytes(f.payload) for f in frames] == [b"x" * 10]
    assert end.stop is Stop.CORRUPT and end.offset == len(new)


def test_wrong_previous_crc_rejects_the_first_frame():
    buffer, _ = encode_all([b"payload"], 7)
    _, end = decode_all(buffer, 0, 8)
    assert end.stop is Stop.CORRUPT and end.offset == 0


def test_decoding_from_an_offset_continues_the_chain():
    buffer, chain = encode_all([b"one", b"two", b"three"], 0)
    first_end = frame_size(3)
    frames, end = decode_all(buffer, first_end, chain[0])
    assert [bytes(f.payload) for f in frames] == [b"two", b"three"]
    assert end.stop is Stop.CLEAN


def test_zero_length_is_the_end_marker_and_cannot_be_encoded():
    with pytest.raises(ValueError):
        encode_frame(b"", 0)
    frames, end = decode_all(bytes(64))
    assert frames == [] and end.stop is Stop.CLEAN and end.offset == 0


def test_short_tail():
    frames, end = decode_all(bytes(5))
    assert end.stop is Stop.CLEAN
    frames, end = decode_all(b"\x01\x00\x00")
    assert end.stop is Stop.INCOMPLETE and end.stored_crc is None


def test_unaligned_start_is_refused():
    with pytest.raises(ValueError):
        list(decode_frames(bytes(16), 4, 0))


def test_zero_scanning_helpers():
    buffer = bytes(100) + b"\x01" + bytes(70000) + b"\x02" + bytes(9)
    assert first_nonzero(buffer, 0) == 100
    assert first_nonzero(buffer, 101) == 100 + 1 + 70000
    assert first_nonzero(buffer, len(buffer) - 5) is None
    assert data_end(buffer, 0) == len(buffer) - 9
    assert data_end(buffer[:101 + 70000], 0) == 101
    assert data_end(bytes(10), 3) == 3


def test_find_chained_frame():
    buffer, chain = encode_all([b"a" * 20, b"b" * 30, b"c" * 5], 99)
    second = frame_size(20)
    assert find_chained_frame(buffer, 8, len(buffer), chain[0]) == second
    assert find_chained_frame(buffer, 8, len(buffer), 12345) is None


@settings(max_examples=50)
@given(st.binary(min_size=1, max_size=2000), crcs)
def test_random_garbage_never_decodes_to_frames_with_the_wrong_chain(garbage, prev_crc):
    # Garbage can only validate by a 2**-32 accident; hypothesis should never find one.
    frames, end = decode_all(garbage + bytes(-len(garbage) % 8), 0, prev_crc)
    assert frames == []
