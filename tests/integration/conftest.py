"""Servers and an etcdctl runner for the integration tests.

Each module gets one `python -m brain serve` per server setting (every
BRAIN_TEST_SHARDS setting on plaintext TCP, the first one over mutual TLS
and a unix socket: tests.support.servers.server_settings_from_env) and one
etcd beside it (without an etcd binary the module fails under CI and is
skipped, and listed, elsewhere).  Tests send the same commands to both in the same order,
so the two stores stay in lockstep (same revisions) and outputs can be
compared byte for byte after masking the cluster/member ids and raft term.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from tests.support.servers import (
    etcdctl_flags,
    require_brain,
    require_etcd,
    server_settings_from_env,
    setting_id,
    start_brain,
    start_etcd,
    unavailable,
)

ETCDCTL = os.environ.get("ETCDCTL_BIN", shutil.which("etcdctl") or "/usr/bin/etcdctl")

# etcdctl 3.4's retry interceptor logs a JSON warning with a random client id
# before printing "Error: ..."; such lines are dropped before comparing.
_WARN_LINE = re.compile(r'^\{"level":"warn".*\}$')
_IDS = [
    (re.compile(r'"cluster_id":\d+'), '"cluster_id":<C>'),
    (re.compile(r'"member_id":\d+'), '"member_id":<M>'),
    (re.compile(r'"raft_term":\d+'), '"raft_term":<T>'),
    (re.compile(r'"ClusterID" : \d+'), '"ClusterID" : <C>'),
    (re.compile(r'"MemberID" : \d+'), '"MemberID" : <M>'),
    (re.compile(r'"RaftTerm" : \d+'), '"RaftTerm" : <T>'),
]


def require_etcdctl() -> None:
    if not (os.path.isfile(ETCDCTL) and os.access(ETCDCTL, os.X_OK)):
        unavailable(f"etcdctl not found at {ETCDCTL} (apt-get install etcd-client)")


@dataclass
class CtlResult:
    rc: int
    out: str
    err: str  # stderr without etcdctl's retry warnings

    def masked(self) -> tuple[int, str, str]:
        out = self.out
        for pat, repl in _IDS:
            out = pat.sub(repl, out)
        return self.rc, out, self.err


def run_etcdctl(endpoint: str, *args: str, stdin: str | bytes | None = None, timeout: float = 30) -> CtlResult:
    env = dict(os.environ, ETCDCTL_API="3")
    data = stdin.encode() if isinstance(stdin, str) else stdin
    p = subprocess.run(
        [ETCDCTL, f"--endpoints={endpoint}", *etcdctl_flags(endpoint), "--command-timeout=15s", "--dial-timeout=5s",
         *args],
        input=data if data is not None else b"",
        capture_output=True,
        env=env,
        timeout=timeout,
    )
    err = "\n".join(l for l in p.stderr.decode(errors="replace").splitlines() if not _WARN_LINE.match(l))
    return CtlResult(p.returncode, p.stdout.decode(errors="replace"), err)


class Ctl:
    """etcdctl against brain, mirrored to etcd (compared unless compare=False)."""

    def __init__(self, brain_endpoint: str, etcd_endpoint: str) -> None:
        self.brain = brain_endpoint
        self.etcd = etcd_endpoint

    def __call__(self, *args: str, stdin: str | bytes | None = None, compare: bool = True) -> CtlResult:
        got = run_etcdctl(self.brain, *args, stdin=stdin)
        want = run_etcdctl(self.etcd, *args, stdin=stdin)
        if compare:
            assert got.masked() == want.masked(), f"etcdctl {' '.join(args)}: brain differs from etcd"
        return got


@dataclass
class Servers:
    brain: object
    etcd: object
    shards: int


@pytest.fixture(scope="module", params=server_settings_from_env(), ids=setting_id)
def servers(request):
    require_brain()
    require_etcd()
    shards, transport = request.param
    brain = start_brain(shards=shards, transport=transport)
    try:
        etcd = start_etcd()
    except BaseException:
        brain.cleanup()
        raise
    try:
        yield Servers(brain, etcd, shards)
    finally:
        brain.cleanup()
        etcd.cleanup()


@pytest.fixture(scope="module")
def ctl(servers):
    require_etcdctl()
    return Ctl(servers.brain.endpoint, servers.etcd.endpoint)
