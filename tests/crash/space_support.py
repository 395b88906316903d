"""What the full-disk and disk-fault tests share: writes until etcd's
NOSPACE error, the acknowledged ones checked, etcdctl's alarm commands."""

from __future__ import annotations

import os
import re
import subprocess
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.support.servers import BrainServer, http_get, require_tool

NOSPACE = "etcdserver: mvcc: database space exceeded"
ETCDCTL = os.environ.get("ETCDCTL_BIN", "etcdctl")


def put_until_nospace(srv: BrainServer, value_bytes: int, limit: int = 3000, prefix: bytes = b"k"
                      ) -> tuple[dict[bytes, tuple[int, bytes]], list[bytes]]:
    """Puts (keys ``prefix`` and a number) until etcd's NOSPACE error
    answers several in a row; every answer is success or that error, and
    none succeeds after the first refusal.  The acknowledged ones, and the
    keys of the refused ones."""
    acked: dict[bytes, tuple[int, bytes]] = {}
    refused: list[bytes] = []
    with srv.stubs() as st:
        for i in range(limit):
            key, value = prefix + b"%05d" % i, os.urandom(value_bytes // 2).hex().encode()
            try:
                rev = st.kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision
            except grpc.RpcError as e:
                assert (e.code(), e.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, NOSPACE), \
                    (e.code(), e.details(), srv.log_tail())
                refused.append(key)
                if len(refused) == 5:
                    break
                continue
            assert not refused, "a put succeeded after NOSPACE"
            acked[key] = (rev, value)
    assert len(refused) == 5, f"no NOSPACE after {limit} puts:\n{srv.log_tail()}"
    assert srv.proc.poll() is None, f"brain exited ({srv.proc.returncode}):\n{srv.log_tail()}"
    return acked, refused


def check_acked(st, acked: dict[bytes, tuple[int, bytes]], absent=()) -> None:
    """Every acknowledged write is there as it was acknowledged; every key
    in ``absent`` (refused, or deleted) is not."""
    for key, (rev, value) in acked.items():
        kvs = st.kv.Range(pb.RangeRequest(key=key), timeout=10).kvs
        assert kvs and (kvs[0].mod_revision, kvs[0].value) == (rev, value), key
    for key in absent:
        assert not st.kv.Range(pb.RangeRequest(key=key), timeout=10).kvs, key


def refused_for_space(call) -> None:
    with pytest.raises(grpc.RpcError) as ei:
        call()
    assert (ei.value.code(), ei.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, NOSPACE)


ETCDCTL_ENV = {**os.environ, "ETCDCTL_API": "3"}


def etcdctl_command(srv: BrainServer, *args: str) -> list[str]:
    path = require_tool(ETCDCTL, "etcd-client")
    return [path, f"--endpoints={srv.endpoint}", "--command-timeout=10s", *args]


def etcdctl(srv: BrainServer, *args: str) -> str:
    """etcdctl's output, which must succeed."""
    r = subprocess.run(etcdctl_command(srv, *args), capture_output=True, text=True, timeout=30, env=ETCDCTL_ENV)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def member_id(st) -> int:
    return st.maintenance.Status(pb.StatusRequest(), timeout=10).header.member_id


def checkpoints(metrics: str) -> int:
    """Checkpoints written (brain_checkpoints_total at ``metrics``)."""
    code, body = http_get(metrics + "/metrics")
    assert code == 200, body
    return int(float(re.search(r"^brain_checkpoints_total (\S+)$", body, re.M).group(1)))


def wait_for(what: str, pred, timeout: float = 30, srv=None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what}:\n{srv.log_tail() if srv else ''}"
        time.sleep(0.1)
