"""Health checks, as etcd's /health, /livez and /readyz answer them.

/health: {"health":"true","reason":""} with 200, or "false" and a reason
with 503.  In etcd's order: a raised alarm ("ALARM NOSPACE", "ALARM
CORRUPT"; ?exclude=NOSPACE skips one), then the leader (brain always has
one), then a read.  brain adds one check etcd does not need: once a journal
failure has stopped writes, the server is unhealthy until restarted.

/livez and /readyz run named checks and answer "ok" (with ?verbose, one
"[+]name ok" line per check first) or 503 with "[-]name failed: reason"
lines; /livez/<name> and /readyz/<name> run one check, ?exclude=<name>
skips one.
"""

from __future__ import annotations

from dataclasses import dataclass

from brain.engine.alarms import ALARM_CORRUPT, ALARM_NAMES, ALARM_NOSPACE
from brain.mvcc.requests import RangeRequest


@dataclass(frozen=True)
class Health:
    health: bool
    reason: str = ""


def _read(engine) -> str | None:
    try:
        engine.range(RangeRequest(b"health", b"", limit=1, keys_only=True))
    except Exception as e:  # noqa: BLE001 - reported as the reason
        return f"RANGE ERROR:{getattr(e, 'message', None) or e}"
    return None


def check_health(engine, exclude: set[str] = frozenset()) -> Health:
    for _member, alarm in engine.alarms.get():
        name = ALARM_NAMES.get(alarm, "UNKNOWN")
        if name in exclude:
            continue
        if alarm == ALARM_NOSPACE:
            return Health(False, "ALARM NOSPACE")
        if alarm == ALARM_CORRUPT:
            return Health(False, "ALARM CORRUPT")
        return Health(False, "ALARM UNKNOWN")
    failed = engine.statistics().failed
    if failed:
        return Health(False, f"ENGINE FAILED:{failed}")
    err = _read(engine)
    if err:
        return Health(False, err)
    return Health(True, "")


def _corruption(engine) -> str | None:
    if engine.alarms.has(ALARM_CORRUPT):
        return "alarm activated: CORRUPT"
    return None


def _writable(engine) -> str | None:
    failed = engine.statistics().failed
    return f"writes stopped until restart: {failed}" if failed else None


LIVEZ_CHECKS = {"serializable_read": _read}
READYZ_CHECKS = {
    "data_corruption": _corruption,
    "serializable_read": _read,
    "linearizable_read": _read,
    "non_learner": lambda engine: None,
    "writable": _writable,
}


def run_checks(engine, checks: dict, names) -> tuple[bool, str]:
    ok = True
    lines = []
    for name in names:
        err = checks[name](engine)
        if err:
            ok = False
            lines.append(f"[-]{name} failed: {err}\n")
        else:
            lines.append(f"[+]{name} ok\n")
    return ok, "".join(lines)
