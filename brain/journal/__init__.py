"""Append-only, CRC-framed, segmented write-ahead journal of opaque records.

framing.py: pure frame encoding/decoding; segment.py: segment files and
their validation; journal.py: the Journal (append, sync, replay, release,
recovery); errors.py: the error contract.
"""

from .errors import JournalCorruptError, JournalError, JournalFailedError, JournalWriteError
from .framing import DecodeEnd, Frame, Stop, decode_frames, encode_frame, frame_size
from .journal import DEFAULT_SEGMENT_BYTES, Journal, JournalStatistics
from .segment import SegmentHeader, parse_segment_name, segment_name

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "DecodeEnd",
    "Frame",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalFailedError",
    "JournalStatistics",
    "JournalWriteError",
    "SegmentHeader",
    "Stop",
    "decode_frames",
    "encode_frame",
    "frame_size",
    "parse_segment_name",
    "segment_name",
]
