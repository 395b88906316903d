"""Servers for the migration tests: etcd 3.4 (Debian's), 3.5, 3.6 and 3.7
(built by benchmarks/build.sh, cached), and brain on an imported data
directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import servers
from tests.support.etcd_tools import etcd_tool

ETCD_VERSIONS = ("3.4", "3.5", "3.6", "3.7")


def etcd_binary(version: str) -> str:
    if version == "3.4":
        servers.require_etcd()
        return servers.ETCD_BIN
    return etcd_tool(f"etcd-{version}")


class Etcd(servers.EtcdServer):
    """An etcd of a chosen binary (EtcdServer knows Debian's 3.4 and 3.6)."""

    def __init__(self, binary: str, **kw) -> None:
        super().__init__(**kw)
        self.binary = binary


@pytest.fixture
def etcd_of():
    started = []

    def make(version: str, **kw) -> Etcd:
        srv = Etcd(etcd_binary(version), **kw)
        started.append(srv)
        srv.start()
        return srv

    yield make
    for srv in started:
        srv.cleanup()


@pytest.fixture
def brain_on():
    """brain_on(data_dir, shards=4): `brain serve` on an existing data dir."""
    started = []

    def make(data_dir, shards: int = 4, extra_args=()) -> servers.BrainServer:
        srv = servers.BrainServer(shards=shards, extra_args=list(extra_args))
        srv.data_dir = data_dir
        started.append(srv)
        srv.start()
        return srv

    yield make
    for srv in started:
        srv.cleanup()


def brain_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(servers.REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "brain", *args], capture_output=True, text=True,
                          cwd=str(servers.REPO_ROOT), timeout=timeout, env=env)


def etcdctl(endpoint: str, *args: str, binary: str = "etcdctl") -> subprocess.CompletedProcess:
    env = dict(os.environ, ETCDCTL_API="3")
    return subprocess.run([binary, "--endpoints", endpoint, *args], capture_output=True, text=True, timeout=120,
                          env=env)
