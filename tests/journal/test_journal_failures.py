"""Error contract: write errors leave the journal usable, fsync errors poison it."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from brain.journal import JournalError, JournalFailedError, JournalWriteError, SegmentJournal
from .journal_support import read_bytes, record_frames, segment_paths

real_write = os.write


def enospc():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def broken_fdatasync(fd):
    raise OSError(errno.EIO, "I/O error")


def no_space(fd, offset, length):
    raise enospc()


def test_write_error_leaves_the_journal_usable(jdir, monkeypatch):
    calls = []

    def failing_once(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            raise enospc()
        return real_write(fd, data)

    with SegmentJournal.open(jdir) as journal:
        journal.append(b"one")
        monkeypatch.setattr(os, "write", failing_once)
        with pytest.raises(JournalWriteError) as caught:
            journal.append(b"lost")
        monkeypatch.undo()
        assert caught.value.errno == errno.ENOSPC
        assert isinstance(caught.value, OSError)
        assert journal.last_index == 1
        assert journal.append(b"two") == 2
        journal.sync()
        assert list(journal.records()) == [(1, b"one"), (2, b"two")]
    with SegmentJournal.open(jdir) as journal:
        assert list(journal.records()) == [(1, b"one"), (2, b"two")]


@pytest.mark.parametrize("preallocate", [True, False], ids=["prealloc", "no-prealloc"])
def test_partial_write_is_cut_off(jdir, monkeypatch, preallocate):
    state = {"calls": 0}

    def half_then_enospc(fd, data):
        state["calls"] += 1
        if state["calls"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise enospc()

    payload = os.urandom(1000)
    with SegmentJournal.open(jdir, segment_bytes=1 << 16, preallocate=preallocate) as journal:
        journal.append(b"one")
        monkeypatch.setattr(os, "write", half_then_enospc)
        with pytest.raises(JournalWriteError) as caught:
            journal.append(payload)
        monkeypatch.undo()
        assert caught.value.errno == errno.ENOSPC
        (path,) = segment_paths(jdir)
        end = record_frames(path)[-1].end
        assert not any(read_bytes(path)[end:]), "the half-written frame must be gone"
        if preallocate:
            assert os.path.getsize(path) == 1 << 16, "preallocation is restored"
        assert journal.append(b"two") == 2
        journal.sync()
    with SegmentJournal.open(jdir, segment_bytes=1 << 16, preallocate=preallocate) as journal:
        assert list(journal.records()) == [(1, b"one"), (2, b"two")]


def test_failed_undo_poisons(jdir, monkeypatch):
    state = {"calls": 0}

    def partial_then_enospc(fd, data):
        state["calls"] += 1
        if state["calls"] == 1:
            return real_write(fd, bytes(data)[:4])
        raise enospc()

    def broken_pwrite(fd, data, offset):  # the undo zeroes what was written
        raise OSError(errno.EIO, "I/O error")

    with SegmentJournal.open(jdir) as journal:
        monkeypatch.setattr(os, "write", partial_then_enospc)
        monkeypatch.setattr(os, "pwrite", broken_pwrite)
        with pytest.raises(JournalFailedError):
            journal.append(os.urandom(100))
        monkeypatch.undo()
        with pytest.raises(JournalFailedError):
            journal.append(b"x")


def test_fdatasync_failure_poisons_forever(jdir, monkeypatch):
    calls = []

    def failing_fdatasync(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "I/O error")

    with SegmentJournal.open(jdir) as journal:
        journal.append(b"one")
        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        with pytest.raises(JournalFailedError) as caught:
            journal.sync()
        assert caught.value.__cause__.errno == errno.EIO
        monkeypatch.undo()  # even a healthy disk must not be trusted again
        with pytest.raises(JournalFailedError):
            journal.sync()
        with pytest.raises(JournalFailedError):
            journal.append(b"two")
        assert len(calls) == 1, "a failed fsync is never retried"
        assert journal.last_index == 1
        # Reading is still possible; closing works.
        assert list(journal.records()) == [(1, b"one")]
    with SegmentJournal.open(jdir) as journal:  # reopening recovers from the disk
        assert journal.append(b"two") == 2


def test_fdatasync_failure_at_rollover_poisons(jdir, monkeypatch):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        journal.append(os.urandom(900))
        monkeypatch.setattr(os, "fdatasync", broken_fdatasync)
        with pytest.raises(JournalFailedError):
            journal.append(os.urandom(900))
        monkeypatch.undo()
        with pytest.raises(JournalFailedError):
            journal.sync()
    assert len(segment_paths(jdir)) == 1


@pytest.mark.parametrize("preallocate", [True, False], ids=["spare", "no-prealloc"])
def test_directory_fsync_failure_at_rollover_poisons(jdir, monkeypatch, preallocate):
    real_fsync = os.fsync
    with SegmentJournal.open(jdir, segment_bytes=1024, preallocate=preallocate) as journal:
        journal.append(os.urandom(900))
        calls = []

        def directory_fails(fd):
            calls.append(fd)
            if stat.S_ISDIR(os.fstat(fd).st_mode):  # not the new segment (or spare) file
                raise OSError(errno.EIO, "I/O error")
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", directory_fails)
        with pytest.raises(JournalFailedError):
            journal.append(os.urandom(900))
        monkeypatch.undo()
        with pytest.raises(JournalFailedError):
            journal.append(b"x")
    with SegmentJournal.open(jdir, segment_bytes=1024, preallocate=preallocate) as journal:
        assert journal.last_index == 1


def test_preallocation_enospc_leaves_the_current_segment_alone(jdir, monkeypatch):
    """No spare (it could not be made at the last rollover) and no space:
    the rollover fails and the journal goes on."""
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        monkeypatch.setattr(os, "posix_fallocate", no_space)
        journal.append(b"z" * 600)
        assert journal.append(b"a" * 500) == 2  # the rollover took the spare; a new one cannot be made
        assert journal.reserve_error is not None and journal.reserve_error.errno == errno.ENOSPC
        journal.sync()
        path = segment_paths(jdir)[-1]
        before = read_bytes(path)

        with pytest.raises(JournalWriteError) as caught:
            journal.append(b"b" * 600)
        assert caught.value.errno == errno.ENOSPC
        assert sorted(os.listdir(jdir)) == [os.path.basename(p) for p in segment_paths(jdir)], \
            "no new or temporary file is left"
        assert len(segment_paths(jdir)) == 2
        assert read_bytes(path) == before
        assert journal.last_index == 2
        # Still usable: a record that fits goes to the current segment...
        assert journal.append(b"c" * 100) == 3
        monkeypatch.undo()
        # ...and once space is back the rollover happens.
        assert journal.append(b"b" * 600) == 4
        journal.sync()
    assert len(segment_paths(jdir)) == 3
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        assert [payload for _, payload in journal.records()] == [b"z" * 600, b"a" * 500, b"c" * 100, b"b" * 600]


def test_growing_the_empty_segment_can_fail_with_enospc(jdir, monkeypatch):
    with SegmentJournal.open(jdir, segment_bytes=1024) as journal:
        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(JournalWriteError) as caught:
            journal.append(os.urandom(5000))
        assert caught.value.errno == errno.ENOSPC
        monkeypatch.undo()
        assert journal.append(b"fits") == 1


def test_journal_errors_share_a_base_class():
    assert issubclass(JournalWriteError, JournalError)
    assert issubclass(JournalFailedError, JournalError)
