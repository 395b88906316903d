"""brain.journal.jetstream against a real 3-server NATS cluster whose
stream leader loses its peers: what an append and a read see meanwhile.

Both tests come from CI failures of the cluster suites: a leader that took
a retried publish's answer for a final refusal and stopped serving, and a
starting replica whose first read of the journal failed outright."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from brain.journal.errors import JournalUnavailableError
from brain.journal import jetstream_reading
from brain.journal.jetstream import JetStreamJournal
from brain.journal.natsio import NatsConnection


@pytest.fixture
def nats3(nats_cluster_factory):
    return nats_cluster_factory(3, sync_always=True)


def _journal(nats3, name: str, url: str | None = None) -> tuple[NatsConnection, JetStreamJournal]:
    conn = NatsConnection([url] if url else list(nats3.urls), name=name)
    return conn, JetStreamJournal.open(conn, name, replicas=3)


def _stop(pid: int) -> None:
    """SIGSTOP, returning once every thread of ``pid`` is stopped: kill()
    returns before the signal is delivered, and a peer still running for a
    moment could acknowledge the append the test sends next."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    tasks = Path(f"/proc/{pid}/task")
    while not all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.005)


def _stopped_peers(nats3, leader):
    stopped = [n for n in nats3.nodes if n is not leader]
    for n in stopped:
        _stop(n.proc.pid)
    return stopped


def _resume(stopped) -> None:
    for n in stopped:
        os.kill(n.proc.pid, signal.SIGCONT)


def test_an_append_to_a_stream_leader_without_its_peers_stays_retryable(nats3):
    """While the first copy of a publish waits for a quorum, the stream
    leader answers its retry "duplicate message id is in process" (10158):
    not now, not never.  Every sync meanwhile says JournalUnavailableError;
    once the peers are back the one record is stored once."""
    conn, journal = _journal(nats3, "outage1")
    try:
        journal.begin_writing(0)
        journal.append(b"first")
        journal.sync()
        leader = nats3.wait_stream_leader(journal.stream)
        conn.close()
        conn, journal = _journal(nats3, "outage1", leader.url)
        journal.begin_writing(1)
        stopped = _stopped_peers(nats3, leader)
        try:
            journal.append(b"second")
            unavailable = 0
            deadline = time.monotonic() + 12  # past NATS's lost-quorum interval
            while time.monotonic() < deadline:
                with pytest.raises(JournalUnavailableError):
                    journal.sync()
                unavailable += 1
        finally:
            _resume(stopped)
        assert unavailable >= 2, unavailable  # retried, each retry answered "not now"
        deadline = time.monotonic() + 60
        while True:
            try:
                journal.sync()
                break
            except JournalUnavailableError:
                assert time.monotonic() < deadline, "the append never landed after the peers came back"
                time.sleep(0.2)
        assert [r for _, r in journal.records(0)] == [b"first", b"second"]
    finally:
        conn.close()


def test_a_read_goes_on_through_a_fetch_that_fails(nats3, monkeypatch):
    """A read of records the stream has waits out a stream leader that
    cannot answer for a while, on a new consumer, and misses nothing."""
    monkeypatch.setattr(jetstream_reading, "FETCH_BATCH", 8)  # several fetches
    conn, journal = _journal(nats3, "outage2")
    try:
        journal.begin_writing(0)
        for i in range(40):
            journal.append(b"r%d" % i)
        journal.sync()
        leader = nats3.wait_stream_leader(journal.stream)
        reader = journal.records(0)
        assert next(reader) == (1, b"r0")
        for _ in range(7):
            next(reader)  # the rest of the first fetch
        stopped = _stopped_peers(nats3, leader)
        _stop(leader.proc.pid)
        stopped.append(leader)
        got: list = []
        failed: list = []

        def read_rest() -> None:
            try:
                got.extend(r for _, r in reader)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                failed.append(e)

        rest = threading.Thread(target=read_rest)
        rest.start()  # its next fetch waits on a stopped server
        time.sleep(6)  # longer than one fetch's wait
        _resume(stopped)  # the servers elect a meta leader: 10008 for a moment
        rest.join(60)
        assert not failed, failed
        assert got == [b"r%d" % i for i in range(8, 40)]
    finally:
        conn.close()
