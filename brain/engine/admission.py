"""Step 1 of a leader's commit (brain.engine.committer): which writes of a
batch go on to be decided, and the answer of every other one.

In this order, per write: the CORRUPT alarm refuses everything; the NOSPACE
alarm or an exceeded ``--quota-backend-bytes`` refuses what adds data (and
raises the alarm, once per batch); a journal barrier is set aside (it needs
a record, not a decision); a lease grant past ``--max-leases`` is refused
(brain.engine.limits).  A failed committer, or a journal short of space,
refuses the whole batch before any of that.
"""

from __future__ import annotations

from typing import Callable

from ..mvcc import errors
from .alarms import ALARM_CORRUPT, ALARM_NOSPACE, AlarmSet, adds_data
from .checkpointing import Checkpointer
from .items import JournalBarrier
from .limits import Limits
from .pending import Pending


class Admission:
    """The rules above, answering refused writes through ``settle``."""

    def __init__(self, quota_bytes: int, checkpointer: Checkpointer, alarms: AlarmSet, limits: Limits,
                 settle: Callable[..., None], raise_nospace: Callable[[str], None]) -> None:
        self.quota_bytes = quota_bytes  # < 0: no quota
        self._checkpointer = checkpointer
        self._alarms = alarms
        self._limits = limits
        self._settle = settle
        self._raise_nospace = raise_nospace

    def split(self, batch: list[Pending], refused: errors.EtcdError | None,
              leases: int) -> tuple[list[Pending], list[Pending]]:
        """(writes to decide, barriers) of ``batch``; ``refused``: the error
        every write gets instead; ``leases``: the store's lease count now."""
        if refused is not None:
            for p in batch:
                self._settle(p, None, refused)
            return [], []
        admitted = []
        barriers = []
        quota = self.quota_bytes
        in_use = self._checkpointer.bytes_in_use
        over = quota >= 0 and in_use > quota
        capped = over or self._alarms.has(ALARM_NOSPACE)
        corrupt = self._alarms.has(ALARM_CORRUPT)
        grants = self._limits.lease_grants(leases)  # this batch's grants counted too
        for p in batch:
            if corrupt:
                self._settle(p, None, errors.ErrCorrupt)
            elif capped and adds_data(p.request):
                if over:
                    over = False  # raise the alarm once per batch
                    self._raise_nospace(f"backend quota of {quota} bytes exceeded ({in_use} in use)")
                self._settle(p, None, errors.ErrNoSpace)
            elif type(p.request) is JournalBarrier:
                barriers.append(p)
            elif grants.refuse(p.request):
                self._settle(p, None, errors.ErrTooManyLeases)
            else:
                admitted.append(p)
        return admitted, barriers
