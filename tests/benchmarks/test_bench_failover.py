"""The failover measurement's arithmetic on canned answers (no servers): the NATS stream leader's election as
every nats-server's monitoring reports it, and the write pause measured against it."""

from __future__ import annotations

import time

from benchmarks.cluster import beyond_election, pause_span
from benchmarks.stream_leader import Sighting, StreamLeaderWatch, election, stream_view

T0 = 1_800_000_000.0


def _jsz(stream: str, leader: str, since: str | None = None) -> dict:
    cluster = {"name": "c", "leader": leader, **({"leader_since": since} if since else {})}
    return {"account_details": [{"name": "$G", "stream_detail": [
        {"name": "other_leader", "cluster": {"leader": "n9"}}, {"name": stream, "cluster": cluster}]}]}


def test_a_servers_view_of_the_stream_names_its_leader_and_the_leaders_own_start():
    assert stream_view(_jsz("bc_journal", "n2", "2027-01-15T08:00:00.250000001Z"), "bc_journal") == (
        "n2", 1_800_000_000.25)
    assert stream_view(_jsz("bc_journal", ""), "bc_journal") == ("", None)   # an election under way
    assert stream_view(_jsz("bc_journal", "n2"), "absent") is None
    assert stream_view({}, "bc_journal") is None


def test_the_election_is_the_new_leaders_own_start_not_when_a_poll_saw_it():
    sightings = [Sighting(T0 - 0.1, "n2", "n1", None),          # before the kill: n1 leads
                 Sighting(T0 + 4.00, "n2", "", None),            # n1 killed at T0, no leader yet
                 Sighting(T0 + 6.30, "n3", "n2", None),          # n3 names n2 first ...
                 Sighting(T0 + 6.32, "n2", "n2", T0 + 6.21),     # ... n2 says it leads since 6.21
                 Sighting(T0 + 6.37, "n2", "n2", T0 + 6.21)]
    e = election(sightings, "n1", T0)
    assert (e.leader, e.seen_unix, e.since_unix, e.elected_unix) == ("n2", T0 + 6.30, T0 + 6.21, T0 + 6.21)
    assert election(sightings[:2], "n1", T0) is None
    # A leader that has not said since when it leads: the first report of it is the reference.
    assert election(sightings[:3], "n1", T0).elected_unix == T0 + 6.30


def _writer(*pauses):
    return {"start_unix": T0 - 10.0, "pauses": [[s + 10.0, e + 10.0, e - s] for s, e in pauses]}


def test_writes_resumed_is_measured_from_the_election_and_may_be_negative():
    w = _writer((-0.05, 6.45), (20.0, 20.3))  # a pause from just before the kill to 6.45 s after it
    assert pause_span(w, T0, window=3.0) == (T0 - 0.05, T0 + 6.45)
    kill = {"fault": "nats", "t_unix": T0, "stream_leader_seen_s": 6.30, "stream_leader_since_s": 6.21}
    assert abs(beyond_election(w, kill, 3.0) - 0.24) < 1e-9
    # Writes that resumed before the leader was seen (4.70 s against 6.35 s, as on 2026-12-06) are not clipped.
    early = _writer((-0.02, 4.70))
    assert abs(beyond_election(early, dict(kill, stream_leader_since_s=None, stream_leader_seen_s=6.35), 3.0)
               + 1.65) < 1e-9
    assert beyond_election(_writer(), kill, 3.0) is None   # no pause at all: nothing to measure
    assert beyond_election(w, dict(kill, stream_leader_since_s=None, stream_leader_seen_s=None), 3.0) is None


class _Node:
    """A nats-server's monitoring endpoint as StreamLeaderWatch asks it: down, then a new leader."""

    def __init__(self, name: str, answers):
        self.name = name
        self.answers = answers

    def monitor(self, path: str, timeout: float):
        assert path.startswith("/jsz?streams=true")
        return self.answers()


def test_the_watch_polls_every_server_and_waits_for_the_new_leaders_own_start():
    t_kill = time.time()
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_kill + 0.1)) + ".100000Z"

    def dead():
        raise ConnectionRefusedError("killed")
    nodes = [_Node("n1", dead), _Node("n2", lambda: (200, _jsz("s", "n2", since))),
             _Node("n3", lambda: (200, _jsz("s", "n2")))]
    with StreamLeaderWatch(nodes, "s", interval=0.01) as watch:
        e = watch.wait_new_leader("n1", t_kill, timeout=5)
    assert e.leader == "n2" and e.since_unix is not None and abs(e.since_unix - (int(t_kill + 0.1) + 0.1)) < 1e-6
    assert {s.server for s in watch.sightings} == {"n2", "n3"}
