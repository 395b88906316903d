"""Segment files: naming, header frame, validation and creation.

A segment is one file ``<first_index as 16 hex digits>.journal``. It starts
with a header frame, then record frames, then zeros (preallocated space, or
a hole when created without preallocation) up to the size it was created
with. Record indexes are not stored: record k of a segment has index
first_index + k.

The header frame holds magic, format version, first_index, the chain crc of
the previous segment's last record and the segment's size; it is chained
from HEADER_SEED and the first record is chained from the header frame. So
each segment validates on its own, and the journal checks that consecutive
segments continue each other (index and crc) to detect a missing segment.

Invariant: a segment file is never shorter than the size in its header. It
is created at that size under a temporary name, fsynced and only then
renamed, and appends stay inside it, so a crash cannot shorten it: a
shorter file was cut by something else, and is refused (scan_segment), as
is one shorter than its header. Segments written before the size was
recorded (header size 0) cannot be checked so; for them end of file counts
as zeros, as it always did.

Torn-tail rule (only the last segment can have one; see scan_segment): a bad
frame is a torn write only if nothing after it looks like data. Everything
else is corruption and is reported, never silently dropped.

The spare (``SPARE_NAME``): the next segment's file, preallocated ahead of
need (as etcd's WAL keeps its next file ready), so that a rollover takes
space it already holds instead of asking a filesystem that may be full.
It is zeros at the size of a segment, made under a temporary name and
renamed, so it either exists whole or not at all; becoming a segment, it
gets its header (written and synced before the rename), so a crash leaves
either the spare or a whole, empty segment.  A spare is never a segment:
recovery does not read it, and a brain that predates it ignores the file.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from dataclasses import dataclass

from .errors import JournalCorruptError
from .framing import (
    ALIGNMENT,
    Frame,
    Stop,
    data_end,
    decode_frames,
    encode_frame,
    find_chained_frame,
    first_nonzero,
    frame_size,
)

MAGIC = b"BRAINJNL"
FORMAT_VERSION = 1
HEADER_SEED = 0  # chain crc the header frame is encoded from
SUFFIX = ".journal"
TEMP_SUFFIX = ".journal.tmp"
SPARE_NAME = "next.journal.spare"  # matches neither a segment's name nor a temporary one's
SPARE_TEMP_NAME = SPARE_NAME + ".tmp"

# magic, version, flags, first_index, prev_crc, size in 8-byte units.  The
# last field was reserved (always 0) before sizes were recorded, and brains
# of that time ignore it, so recording it needs no new format version.
_HEADER_PAYLOAD = struct.Struct("<8sIIQII")
_MAX_SIZE = 0xFFFFFFFF * ALIGNMENT
HEADER_FRAME_SIZE = frame_size(_HEADER_PAYLOAD.size)

_NAME = re.compile(r"^([0-9a-f]{16})\.journal$")
_TEMP_NAME = re.compile(r"^[0-9a-f]{16}\.journal\.tmp$")


def segment_name(first_index: int) -> str:
    """File name of the segment whose first record has first_index."""
    return f"{first_index:016x}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """first_index encoded in a segment file name, None for other files."""
    match = _NAME.match(name)
    return int(match.group(1), 16) if match else None


def is_temp_name(name: str) -> bool:
    """True for a segment, or a spare, that was being created when the
    process stopped."""
    return _TEMP_NAME.match(name) is not None or name == SPARE_TEMP_NAME


@dataclass(frozen=True)
class SegmentHeader:
    first_index: int
    prev_crc: int  # chain crc of the previous segment's last record
    # Bytes the file was created with, a multiple of 8; 0: not recorded (a
    # segment written before sizes were, whose length proves nothing).
    size: int = 0
    version: int = FORMAT_VERSION


def encode_segment_header(header: SegmentHeader) -> tuple[bytes, int]:
    """Header frame bytes and the chain crc the first record continues from."""
    if header.size % ALIGNMENT or not 0 <= header.size <= _MAX_SIZE:
        raise ValueError(f"segment size {header.size} is not a multiple of {ALIGNMENT} up to {_MAX_SIZE}")
    payload = _HEADER_PAYLOAD.pack(
        MAGIC, header.version, 0, header.first_index, header.prev_crc, header.size // ALIGNMENT
    )
    return encode_frame(payload, HEADER_SEED)


@dataclass(frozen=True)
class TornTail:
    """A write cut short at the end of the last segment."""

    offset: int  # start of the torn frame: the records end here
    dirty_end: int  # [offset, dirty_end) holds its leftovers, to be zeroed
    reason: str


@dataclass(frozen=True)
class SegmentScan:
    """What validating one segment found."""

    header: SegmentHeader
    header_crc: int
    count: int  # number of valid records
    end: int  # byte offset just after the last valid record
    last_crc: int  # chain crc after the last valid record
    torn: TornTail | None


def decode_segment_header(buffer: bytes, path: str) -> tuple[SegmentHeader, int]:
    """Validate the header frame at offset 0; return it and its chain crc."""
    if len(buffer) < HEADER_FRAME_SIZE:
        raise JournalCorruptError(
            path, 0,
            f"segment is {len(buffer)} bytes, shorter than its {HEADER_FRAME_SIZE}-byte header: "
            "the file was cut short (a segment is complete before it is used)",
        )
    item = next(decode_frames(buffer, 0, HEADER_SEED))
    if not isinstance(item, Frame):
        raise JournalCorruptError(path, 0, f"bad segment header frame: {item.reason}")
    if len(item.payload) != _HEADER_PAYLOAD.size:
        raise JournalCorruptError(
            path, 0, f"segment header payload is {len(item.payload)} bytes, expected {_HEADER_PAYLOAD.size}"
        )
    magic, version, _flags, first_index, prev_crc, size_units = _HEADER_PAYLOAD.unpack(item.payload)
    if magic != MAGIC:
        raise JournalCorruptError(path, 0, f"bad segment magic {magic!r}")
    if version != FORMAT_VERSION:
        raise JournalCorruptError(path, 0, f"unsupported segment format version {version}")
    return SegmentHeader(first_index, prev_crc, size_units * ALIGNMENT, version), item.crc


def scan_segment(buffer: bytes, path: str, *, is_last: bool) -> SegmentScan:
    """Validate a whole segment image; raise JournalCorruptError if damaged.

    Pure: path is only used in messages. A segment shorter than the size
    its header records was cut short, which no crash does: refused, naming
    the offset where its intact records end. A bad frame is accepted as a
    torn tail (reported in .torn, not raised) only when all of these hold:

    * the segment is the last one (older segments were fdatasynced before
      their successor was created, so they cannot hold a torn write);
    * every byte after the frame's claimed end is zero, or there is none;
    * no frame after its header chains from its stored crc, which would mean
      its length field is damaged and real records follow;
    * it is not an end marker (zero length) followed by non-zero bytes.
    """
    header, header_crc = decode_segment_header(buffer, path)
    count = 0
    for item in decode_frames(buffer, HEADER_FRAME_SIZE, header_crc):
        if isinstance(item, Frame):
            count += 1
            continue
        end = item
    if len(buffer) < header.size:
        raise JournalCorruptError(
            path, end.offset,
            f"segment is {len(buffer)} bytes, shorter than the {header.size} it was created with: "
            f"the file was cut short (a crash cannot shorten a segment); its {count} records "
            "before this offset are intact, any after it are missing",
        )
    torn = None
    if end.stop is Stop.CLEAN:
        junk = first_nonzero(buffer, end.offset)
        if junk is not None:
            raise JournalCorruptError(
                path, end.offset,
                f"{end.reason} after record {header.first_index + count - 1}, "
                f"but non-zero data follows at offset {junk}",
            )
    elif not is_last:
        raise JournalCorruptError(
            path, end.offset, f"{end.reason} in a segment that is not the last one"
        )
    else:
        junk = first_nonzero(buffer, end.claimed_end) if end.claimed_end < len(buffer) else None
        if junk is not None:
            raise JournalCorruptError(
                path, end.offset, f"{end.reason}, and non-zero data follows at offset {junk}"
            )
        if end.stored_crc is not None:
            chained = find_chained_frame(
                buffer, end.offset + 8, data_end(buffer, end.offset), end.stored_crc
            )
            if chained is not None:
                raise JournalCorruptError(
                    path, end.offset,
                    f"{end.reason}, and a valid frame follows at offset {chained} "
                    "(damaged length field)",
                )
        torn = TornTail(end.offset, data_end(buffer, end.offset), end.reason)
    return SegmentScan(header, header_crc, count, end.offset, end.crc, torn)


# --- file handling -----------------------------------------------------------


def fsync_directory(directory: str) -> None:
    """Make renames and unlinks in directory durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_segment(
    directory: str, header: SegmentHeader, preallocate: bool
) -> tuple[str, int, int]:
    """Create a segment; return (path, fd positioned after the header, header crc).

    Built under a temporary name, header.size bytes long (preallocated, or
    a hole when preallocate is False), fsynced, then renamed (over an empty
    segment of the same name being replaced), so a segment file either does
    not exist or is complete at its recorded size. The caller must fsync
    the directory to make the rename durable. On failure nothing is left
    behind and the OSError (e.g. ENOSPC from preallocation) propagates.
    """
    if header.size < HEADER_FRAME_SIZE:
        raise ValueError(f"segment size {header.size} leaves no room for its header")
    path = os.path.join(directory, segment_name(header.first_index))
    temp = os.path.join(directory, segment_name(header.first_index) + ".tmp")
    frame, header_crc = encode_segment_header(header)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        if preallocate:
            os.posix_fallocate(fd, 0, header.size)
        else:
            os.ftruncate(fd, header.size)
        if os.pwrite(fd, frame, 0) != len(frame):
            raise OSError(errno.ENOSPC, "short write of segment header")
        os.fsync(fd)
        os.rename(temp, path)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    os.lseek(fd, len(frame), os.SEEK_SET)
    return path, fd, header_crc


