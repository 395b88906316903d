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
import threading

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
