"""brain.journal.jetstream_reading.Epochs: which messages of the journal's
stream a reader takes for stale (read as empty records)."""

from __future__ import annotations

from brain.journal.jetstream_reading import Epochs


def test_the_worked_example():
    """Epoch 7's record, the old leader's record on its way (epoch 6), the
    new leader's pipelined records after it, the next leader's epoch."""
    e = Epochs(6)
    verdicts = [e.stale(h) for h in ("6", "7", "6", "7", "7", "8", "8")]
    assert verdicts == [False, False, True, True, True, False, False]
    assert e.newest == 8


def test_a_message_without_the_header_is_never_stale_and_ends_a_stale_run():
    e = Epochs(7)
    assert e.stale("6") and e.stale("7")
    assert not e.stale(None)
    assert not e.stale("7")  # (a test's writer in between: nothing to chain on)


def test_a_reader_starts_from_its_stores_epoch():
    e = Epochs(7)
    assert e.stale("6")
    assert e.reason == "written in epoch 6, older than 7"
    assert not Epochs(7).stale("7")
    assert e.stale("7")
    assert e.reason == "written in epoch 7 after a stale message: its writer was fenced before it"
