"""brain.journal.jetstream's append as the leader's read index sees it: the
index of a record is the journal's last index before any of its messages
is on its way to NATS.  No NATS: the connection records what is sent."""

from __future__ import annotations

from concurrent.futures import Future

from brain.journal.jetstream import HEADER_ROOM, JetStreamJournal


class SendingConn:
    """Runs nothing: notes the journal's last index at each send, the moment
    a follower could start to see that message."""

    max_payload = 4096

    def __init__(self) -> None:
        self.journal: JetStreamJournal | None = None
        self.sent: list[tuple[int, int]] = []  # (last_index at the send, messages sent before)

    def submit(self, coro) -> Future:
        coro.close()
        self.sent.append((self.journal.last_index, len(self.sent)))
        return Future()


def test_the_last_index_covers_a_record_before_its_first_message_is_sent():
    """The leader answers linearizable reads (its own, and followers' read
    index requests) with its last index; when that moved only after a
    message was sent, a follower could apply the record and answer a read
    at its revision while the leader still answered below it (a 3-replica
    run saw get @1932 on the leader after get @1933 on a follower)."""
    conn = SendingConn()
    journal = JetStreamJournal(conn, "s", "s.journal")
    conn.journal = journal
    journal.begin_writing(10)
    chunk = conn.max_payload - HEADER_ROOM
    assert journal.append(b"x" * (2 * chunk + 1)) == 13  # three messages: 11, 12, 13
    assert conn.sent == [(13, 0), (13, 1), (13, 2)]
    seqs = [(p.seq, p.headers["Nats-Expected-Last-Sequence"], p.headers["Brain-Part"]) for p in journal._unacked]
    assert seqs == [(11, "10", "1/3"), (12, "11", "2/3"), (13, "12", "3/3")]
    assert journal.append(b"y") == 14
    assert conn.sent[-1] == (14, 3)
    assert journal._unacked[-1].headers["Nats-Expected-Last-Sequence"] == "13"
