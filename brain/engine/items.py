"""What other threads hand the committer, one frozen dataclass per kind.

Writes queue as ``_Pending`` entries (engine.py: mutable, settled once);
everything else is posted as one of these (``Engine._post``) and waits in
the inbox of its kind until the committer's next turn, which hands each
inbox to its handler: delivered records first (a forwarded answer may wait
for them), then forwarded outcomes and confirmations, the writes, and the
controls last (they see the store as the turn's writes left it).
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

