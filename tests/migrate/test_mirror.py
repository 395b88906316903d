"""`brain mirror` against a real etcd, differentially: the mirror copies an
etcd that already has history (compactions, leases), follows it while a
writer keeps going (puts, Txns putting several keys in one revision,
deletes, lease grants with keys, revokes, compactions), reports its lag as
progress lines and metrics, and on SIGTERM drains to etcd's revision; brain
serving the directory then answers every Range at every retained revision,
every Watch from every retained revision and every lease question exactly
as etcd does."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.migrate.compare import fingerprint
from tests.migrate.conftest import etcdctl
from tests.migrate.workload import write_history
from tests.support.servers import REPO_ROOT, free_port

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(600)]


class MirrorProcess:
    def __init__(self, source: str, data_dir, *args: str) -> None:
        self.metrics_port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brain", "mirror", "--from", source, "--data-dir", str(data_dir),
             "--lease-poll-interval", "200ms", "--progress-interval", "500ms",
             "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO_ROOT), env=env)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        i = 0
        with self._cond:
            while True:
                while i < len(self.lines):
                    if rx.search(self.lines[i]):
                        return self.lines[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines[-40:]))
                self._cond.wait(min(left, 0.5))

    def metrics(self) -> dict[str, float]:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(brain_mirror_\w+) (\S+)$", body, re.M)}

    def stop(self, timeout: float = 120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.parametrize("version", ["3.7", "3.6", "3.4"])
def test_mirror_follows_etcd_revision_for_revision(version, etcd_of, brain_on, tmp_path):
    etcd = etcd_of(version)
    with etcd.stubs() as s:
        before = write_history(s, seed=21, ops=200)
    assert before.compactions and before.leases
    data_dir = tmp_path / "mirror"
    mirror = MirrorProcess(f"http://{etcd.endpoint}", data_dir)
    try:
        mirror.wait_for(rf"copied etcd's revision {before.revision} ")
        mirror.wait_for(r"mirror: following: .*\(0 behind")

        # a writer keeps going while the mirror follows
        with etcd.stubs() as s:
            during = write_history(s, seed=22, ops=400, prefix=b"during/")
        assert during.compactions and during.multi_put_revisions and during.leases and during.revoked
        mirror.wait_for(rf"revision {during.revision:,} of etcd's {during.revision:,} \(0 behind")
        m = mirror.metrics()
        assert m["brain_mirror_applied_revision"] == during.revision == m["brain_mirror_source_revision"]
        assert m["brain_mirror_lag_revisions"] == 0 and m["brain_mirror_following"] == 1
        assert m["brain_mirror_revisions_total"] == during.revision - before.revision
        # (a lease granted and revoked between two polls may never be seen: nothing to copy)
        assert m["brain_mirror_lease_grants_total"] > 0 and m["brain_mirror_lease_revokes_total"] > 0
        deadline = time.monotonic() + 30  # the compaction probe runs every few seconds
        while mirror.metrics()["brain_mirror_compact_revision"] != during.compactions[-1]:
            assert time.monotonic() < deadline, mirror.metrics()
            time.sleep(0.5)

        # etcd restarts under the mirror: it watches again from where it was
        etcd.restart()
        mirror.wait_for(r"watching again from revision")
        with etcd.stubs() as s:
            after = write_history(s, seed=23, ops=60, prefix=b"after/")
        mirror.wait_for(rf"revision {after.revision:,} of etcd's {after.revision:,} \(0 behind")

        # the cutover: writers stop, the mirror drains to etcd's last revision and exits
        last = after.revision
        assert etcdctl(etcd.endpoint, "put", "last-write", "x").returncode == 0
        last += 1
        assert mirror.stop() == 0, "\n".join(mirror.lines[-30:])
        assert any(f"stopped at revision {last} " in line for line in mirror.lines), mirror.lines[-5:]
    finally:
        mirror.kill()

    want = fingerprint(etcd.endpoint)
    brain = brain_on(data_dir, shards=4)
    got = fingerprint(brain.endpoint)
    assert got.diff(want) is None, got.diff(want)


def test_mirror_refuses_a_used_directory_and_reports_an_unreachable_source(etcd_of, tmp_path):
    etcd = etcd_of("3.4")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "x").write_text("mine")
    m = MirrorProcess(f"http://{etcd.endpoint}", occupied)
    try:
        assert m.proc.wait(60) == 1
        m._reader.join(5)
        assert any("not brain's (x)" in line for line in m.lines), m.lines
    finally:
        m.kill()
    m = MirrorProcess(f"http://127.0.0.1:{free_port()}", tmp_path / "new")
    try:
        assert m.proc.wait(60) == 1
        m._reader.join(5)
        assert any("UNAVAILABLE" in line for line in m.lines), m.lines
        assert not (tmp_path / "new").exists()
    finally:
        m.kill()
