"""What a cluster of test servers on loopback has in common (the etcd 3.6
cluster and the NATS cluster build on it): one temporary root holding each
member's directory, a ``Watchdog`` bounding their lifetime, members started
together (a member of a cluster is not ready before a quorum is), kill -9 and
restart, every member's log tail for a failure message, and teardown."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tests.support import servers
from tests.support.watchdog import Watchdog


class GroupMember(servers._Server):
    """A member of a ``ServerGroup``: its directory is ``<group root>/<name>``."""

    def __init__(self, group: "ServerGroup", name: str, **kw):
        self.group = group
        self.name = name
        super().__init__(**kw)
        # One root for the group: the watchdog finds it in command lines.
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = group.root / name
        self.root.mkdir(parents=True)
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"

    def _spawn(self) -> None:
        super()._spawn()
        self.group.watchdog.track(self.name, self.proc)


class ServerGroup:
    """Members in ``self.members``; subclasses create them and may override
    ``_prepare`` (before any member starts) and ``_ready`` (after all are)."""

    def __init__(self, prefix: str, *, lifetime: float, ready_timeout: float):
        self.ready_timeout = ready_timeout
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=servers._tmp_parent()))
        self.watchdog = Watchdog(self.root, lifetime)
        self.members: list = []

    def _prepare(self) -> None:
        pass

    def _ready(self) -> None:
        pass

    def start(self):
        """Start every member at once, wait for each, then for ``_ready``."""
        try:
            self._prepare()
            for m in self.members:
                m._spawn()
            for m in self.members:
                m._wait_ready()
                m._starts += 1
            self._ready()
        except BaseException:
            self.cleanup()
            raise
        return self

    def kill9(self, member) -> float:
        """SIGKILL ``member`` (its data is kept); returns the kill's time.time()."""
        t = time.time()
        member.kill9()
        return t

    def restart(self, member) -> None:
        """Start a stopped or killed member again: same ports, config and data."""
        member.stop()
        member.start()

    def logs(self, nbytes: int = 4000) -> str:
        """The tail of every member's log, for a failure message."""
        return "\n".join(f"--- {m.name} ({m.log_path}) ---\n{m.log_tail(nbytes)}" for m in self.members)

    def stop(self) -> None:
        for m in self.members:
            m.stop(grace=5.0)

    def cleanup(self) -> None:
        """Stop every member and remove the root (unless KEEP_TEST_DIRS)."""
        self.stop()
        self.watchdog.stop()
        if not os.environ.get("KEEP_TEST_DIRS"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
