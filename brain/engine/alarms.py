"""Alarms, as etcd keeps them: a set of (member ID, alarm type) pairs.

etcd raises NOSPACE when a write is refused for exceeding the backend quota
and then refuses every put, lease grant and Txn that may put, whatever the
space, until an operator disarms it (after compacting and defragmenting).
CORRUPT makes it refuse every write.  Alarms are stored with the data, so
they survive a restart.  Clients may also raise or clear any alarm for any
member ID through the Maintenance Alarm call.

The types are the values of etcd's AlarmType enum; this module stays free
of protobuf.
"""

from __future__ import annotations

import json
import logging
import threading

from ..backend import BackendError, WriteBatch
from ..mvcc.requests import LeaseGrantRequest, PutRequest, TxnRequest, unwrapped

log = logging.getLogger("brain.engine")

ALARM_NONE = 0
ALARM_NOSPACE = 1
ALARM_CORRUPT = 2

ALARM_NAMES = {ALARM_NONE: "NONE", ALARM_NOSPACE: "NOSPACE", ALARM_CORRUPT: "CORRUPT"}


class AlarmSet:
    """Thread-safe set of (member_id, alarm) pairs with a JSON encoding."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alarms: set[tuple[int, int]] = set()
        self._types: set[int] = set()

    def load(self, data: bytes | None) -> None:
        pairs = json.loads(data) if data else []
        with self._lock:
            self._alarms = {(int(m), int(a)) for m, a in pairs}
            self._types = {a for _, a in self._alarms}

    def encode(self) -> bytes:
        with self._lock:
            return json.dumps(sorted(self._alarms)).encode()

    def has(self, alarm: int) -> bool:
        """True when any member has `alarm` raised (cheap: no lock needed)."""
        return alarm in self._types

    def get(self, alarm: int = ALARM_NONE) -> list[tuple[int, int]]:
        """Raised alarms of type `alarm` (ALARM_NONE: all), in a stable order."""
        with self._lock:
            return sorted(p for p in self._alarms if alarm == ALARM_NONE or p[1] == alarm)

    def activate(self, member_id: int, alarm: int, persist=None) -> bool:
        """Raise; False when it was already raised.  `persist(encoded)` is
        called with the new state before the change takes effect."""
        with self._lock:
            if (member_id, alarm) in self._alarms:
                return False
            self._change(self._alarms | {(member_id, alarm)}, persist)
            return True

    def deactivate(self, member_id: int, alarm: int, persist=None) -> bool:
        """Clear; False when it was not raised (see activate for persist)."""
        with self._lock:
            if (member_id, alarm) not in self._alarms:
                return False
            self._change(self._alarms - {(member_id, alarm)}, persist)
            return True

    def _change(self, alarms: set[tuple[int, int]], persist) -> None:
        if persist is not None:
            persist(json.dumps(sorted(alarms)).encode())
        self._alarms = alarms
        self._types = {a for _, a in alarms}

    def __len__(self) -> int:
        return len(self._alarms)


META_ALARMS = b"brain.alarms"  # where a data directory's value store keeps them


class StoredAlarms(AlarmSet):
    """A data directory's alarms: loaded from its value store, and written
    back before every change takes effect, so they survive a restart."""

    def __init__(self, backend) -> None:
        super().__init__()
        self._backend = backend
        self.load(backend.get_meta(META_ALARMS))

    def _store(self, encoded: bytes) -> None:
        self._backend.write(WriteBatch(meta={META_ALARMS: encoded}))

    def raise_alarm(self, member_id: int, alarm: int) -> bool:
        """Raise (stored with the data); False if already raised."""
        return self.activate(member_id, alarm, self._store)

    def clear_alarm(self, member_id: int, alarm: int) -> bool:
        """Clear; False if it was not raised."""
        return self.deactivate(member_id, alarm, self._store)

    def raise_nospace(self, member_id: int, why: str) -> None:
        """Raise NOSPACE (puts, lease grants and Txns that may put are
        refused until it is disarmed, as in etcd): stored with the data
        where there is room for it, else held in memory until a restart."""
        log.warning("%s; raising the NOSPACE alarm", why)
        try:
            self.raise_alarm(member_id, ALARM_NOSPACE)
        except BackendError as e:
            self.activate(member_id, ALARM_NOSPACE)
            log.warning("the NOSPACE alarm could not be stored (%s); it holds until a restart", e)


def adds_data(req) -> bool:
    """What the NOSPACE alarm and an exceeded quota refuse, as etcd 3.6 does
    (its capped applier and quota refuse a request whose cost is above 0): a
    Put, a LeaseGrant, and a Txn with a Put directly in either branch.
    etcd's costTxn counts only those Puts, so a Txn that only deletes, or
    puts only inside a nested Txn, is applied."""
    req = unwrapped(req)  # an Authorized write is judged as the write it carries
    if isinstance(req, (PutRequest, LeaseGrantRequest)):
        return True
    if isinstance(req, TxnRequest):
        return any(isinstance(op, PutRequest) for op in (*req.success, *req.failure))
    return False
