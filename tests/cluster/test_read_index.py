"""ReadIndexAsker: whom a follower asks for its read index."""

from brain.cluster.forwarding import ReadIndexAsker
from brain.mvcc import errors

ME, WRITER, ELECTED = 1, 2, 3


class FakeForwarder:
    def __init__(self, leader: int, answers: list) -> None:
        self.leader = leader
        self.answers = answers
        self.asked: list = []

    def leader_id(self) -> int:
        return self.leader

    def call(self, op: str, args: list, done) -> None:
        self.asked.append((op, args))
        done(*self.answers.pop(0))


class FakeEngine:
    member_id = ME

    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.barriers = 0

    def journal_barrier(self, callback) -> None:
        self.barriers += 1
        callback(None, errors.ErrNotLeader) if not self.leading else callback(41, None)


def _ask(asker) -> list:
    got: list = []
    asker(lambda index, exc: got.append((index, exc)))
    return got


def test_the_journals_writer_is_asked_and_its_lease_answer_taken():
    writer = FakeForwarder(WRITER, [([40, False], None)])
    elected = FakeForwarder(ELECTED, [])
    asker = ReadIndexAsker(writer, FakeEngine(leading=False), elected=elected)
    assert _ask(asker) == [(40, None)]
    assert writer.asked == [("ri", [])] and elected.asked == []
    assert asker.leased == 1


def test_a_writer_that_stepped_down_sends_the_read_to_the_elected_leader_for_a_barrier():
    """The writer wrote its epoch, lost the key and stepped down: its epoch
    fenced the key holder, whose lease vouches for nothing; a barrier does."""
    writer = FakeForwarder(WRITER, [(None, errors.ErrNotLeader)])
    elected = FakeForwarder(ELECTED, [([42, True], None)])
    asker = ReadIndexAsker(writer, FakeEngine(leading=False), elected=elected)
    assert _ask(asker) == [(42, None)]
    assert elected.asked == [("ri", [True])]
    assert asker.confirmed == 1


def test_this_replica_named_writer_but_no_longer_leading_asks_the_elected_leader():
    writer = FakeForwarder(ME, [])
    elected = FakeForwarder(ELECTED, [([42, True], None)])
    engine = FakeEngine(leading=False)
    asker = ReadIndexAsker(writer, engine, elected=elected)
    assert _ask(asker) == [(42, None)]
    assert engine.barriers == 1 and writer.asked == [] and elected.asked == [("ri", [True])]


def test_the_leaders_own_read_is_its_barrier():
    writer = FakeForwarder(ME, [])
    elected = FakeForwarder(ELECTED, [])
    asker = ReadIndexAsker(writer, FakeEngine(leading=True), elected=elected)
    assert _ask(asker) == [(41, None)]
    assert elected.asked == [] and asker.confirmed == 1


def test_an_elected_leader_that_says_not_leader_is_the_answer():
    """The elected forwarder retries "not leader" itself until its timeout;
    what it finally says is passed on, never asked of the writer again."""
    writer = FakeForwarder(WRITER, [(None, errors.ErrNotLeader)])
    elected = FakeForwarder(ELECTED, [(None, errors.ErrTimeout)])
    asker = ReadIndexAsker(writer, FakeEngine(leading=False), elected=elected)
    assert _ask(asker) == [(None, errors.ErrTimeout)]
    assert len(writer.asked) == 1


class LeasedEngine:
    """A leader whose read lease is valid."""

    def __init__(self) -> None:
        self.read_lease = lambda: True
        self.barriers = 0

        class J:
            last_index = 40
        self.journal = J()

    def journal_barrier(self, callback) -> None:
        self.barriers += 1
        callback(41, None)


def _server_answer(barrier: bool) -> tuple[list, LeasedEngine]:
    from brain.cluster.forwarding import ForwardingServer

    engine = LeasedEngine()
    server = ForwardingServer(None, "ri-test", engine)
    replies: list = []
    server._reply = lambda msg, value: replies.append(value)
    server._read_index(object(), barrier=barrier)
    return replies, engine


def test_the_leader_answers_from_its_lease_unless_a_barrier_is_asked_for():
    replies, engine = _server_answer(barrier=False)
    assert replies == [["ok", [40, False]]] and engine.barriers == 0
    replies, engine = _server_answer(barrier=True)
    assert replies == [["ok", [41, True]]] and engine.barriers == 1
