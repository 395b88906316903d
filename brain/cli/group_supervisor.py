"""The processes of `brain groups`: one `brain serve` per group, started,
watched and stopped, as deploy/local-cluster.sh watches a cluster's.

Each group runs in a session of its own, so a Ctrl-C in the terminal
reaches the supervisor alone, which stops the groups with one SIGTERM each
(a second signal would make a brain exit without draining).  Each is also
told to get SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), so a
supervisor killed with SIGKILL does not leave groups behind that nobody
watches.  The supervisor has no threads: it polls its children a few times
a second, which forking with a ``preexec_fn`` needs.

A group that dies is reported and started again after the restart delay on
its data directory (it recovers, and a replica catches up from its
journal); one that dies within 10 s of its start, other than by SIGKILL,
is left down with the end of its log, since starting it again would fail
the same way (a port taken, a data directory refused).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from brain.cli.group_layout import Group, Layout
from brain.config import parse_listen_url

# A group dead this soon after its start is not started again (as deploy/local-cluster.sh decides).
EARLY_DEATH_S = 10.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _tail(path: Path, lines: int = 5) -> list[str]:
    try:
        data = path.read_bytes()[-4000:]
    except OSError:
        return ["(no log)"]
    return data.decode("utf-8", "replace").splitlines()[-lines:]


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def probe(group: Group, timeout: float = 1.0) -> str | None:
    """None once the group serves: its first client listener accepts a
    connection (brain opens it last, once its data dir is open) and, when it
    has an http metrics listener, /readyz answers 200; else what is missing."""
    url = parse_listen_url(group.client_urls[0])
    try:
        if url.is_unix:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(timeout)
                s.connect(url.path)
        else:
            host, _, port = url.address.rpartition(":")
            host = {"0.0.0.0": "127.0.0.1", "[::]": "::1"}.get(host, host).strip("[]")
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
    except OSError as e:
        return f"{url.url}: {e.strerror or e}"
    http = [u for u in group.metrics_urls if u.startswith("http://")]
    if http:
        address = parse_listen_url(http[0]).address
        try:
            with urllib.request.urlopen(f"http://{address}/readyz", timeout=timeout) as r:
                if r.status != 200:
                    return f"{http[0]}/readyz: HTTP {r.status}"
        except urllib.error.HTTPError as e:
            return f"{http[0]}/readyz: HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            return f"{http[0]}/readyz: {e}"
    return None


class Member:
    """One group's `brain serve` process, its log appended to ``log_path``."""

    def __init__(self, group: Group, log_path: Path, python: str):
        self.group = group
        self.log_path = log_path
        self.argv = [python, "-m", "brain", "serve", *group.serve_args()]
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.ready = False
        self.restart_at: float | None = None  # time.monotonic() of a start to come

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        parent = os.getpid()
        libc = _libc()

        def die_with_parent() -> None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the supervisor died before the prctl
                os.kill(os.getpid(), signal.SIGTERM)

        with open(self.log_path, "ab", buffering=0) as log:
            log.write(f"\n===== brain groups: {time.strftime('%Y-%m-%d %H:%M:%S')} start: "
                      f"{' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=die_with_parent)
        self.started = time.monotonic()
        self.ready = False
        self.restart_at = None

    def signal(self, sig: int) -> None:
        if self.alive:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


class Supervisor:
    """Starts every group of ``layout``, says so once each serves, starts a
    dead one again after ``restart_delay`` seconds (a negative delay leaves
    it down), and on SIGTERM or SIGINT stops them all."""

    def __init__(self, layout: Layout, restart_delay: float = 5.0, start_timeout: float = 300.0,
                 stop_timeout: float = 60.0, python: str = sys.executable, out=sys.stdout):
        self.layout = layout
        self.restart_delay = restart_delay
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.members = [Member(g, layout.log_path(g), python) for g in layout.groups]
        self.out = out
        self.signals: list[str] = []

    def say(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)

    def event(self, msg: str) -> None:
        self.say(f"{time.strftime('%H:%M:%S')} {msg}")

    def _on_signal(self, signum, _frame) -> None:
        self.signals.append(signal.Signals(signum).name)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            Path(self.layout.data_root).mkdir(parents=True, exist_ok=True)
            for m in self.members:
                Path(m.group.data_dir).parent.mkdir(parents=True, exist_ok=True)
                m.start()
            self.say(f"starting {len(self.members)} groups (logs in {self.layout.data_root}): "
                     + ", ".join(f"{m.name} pid {m.proc.pid}" for m in self.members))
            code = self._wait_up()
            if code is not None:
                stopped = self._stop_all()
                return code or stopped
            self._banner()
            self._watch()
            return self._stop_all()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _wait_up(self) -> int | None:
        """None once every group serves; an exit code when one died first, time ran out or a signal came."""
        deadline = time.monotonic() + self.start_timeout
        last = {}
        while True:
            if self.signals:
                self.say(f"{self.signals[0]} before every group was up: stopping them")
                return 0
            for m in self.members:
                if not m.alive:
                    self.say(f"group {m.name} {_how(m.proc.returncode)} while starting; its log, {m.log_path}, "
                             "ends:")
                    for line in _tail(m.log_path):
                        self.say(f"    {line}")
                    return 1
                if not m.ready:
                    last[m.name] = probe(m.group)
                    m.ready = last[m.name] is None
            if all(m.ready for m in self.members):
                return None
            if time.monotonic() > deadline:
                waiting = [f"{m.name} ({last[m.name]})" for m in self.members if not m.ready]
                self.say(f"not every group serves after {self.start_timeout:.0f} s: {', '.join(waiting)}")
                return 1
            time.sleep(POLL_S)

    def _banner(self) -> None:
        width = max(len(m.name) for m in self.members)
        self.say(f"brain groups up: {len(self.members)} groups, logs in {self.layout.data_root}")
        for m in self.members:
            urls = ",".join(m.group.client_urls)
            self.say(f"  {m.name:{width}s}  {urls}  pid {m.proc.pid}  {m.group.describe_resources()}")
        for note in self.layout.notes():
            self.say(f"  note: {note}")
        self.say("kube-apiserver flags:")
        for flag in self.layout.apiserver_flags():
            self.say(f"  {flag}")
        moved = next((g for g in self.layout.groups if not g.is_default), None)
        if moved is not None and moved.endpoints[0].startswith("http://"):
            self.say(f"try: ETCDCTL_API=3 etcdctl --endpoints {moved.endpoints[0]} get "
                     f"/registry/{moved.stored[0].resource}/ --prefix --keys-only")
        again = (f"is started again after {self.restart_delay:g} s" if self.restart_delay >= 0
                 else "is left down")
        self.say(f"SIGTERM or Ctrl-C stops every group; a group that dies {again} (--restart-delay).")

    def _watch(self) -> None:
        while not self.signals:
            now = time.monotonic()
            for m in self.members:
                if m.restart_at is not None:
                    if now >= m.restart_at:
                        m.start()
                        self.event(f"{m.name} started again, pid {m.proc.pid}")
                    continue
                if m.proc is None:
                    continue
                if not m.alive:
                    self._died(m, now)
                elif not m.ready and probe(m.group) is None:
                    m.ready = True
                    self.event(f"{m.name} serves again ({','.join(m.group.client_urls)})")
            time.sleep(POLL_S)

    def _died(self, m: Member, now: float) -> None:
        code = m.proc.returncode
        lived = now - m.started
        dead = m.proc.pid
        m.ready = False
        self.event(f"{m.name} ({','.join(m.group.client_urls)}, pid {dead}) {_how(code)} after {lived:.0f} s; "
                   "the other groups go on serving")
        if self.restart_delay < 0:
            self.say(f"  left down (--restart-delay {self.restart_delay:g}); its command, to start it by hand:")
            self.say(f"    {' '.join(m.argv)}")
            m.proc = None
        elif lived < EARLY_DEATH_S and code != -signal.SIGKILL:
            self.say(f"  it died {lived:.0f} s after it started: not starting it again; its log, {m.log_path}, ends:")
            for line in _tail(m.log_path):
                self.say(f"    {line}")
            m.proc = None
        else:
            self.say(f"  starting it again in {self.restart_delay:g} s (--restart-delay) on its data dir")
            m.restart_at = now + self.restart_delay

    def _stop_all(self) -> int:
        """SIGTERM to every live group, SIGKILL to those still running after
        ``stop_timeout`` or at a second signal; 0 when each stopped cleanly."""
        live = [m for m in self.members if m.alive]
        if not live:
            return 0
        seen = len(self.signals)
        self.event(f"stopping {', '.join(m.name for m in live)}")
        for m in live:
            m.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        killed = False
        while any(m.alive for m in live):
            if not killed and (len(self.signals) > seen or time.monotonic() > deadline):
                self.event("killing the groups still running (SIGKILL)")
                for m in live:
                    m.signal(signal.SIGKILL)
                killed = True
            time.sleep(POLL_S / 2)
        bad = [m for m in live if m.proc.returncode != 0]
        for m in live:
            self.say(f"  {m.name} {'stopped' if m.proc.returncode == 0 else _how(m.proc.returncode)}")
        return 1 if bad else 0
