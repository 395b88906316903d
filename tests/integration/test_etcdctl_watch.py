"""`etcdctl watch` against brain, output compared with a real etcd."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.conftest import require_etcdctl
from tests.support.servers import etcdctl_flags

pytestmark = pytest.mark.etcd


def watch_output(endpoint: str, *args: str, seconds: float = 2.0) -> str:
    env = dict(os.environ, ETCDCTL_API="3")
    try:
        subprocess.run(["etcdctl", "--endpoints", endpoint, *etcdctl_flags(endpoint), "watch", *args], env=env,
                       capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        return out.decode() if isinstance(out, bytes) else out
    raise AssertionError("etcdctl watch ended on its own")


def test_etcdctl_watch_history_prefix_prev_kv(servers, ctl):
    require_etcdctl()
    ctl("put", "w/a", "1")
    ctl("put", "w/b", "2")
    ctl("put", "w/a", "3")
    ctl("del", "w/b")
    ctl("txn", stdin="\nput w/c 4\nput w/d 5\n\n")
    first = 2
    cases = [
        ("w/", "--prefix", f"--rev={first}", "--prev-kv"),
        ("w/a", f"--rev={first}"),
        ("w/", "w/c", f"--rev={first}", "-w", "json"),
    ]
    for args in cases:
        got = watch_output(servers.brain.endpoint, *args)
        assert "PUT" in got or "Events" in got, got
        want = watch_output(servers.etcd.endpoint, *args)
        if "-w" in args:
            # ids differ between servers; compare everything else
            import json
            def strip(text):
                out = []
                for line in text.splitlines():
                    d = json.loads(line)
                    d["Header"].pop("cluster_id", None)
                    d["Header"].pop("member_id", None)
                    d["Header"].pop("raft_term", None)
                    out.append(d)
                return out
            assert strip(got) == strip(want)
        else:
            assert got == want