def zero_range(fd: int, start: int, stop: int) -> None:
    """Overwrite [start, stop) with zeros (a torn tail, a failed append):
    the file keeps its length, and bytes already written need no new space."""
    chunk = bytes(min(stop - start, 1 << 20))
    offset = start
    while offset < stop:
        n = os.pwrite(fd, memoryview(chunk)[: stop - offset], offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "could not zero torn tail")
        offset += n


def create_spare(directory: str, size: int) -> None:
    """Preallocate the spare: ``size`` bytes of zeros, synced, under a
    temporary name and then renamed, so a spare file is always whole.  On
    failure nothing is left behind and the OSError (ENOSPC) propagates.
    No directory fsync: a spare lost in a crash is only made again."""
    path = os.path.join(directory, SPARE_NAME)
    temp = os.path.join(directory, SPARE_TEMP_NAME)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        os.rename(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def spare_size(directory: str) -> int:
    """The size of the spare in ``directory`` if it is there with all its
    space allocated, else 0."""
    try:
        st = os.stat(os.path.join(directory, SPARE_NAME))
    except FileNotFoundError:
        return 0
    return st.st_size if st.st_blocks * 512 >= st.st_size else 0


def segment_from_spare(directory: str, header: SegmentHeader) -> tuple[str, int, int]:
    """Make the spare the segment ``header`` describes (its size must be
    the spare's): the header frame written into space the spare holds and
    synced, then the rename.  Returns what create_segment returns; the
    caller must fsync the directory.  On failure the OSError propagates and
    the spare may be gone or still there, never a segment."""
    spare = os.path.join(directory, SPARE_NAME)
    path = os.path.join(directory, segment_name(header.first_index))
    frame, header_crc = encode_segment_header(header)
    fd = os.open(spare, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size != header.size:
            raise ValueError(f"the spare is {size} bytes, the segment {header.size}")
        if os.pwrite(fd, frame, 0) != len(frame):
            raise OSError(errno.ENOSPC, "short write of segment header")
        os.fdatasync(fd)
        os.rename(spare, path)
    except BaseException:
        os.close(fd)
        raise
    os.lseek(fd, len(frame), os.SEEK_SET)
    return path, fd, header_crc
