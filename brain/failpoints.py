"""Failpoints: named places where a fault test makes a server misbehave
on purpose, at the one moment a race needs (etcd's gofail, in spirit).

A fault test that must stop a replica *between* winning the election key
and appending its epoch record cannot aim a SIGSTOP from outside at a
window of a few milliseconds; the replica stops itself there instead.

Armed only through the environment: ``BRAIN_FAILPOINTS_FILE`` names a file
the test writes and removes while the server runs, one failpoint a line:

    promote.start stop          # SIGSTOP this process (SIGCONT resumes it)
    promote.start sleep 2.5     # sleep that many seconds

Without the variable ``hit`` returns at once, so a failpoint costs nothing
in production; with it, each hit reads the file (failpoints sit on rare
paths only: a promotion, not a write).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("brain.failpoints")

ENV = "BRAIN_FAILPOINTS_FILE"
_FILE = os.environ.get(ENV)


def hit(name: str) -> None:
    """Run the action armed for ``name``, if any."""
    if not _FILE:
        return
    action = _armed(_FILE).get(name)
    if action is None:
        return
    kind, *args = action
    if kind == "stop":
        log.warning("failpoint %s: stopping this process (SIGSTOP) until it is continued", name)
        # sent to this thread, so that it stops before it returns from the
        # call (a signal sent to the process may be taken by another thread,
        # and this one would run on a little first)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        log.warning("failpoint %s: continued", name)
    elif kind == "sleep":
        seconds = float(args[0])
        log.warning("failpoint %s: sleeping %.2fs", name, seconds)
        time.sleep(seconds)
    else:
        log.error("failpoint %s: unknown action %r", name, action)


def _armed(path: str) -> dict[str, list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: dict[str, list[str]] = {}
    for line in lines:
        words = line.split()
        if len(words) >= 2 and not words[0].startswith("#"):
            out[words[0]] = words[1:]
    return out
