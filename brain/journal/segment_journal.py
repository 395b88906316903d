"""The local journal: an append-only, segmented sequence of opaque records
in files of one directory (the embedded default).

Records get consecutive indexes starting at 1. Appends go to the active
(last) segment; when a frame would not fit, the active segment is made
durable and a new one is created (see segment.py for the file format).
Appends never change a segment's length: a segment is created at the size
its header records and frames stay inside it (so a shorter file is damage).

Space: with preallocation (the default) the next segment's file is made
ahead of need, the spare (segment.py), at open and after every rollover
that used it, so a rollover allocates nothing and a full disk is found
while a whole segment of room is left, not by an append.  When the spare
cannot be made the journal goes on (``reserve_error`` says why, and
``reserve()`` tries again); only a rollover without one, or a frame larger
than a segment, allocates, and an append that fails so leaves nothing
behind (JournalWriteError).

Durability contract: append only writes to the page cache; nothing is durable
before sync() returns. A failed fdatasync poisons the journal for good.

Thread-safety: none, by design. One writer thread calls append, sync,
release and close. records() may be called from that thread between calls
(it snapshots what exists when called) but must not overlap release/close.
A second SegmentJournal on the same directory is refused (flock on the
directory).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from typing import Iterator

from .errors import JournalCorruptError, JournalError, JournalFailedError, JournalWriteError
from .framing import Frame, decode_frames, encode_frame
from .segment import (
    HEADER_FRAME_SIZE,
    SPARE_NAME,
    SegmentHeader,
    create_segment,
    create_spare,
    fsync_directory,
    is_temp_name,
    parse_segment_name,
    scan_segment,
    segment_from_spare,
    segment_name,
    spare_size,
    zero_range,
)

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_SEGMENT_BYTES = 64 * MiB


@dataclass(frozen=True)
class SegmentJournalStatistics:
    segments: int  # segment files currently retained
    bytes: int  # bytes of frames in them (headers included, free space not)
    appended_records: int  # appended through this instance
    syncs: int  # fdatasync calls made (by sync() and at segment rollover)
    last_sync_seconds: float
    total_sync_seconds: float


@dataclass(slots=True)
class _Segment:
    # For the active segment, count/end/last_crc are only brought up to date
    # by SegmentJournal._settle(); the hot path keeps them in its own fields.
    path: str
    first_index: int
    prev_crc: int  # the header's: chain crc of the previous segment's last record
    header_crc: int
    count: int
    end: int
    last_crc: int

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


class SegmentJournal:
    """Append-only write-ahead journal of opaque byte records. Use SegmentJournal.open."""

    def __init__(
        self,
        directory: str,
        dir_fd: int,
        segment_bytes: int,
        preallocate: bool,
        segments: list[_Segment],
        fd: int,
        limit: int,
    ) -> None:
        active = segments[-1]
        self._directory = directory
        self._dir_fd = dir_fd  # holds the flock; fsynced after renames/unlinks
        self._segment_bytes = segment_bytes
        self._preallocate = preallocate
        # Invariant: consecutive segments continue each other's indexes and
        # chain crc; the last one is active and open as _fd.
        self._segments = segments
        self._fd = fd  # file position == _offset between calls
        self._limit = limit  # frames of the active segment stay below this
        self._offset = active.end
        self._crc = active.last_crc
        self._last_index = active.last_index
        self._dirty = False  # active segment has writes not yet fdatasynced
        self._writable = True  # False once closed or failed
        self._failure: BaseException | None = None
        # With preallocation: whether the spare is there, else why not.
        self._spare = preallocate and spare_size(directory) == segment_bytes
        self._reserve_error: JournalWriteError | None = None
        self._appended = 0
        self._syncs = 0
        self._last_sync = 0.0
        self._total_sync = 0.0

    # --- opening and recovery ------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        preallocate: bool = True,
    ) -> "SegmentJournal":
        """Open (creating if needed) the journal in directory and recover it.

        Every segment is validated. A torn write at the end of the last
        segment is erased; any other damage raises JournalCorruptError.
        """
        directory = os.fspath(directory)
        if segment_bytes <= HEADER_FRAME_SIZE:
            raise ValueError(f"segment_bytes must exceed {HEADER_FRAME_SIZE}")
        segment_bytes = (segment_bytes + 7) & ~7
        if not os.path.isdir(directory):
            os.makedirs(directory)
            fsync_directory(os.path.dirname(os.path.abspath(directory)))
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise JournalError(f"{directory}: journal is already open elsewhere") from None
            journal = cls._recover(directory, dir_fd, segment_bytes, preallocate)
        except BaseException:
            os.close(dir_fd)
            raise
        journal._try_reserve()
        return journal

    @classmethod
    def _recover(
        cls, directory: str, dir_fd: int, segment_bytes: int, preallocate: bool
    ) -> "SegmentJournal":
        names = os.listdir(directory)
        leftovers = [name for name in names if is_temp_name(name)]
        for name in leftovers:  # segments whose creation never completed
            os.unlink(os.path.join(directory, name))
        if leftovers:
            os.fsync(dir_fd)
        found = sorted(
            (first, name) for name in names if (first := parse_segment_name(name)) is not None
        )
        if not found:
            try:
                path, fd, header_crc = create_segment(
                    directory, SegmentHeader(1, 0, segment_bytes), preallocate
                )
            except OSError as exc:
                raise JournalWriteError(
                    exc.errno, f"cannot create the first segment in {directory}: {exc.strerror}"
                ) from exc
            try:
                os.fsync(dir_fd)
            except BaseException:
                os.close(fd)
                raise
            segment = _Segment(path, 1, 0, header_crc, 0, HEADER_FRAME_SIZE, header_crc)
            return cls(directory, dir_fd, segment_bytes, preallocate, [segment], fd, segment_bytes)

        segments: list[_Segment] = []
        for position, (first, name) in enumerate(found):
            path = os.path.join(directory, name)
            is_last = position == len(found) - 1
            with open(path, "rb") as file:
                buffer = file.read()
            scan = scan_segment(buffer, path, is_last=is_last)
            if scan.header.first_index != first:
                raise JournalCorruptError(
                    path, 0, f"header says first index {scan.header.first_index}, name says {first}"
                )
            if segments:
                prev = segments[-1]
                if first != prev.last_index + 1:
                    raise JournalCorruptError(
                        path, 0,
                        f"segment starts at record {first} but {prev.path} ends at record "
                        f"{prev.last_index}: records {prev.last_index + 1}..{first - 1} are missing",
                    )
                if scan.header.prev_crc != prev.last_crc:
                    raise JournalCorruptError(
                        path, 0, f"segment does not continue the crc chain of {prev.path}"
                    )
            segments.append(
                _Segment(
                    path, first, scan.header.prev_crc, scan.header_crc, scan.count, scan.end,
                    scan.last_crc,
                )
            )
        # The loop leaves `path`, `buffer` and `scan` describing the last segment.
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if scan.torn is not None:
                log.warning(
                    "%s: erasing torn write at byte offset %d (%s); %d records kept",
                    path, scan.torn.offset, scan.torn.reason, scan.count,
                )
                zero_range(fd, scan.torn.offset, scan.torn.dirty_end)
                os.fdatasync(fd)
            os.lseek(fd, scan.end, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        # A segment with a recorded size keeps its length (see segment.py); one
        # written before sizes were recorded may still grow to segment_bytes.
        limit = len(buffer) if scan.header.size else max(segment_bytes, len(buffer))
        return cls(directory, dir_fd, segment_bytes, preallocate, segments, fd, limit)

    # --- writing ---------------------------------------------------------------

    def append(self, payload: bytes) -> int:
        """Write one record (page cache only, see sync) and return its index.

        On a write error nothing of the record remains, it gets no index and
        JournalWriteError is raised; the journal stays usable.
        """
        if not self._writable:
            self._raise_unwritable()
        frame, crc = encode_frame(payload, self._crc)
        size = len(frame)
        if self._offset + size > self._limit:
            self._make_room(size)
            frame, crc = encode_frame(payload, self._crc)  # chain may restart
        done = 0
        try:
            done = os.write(self._fd, frame)
            while done < size:  # a short write is rare: usually the disk filled up
                written = os.write(self._fd, memoryview(frame)[done:])
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
        except OSError as exc:
            self._undo_write(done, exc)
        self._offset += size
        self._crc = crc
        self._last_index += 1
        self._appended += 1
        self._dirty = True
        return self._last_index

    def _undo_write(self, done: int, exc: OSError) -> None:
        """Zero what a failed frame wrote of itself, then raise.  Zeroed, not
        truncated: a segment never gets shorter than its recorded size."""
        path = self._segments[-1].path
        try:
            if done:
                self._dirty = True
                zero_range(self._fd, self._offset, self._offset + done)
            os.lseek(self._fd, self._offset, os.SEEK_SET)
        except OSError as undo_exc:
            self._fail(undo_exc)
            raise JournalFailedError(
                f"{path}: could not undo a failed append at offset {self._offset}: {undo_exc}"
            ) from exc
        raise JournalWriteError(
            exc.errno or errno.EIO,
            f"append to {path} at offset {self._offset} failed: {exc.strerror or exc}",
        ) from exc

    def _make_room(self, frame_bytes: int) -> None:
        """Give the active segment room for a frame, rolling over if needed."""
        needed = HEADER_FRAME_SIZE + frame_bytes
        active = self._segments[-1]
        if self._offset == HEADER_FRAME_SIZE:
            # Empty active segment: replace it by a larger one rather than
            # leave it empty (a successor would also get the same name); it
            # holds no record, so either file is whole after a crash.
            self._replace_active(SegmentHeader(active.first_index, active.prev_crc, needed))
            return
        # The completed segment is made durable before its successor exists,
        # so recovery never sees a hole in a segment that is not the last.
        if self._dirty:
            self._fdatasync()
        self._settle()
        first = self._last_index + 1
        if self._spare and needed <= self._segment_bytes:
            self._replace_active(SegmentHeader(first, self._crc, self._segment_bytes), from_spare=True)
        else:  # no spare (it could not be made), or a frame larger than a segment
            self._replace_active(SegmentHeader(first, self._crc, max(self._segment_bytes, needed)))
        if not self._spare:
            self._try_reserve()

    def _replace_active(self, header: SegmentHeader, from_spare: bool = False) -> None:
        """Create the segment ``header`` describes (of the spare, if
        ``from_spare``) and make it the active one: the successor of the
        active segment, or (same first index) its replacement while it is
        empty."""
        try:
            if from_spare:
                self._spare = False  # gone, or not to be trusted after a failure
                path, fd, header_crc = segment_from_spare(self._directory, header)
            else:
                path, fd, header_crc = create_segment(self._directory, header, self._preallocate)
        except OSError as exc:
            error = JournalWriteError(
                exc.errno, f"cannot create segment {segment_name(header.first_index)}: {exc.strerror}"
            )
            if from_spare:
                self._reserve_error = error  # reserve() makes a new spare
            raise error from exc
        try:
            os.fsync(self._dir_fd)
        except OSError as exc:
            os.close(fd)
            self._fail(exc)
            raise JournalFailedError(f"{self._directory}: directory fsync failed: {exc}") from exc
        os.close(self._fd)
        self._fd = fd
        segment = _Segment(
            path, header.first_index, header.prev_crc, header_crc, 0, HEADER_FRAME_SIZE, header_crc
        )
        if header.first_index == self._segments[-1].first_index:
            self._segments[-1] = segment
        else:
            self._segments.append(segment)
        self._offset = HEADER_FRAME_SIZE
        self._crc = header_crc
        self._limit = header.size
        self._dirty = False

    def sync(self) -> None:
        """fdatasync everything appended so far; durable once this returns.

        Completed segments were synced when they were completed, so only the
        active one can hold unsynced writes. On failure the journal is
        poisoned: this and all later append/sync raise JournalFailedError.
        """
        if not self._writable:
            self._raise_unwritable()
        if self._dirty:
            self._fdatasync()

    def _fdatasync(self) -> None:
        start = time.perf_counter()
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            # Never retry: after a failed fsync the kernel may have dropped
            # the dirty pages and cleared the error.
            self._fail(exc)
            raise JournalFailedError(
                f"fdatasync of {self._segments[-1].path} failed: {exc}; reopen to recover"
            ) from exc
        elapsed = time.perf_counter() - start
        self._dirty = False
        self._syncs += 1
        self._last_sync = elapsed
        self._total_sync += elapsed

    # --- the spare -------------------------------------------------------------

    @property
    def reserve_error(self) -> JournalWriteError | None:
        """Why the next segment is not preallocated (the spare could not be
        made: ENOSPC for a full disk); None when it is, or when segments
        are not preallocated at all."""
        return self._reserve_error

    def reserve(self) -> None:
        """Preallocate the next segment now, if preallocating and it is not
        (after ``reserve_error``).  A filesystem with less free space than a
        segment is not asked: taking and giving back its last bytes would
        fail others' writes meanwhile.  Raises JournalWriteError."""
        if not self._writable:
            self._raise_unwritable()
        if not self._preallocate or self._spare:
            self._reserve_error = None
            return
        try:
            try:
                os.unlink(os.path.join(self._directory, SPARE_NAME))  # a wrong size, or half taken
            except FileNotFoundError:
                pass
            free = _free_bytes(self._directory)
            if free < self._segment_bytes:
                raise OSError(errno.ENOSPC, f"{free} bytes free, a segment needs {self._segment_bytes}")
            create_spare(self._directory, self._segment_bytes)
        except OSError as exc:
            self._reserve_error = JournalWriteError(
                exc.errno or errno.EIO,
                f"cannot preallocate the next segment in {self._directory}: {exc.strerror or exc}",
            )
            raise self._reserve_error from exc
        self._spare = True
        self._reserve_error = None

    def _try_reserve(self) -> None:
        """reserve(), a failure only logged (and kept in reserve_error)."""
        try:
            self.reserve()
        except JournalWriteError as exc:
            log.warning("%s", exc)

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._writable = False

    def _raise_unwritable(self) -> None:
        if self._failure is not None:
            raise JournalFailedError(
                f"{self._directory}: journal failed earlier ({self._failure}); reopen to recover"
            )
        raise JournalError(f"{self._directory}: journal is closed")

    def _settle(self) -> None:
        """Bring the active segment's record up to date with the hot-path fields."""
        active = self._segments[-1]
        active.count = self._last_index - active.first_index + 1
        active.end = self._offset
        active.last_crc = self._crc

    # --- reading and trimming --------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def last_index(self) -> int:
        """Index of the newest record, 0 if none was ever appended."""
        return self._last_index

    @property
    def first_index(self) -> int:
        """Index of the oldest retained record (last_index + 1 if none)."""
        return self._segments[0].first_index

    def records(self, after_index: int = 0, epoch: int = 0) -> Iterator[tuple[int, bytes]]:
        """Iterate (index, payload) for records after after_index, oldest first.

        Covers the records present at call time. Segments that end at or
        before after_index are skipped without being read. Asking for
        records that release() already deleted raises JournalError.
        """
        if self._dir_fd < 0:
            raise JournalError(f"{self._directory}: journal is closed")
        if after_index < 0:
            raise ValueError(f"after_index must be >= 0, got {after_index}")
        if after_index < self.first_index - 1:
            raise JournalError(
                f"records {after_index + 1}..{self.first_index - 1} were released; "
                f"the journal starts at record {self.first_index}"
            )
        self._settle()
        plan = [
            (s.path, s.first_index, s.count, s.end, s.header_crc)
            for s in self._segments
            if s.last_index > after_index
        ]
        return _replay(plan, after_index)

    def release(self, upto_index: int) -> int:
        """Delete segments whose records all have index <= upto_index.

        Called after a checkpoint covers upto_index. Never deletes the active
        segment. Oldest first with a directory fsync after each, so a crash
        can only leave a contiguous suffix of segments. Returns how many
        segments were deleted.
        """
        if self._dir_fd < 0:
            raise JournalError(f"{self._directory}: journal is closed")
        self._settle()
        removed = 0
        while len(self._segments) > 1 and self._segments[0].last_index <= upto_index:
            os.unlink(self._segments[0].path)
            del self._segments[0]
            os.fsync(self._dir_fd)
            removed += 1
        return removed

    def statistics(self) -> SegmentJournalStatistics:
        self._settle()
        return SegmentJournalStatistics(
            segments=len(self._segments),
            bytes=sum(s.end for s in self._segments),
            appended_records=self._appended,
            syncs=self._syncs,
            last_sync_seconds=self._last_sync,
            total_sync_seconds=self._total_sync,
        )

    def close(self) -> None:
        """Close files and release the directory lock. Does not sync."""
        if self._dir_fd < 0:
            return
        self._writable = False
        os.close(self._fd)
        os.close(self._dir_fd)
        self._fd = self._dir_fd = -1

    def __enter__(self) -> "SegmentJournal":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SegmentJournal({self._directory!r}, records {self.first_index}..{self._last_index}, "
            f"{len(self._segments)} segments)"
        )


def _free_bytes(directory: str) -> int:
    """Bytes a new file may take on the filesystem holding ``directory``
    (root may use the blocks reserved for it)."""
    st = os.statvfs(directory)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _replay(
    plan: list[tuple[str, int, int, int, int]], after_index: int
) -> Iterator[tuple[int, bytes]]:
    for path, first, count, end, header_crc in plan:
        with open(path, "rb") as file:
            buffer = file.read(end)
        index = first
        stop_index = first + count
        for item in decode_frames(buffer, HEADER_FRAME_SIZE, header_crc):
            if index == stop_index:
                break
            if not isinstance(item, Frame):
                raise JournalCorruptError(
                    path, item.offset, f"record {index} unreadable during replay: {item.reason}"
                )
            if index > after_index:
                yield index, bytes(item.payload)
            index += 1
