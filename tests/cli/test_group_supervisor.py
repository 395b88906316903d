"""`brain groups` running its groups (brain.cli.group_supervisor): each
group a `brain serve` of its own, a dead one reported and started again on
its data, one that dies right after its start left down with its log, a
start failure stopping the rest, SIGTERM stopping every group cleanly, and
no group outliving a supervisor killed with SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.harness import brain_env, free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


class Supervisor:
    """`python -m brain groups ARGS` with its output read line by line."""

    def __init__(self, cwd: Path, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "brain", "groups", *args], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=brain_env(os.environ), start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 60.0, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    m = re.search(pattern, line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._cond.wait(0.2)):
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(min(left, 0.5))

    def pids(self) -> dict[str, int]:
        """Each group's pid from the "up" banner."""
        self.wait_for(r"^kube-apiserver flags:")
        return {m.group(1): int(m.group(2)) for m in (re.match(r"^  (\S+)\s+\S+\s+pid (\d+)", ln) for ln in self.lines)
                if m}

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def supervisors():
    made: list[Supervisor] = []
    yield made
    for s in made:
        s.kill()


def _kv(port: int) -> rpc_pb2_grpc.KVStub:
    return rpc_pb2_grpc.KVStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pids, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if not _gone(p)]
        if not left:
            return []
        time.sleep(0.1)
    return left


def _two_groups(tmp_path: Path, *extra: str) -> tuple[list[str], int, int]:
    main, le = free_port(), free_port()
    args = ["--group", "le=coordination.k8s.io/leases,/events",
            "--listen-client-urls", f"default=http://127.0.0.1:{main}",
            "--listen-client-urls", f"le=http://127.0.0.1:{le}",
            "--listen-metrics-urls", f"le=http://127.0.0.1:{free_port()}",
            "--data-root", str(tmp_path / "root"), "--serve-flag", "shutdown-grace=1", *extra]
    return args, main, le


def test_a_dead_group_is_started_again_and_sigterm_stops_every_group(tmp_path, supervisors):
    args, main, le = _two_groups(tmp_path, "--restart-delay", "0.5")
    sup = Supervisor(tmp_path, *args)
    supervisors.append(sup)
    pids = sup.pids()
    assert set(pids) == {"default", "le"}
    sup.wait_for(rf"^  --etcd-servers-overrides=coordination.k8s.io/leases#http://127.0.0.1:{le},"
                 rf"/events#http://127.0.0.1:{le}$")
    _kv(le).Put(rpc_pb2.PutRequest(key=b"/registry/leases/kube-node-lease/n1", value=b"v"), timeout=10)
    _kv(main).Put(rpc_pb2.PutRequest(key=b"/registry/pods/ns/p", value=b"v"), timeout=10)
    # each group is a brain of its own: its revisions are its own
    assert _kv(le).Range(rpc_pb2.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10).count == 0

    mark = len(sup.lines)
    os.kill(pids["le"], signal.SIGKILL)
    sup.wait_for(rf"le \(http://127.0.0.1:{le}, pid {pids['le']}\) was killed by SIGKILL after \d+ s; the other "
                 "groups go on serving", start=mark)
    again = int(sup.wait_for(r"le started again, pid (\d+)", start=mark).group(1))
    sup.wait_for(rf"le serves again \(http://127.0.0.1:{le}\)", start=mark)
    got = _kv(le).Range(rpc_pb2.RangeRequest(key=b"/registry/leases/kube-node-lease/n1"), timeout=10)
    assert [kv.value for kv in got.kvs] == [b"v"], "the group recovered its data dir"

    # a group that ends within 10 s of its start (not by SIGKILL) would end again: left down, with its log
    mark = len(sup.lines)
    os.kill(again, signal.SIGTERM)
    sup.wait_for(rf"le .* exited with status 0 after \d s", start=mark)
    sup.wait_for(r"it died \d s after it started: not starting it again; its log, .*le.log, ends:", start=mark)
    sup.wait_for(r"^    .*brain.cli.serve: stopped", start=mark)
    time.sleep(1.5)
    assert not any("le started again" in ln for ln in sup.lines[mark:])

    mark = len(sup.lines)
    assert sup.stop(signal.SIGTERM) == 0, "\n".join(sup.lines)
    sup.wait_for(r"stopping default$", start=mark)
    sup.wait_for(r"^  default stopped$", start=mark)
    assert _wait_gone([pids["default"]]) == []
    logs = sorted(p.name for p in (tmp_path / "root").iterdir())
    assert logs == ["default", "default.log", "le", "le.log"]


def test_a_group_that_cannot_start_stops_the_others_and_exits_1(tmp_path, supervisors):
    args, main, le = _two_groups(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", le))
        taken.listen()
        sup = Supervisor(tmp_path, *args)
        supervisors.append(sup)
        assert sup.proc.wait(90) == 1, "\n".join(sup.lines)
    text = "\n".join(sup.lines)
    assert re.search(r"group le exited with status 1 while starting; its log, .*le.log, ends:", text), text
    assert re.search(r"address already in use", text, re.I), text
    default_pid = int(re.search(r"default pid (\d+)", text).group(1))
    assert _wait_gone([default_pid]) == []
    assert "brain groups up" not in text


def test_a_group_left_down_and_no_group_outlives_a_killed_supervisor(tmp_path, supervisors):
    args, main, le = _two_groups(tmp_path, "--restart-delay", "-1")
    sup = Supervisor(tmp_path, *args)
    supervisors.append(sup)
    pids = sup.pids()
    mark = len(sup.lines)
    os.kill(pids["le"], signal.SIGKILL)
    sup.wait_for(r"left down \(--restart-delay -1\); its command, to start it by hand:", start=mark)
    sup.wait_for(rf"^    \S*python\S* -m brain serve --name=le .*--listen-client-urls=http://127.0.0.1:{le}",
                 start=mark)
    # the supervisor dies without a word: its groups get SIGTERM from the kernel (PR_SET_PDEATHSIG)
    sup.kill()
    assert _wait_gone([pids["default"]]) == [], "a group outlived its supervisor"
