"""What other threads hand the committer, one frozen dataclass per kind.

Writes queue as ``Pending`` entries (brain.engine.pending: mutable, settled once);
everything else is posted as one of these (``Committer.post``) and waits
in the inbox of its kind until the committer's next turn, which hands each
inbox to its handler: what a pipelined journal's syncing thread learned
first (brain.engine.pipeline), then delivered records (a forwarded answer
may wait for them), forwarded outcomes and confirmations, the writes, and
the controls last (they see the store as the turn's writes left it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, slots=True)
class Effects:
    """A write request whose effects are already decided (a mirror's
    payload, brain.mvcc.codec): journaled and applied as it is."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class JournalBarrier:
    """A request for a journal record after every record acknowledged so
    far: a read index confirmed by the journal's quorum (brain.engine.
    readindex).  Queued like a write and answered with the index of its
    commit batch's record, an empty record when the batch appends nothing
    else; only the leader decides it (another replica's answer is
    ErrNotLeader)."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """A journal record delivered to a follower, to apply."""

    index: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ForwardOutcome:
    """The leader's answer to writes this follower forwarded: one result or
    EtcdError per write, or one exception for all of them."""

    batch: list
    outcome: object


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A read-index round trip came back for answers the leader decided
    without a journal record (``exc`` None: it passed)."""

    admitted: list
    results: list
    term: int
    exc: BaseException | None


@dataclass(frozen=True, slots=True)
class Control:
    """Work to run on the committer once the turn's writes are settled."""

    fn: Callable[[], None]



@dataclass(frozen=True, slots=True)
class Durable:
    """A pipelined journal acknowledged every record up to ``index`` of the
    leading ``session`` (brain.engine.pipeline), ``seconds`` after its
    syncing thread began waiting."""

    index: int
    session: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SyncOverdue:
    """Records up to ``index`` of ``session`` waited past the request
    timeout: their callers are told (they may still land)."""

    index: int
    session: int


@dataclass(frozen=True, slots=True)
class SyncFailed:
    """The records of ``session`` not yet acknowledged cannot land (``exc``:
    another writer's, a lost election with the outcome unknown, a refusal)."""

    exc: BaseException
    session: int
