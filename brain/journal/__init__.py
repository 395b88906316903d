"""Append-only journals of opaque records: the engine's write-ahead log.

protocol.py: the contract every journal keeps (Journal, SharedJournal).
The local implementation: framing.py (pure frame encoding/decoding),
segment.py (segment files and their validation), segment_journal.py
(SegmentJournal: append, sync, replay, release, recovery).  The replicated
one: jetstream.py (JetStreamJournal, a NATS JetStream stream).  errors.py:
the error contract.
"""

from .errors import (
    JournalCorruptError,
    JournalError,
    JournalFailedError,
    JournalFencedError,
    JournalPurgedError,
    JournalUnavailableError,
    JournalWriteError,
)
from .framing import DecodeEnd, Frame, Stop, decode_frames, encode_frame, frame_size
from .protocol import Journal, SharedJournal
from .segment import SegmentHeader, parse_segment_name, segment_name
from .segment_journal import DEFAULT_SEGMENT_BYTES, SegmentJournal, SegmentJournalStatistics

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "DecodeEnd",
    "Frame",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalFailedError",
    "JournalFencedError",
    "JournalPurgedError",
    "JournalUnavailableError",
    "JournalWriteError",
    "SegmentHeader",
    "SegmentJournal",
    "SegmentJournalStatistics",
    "SharedJournal",
    "Stop",
    "decode_frames",
    "encode_frame",
    "frame_size",
    "parse_segment_name",
    "segment_name",
]
