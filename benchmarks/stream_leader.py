"""When NATS elected a new leader of brain's journal stream, seen so that the
observation cannot lag the election.

The failover's old reference was the first answer of ``$JS.API.STREAM.INFO``
that named a new leader, asked every 0.1 s after the kill: while the stream
has no leader such a request waits out its 2 s timeout, so the leader was
seen up to seconds late (writes resumed 4.70 s after a kill, the new leader
was seen at 6.35 s) and "the pause beyond NATS's election" came out
negative, which the report clipped to 0.

``StreamLeaderWatch`` asks every nats-server's monitoring endpoint
(``/jsz?streams=true``: each server's own view of each stream's Raft group,
answered from memory, no Raft round) every 50 ms, one thread per server,
from before the kill.  Each answer names the leader that server knows and,
on the leader itself, ``leader_since``: the time (nats-server's
``time.Now()``, the same clock as this process's ``time.time()`` on one
machine) at which it took over the group, after applying what the old
leader had committed: nats-server 2.15's ``raft.Leader()``, which a stream
checks before it takes an append, is true from that moment (``leaderState``),
so before it no client could append, whatever it did.  A server may name the
new leader earlier (Raft elected it; it is still applying): both times are
kept, and the pause beyond the election is counted from leader_since, NATS's
whole share.  ``election`` takes
the first answer of any server naming a new leader, and that leader's own
``leader_since`` when it reported one: the election's time, not when a poll
happened to see it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime

POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Sighting:
    """One server's answer: when it was read, who answered, the leader it named and its leader_since."""

    t_unix: float
    server: str
    leader: str                       # "" while that server knows no leader
    leader_since_unix: float | None   # only the leader reports it


@dataclass(frozen=True)
class Election:
    """A new stream leader after a kill: who, when first reported by any server, and since when it leads."""

    leader: str
    seen_unix: float
    since_unix: float | None

    @property
    def elected_unix(self) -> float:
        """The election's time: the new leader's own leader_since, else the first report of it."""
        return self.since_unix if self.since_unix is not None else self.seen_unix


def stream_view(jsz: dict, stream: str) -> tuple[str, float | None] | None:
    """(leader, leader_since as unix seconds) of ``stream`` in one server's /jsz?streams=true answer, or None
    when that server does not hold the stream."""
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") != stream:
                continue
            cluster = detail.get("cluster") or {}
            since = cluster.get("leader_since")
            return cluster.get("leader") or "", (datetime.fromisoformat(since).timestamp() if since else None)
    return None


def election(sightings: list[Sighting], old_leader: str, after_unix: float) -> Election | None:
    """The first new leader (not ``old_leader``, not empty) any server reported after ``after_unix``, with
    the leader_since that leader reported of itself (the earliest it gave, if it answered several times)."""
    new = sorted((s for s in sightings if s.t_unix >= after_unix and s.leader and s.leader != old_leader),
                 key=lambda s: s.t_unix)
    if not new:
        return None
    first = new[0]
    own = [s.leader_since_unix for s in new
           if s.server == first.leader and s.leader == first.leader and s.leader_since_unix is not None]
    return Election(first.leader, first.t_unix, min(own) if own else None)


class StreamLeaderWatch:
    """Polls ``nodes`` (tests.support.nats_cluster NatsNode: ``name``, ``monitor(path, timeout)``) for
    ``stream``'s leader every ``interval`` seconds, a thread per node, until ``stop()``; ``sightings``
    holds every answer (a node that does not answer, such as a killed one, adds none)."""

    def __init__(self, nodes, stream: str, interval: float = POLL_SECONDS):
        self.nodes = list(nodes)
        self.stream = stream
        self.interval = interval
        self.sightings: list[Sighting] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, args=(n,), daemon=True, name=f"jsz-{n.name}")
                         for n in self.nodes]

    def __enter__(self) -> "StreamLeaderWatch":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _poll(self, node) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                status, body = node.monitor("/jsz?streams=true", timeout=max(0.2, 4 * self.interval))
            except (OSError, ValueError):
                status, body = 0, {}
            view = stream_view(body, self.stream) if status == 200 else None
            if view is not None:
                with self._lock:
                    self.sightings.append(Sighting(time.time(), node.name, *view))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def wait_new_leader(self, old_leader: str, after_unix: float, timeout: float) -> Election:
        """Wait until a server names a leader other than ``old_leader`` and the new leader has said since
        when it leads (or a second has passed since it was first named); raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = election(list(self.sightings), old_leader, after_unix)
            if found is not None and (found.since_unix is not None or time.time() > found.seen_unix + 1.0):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no new leader of stream {self.stream} reported by any nats-server's "
                                   f"monitoring within {timeout:.0f} s")
            time.sleep(self.interval)
