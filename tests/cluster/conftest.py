"""Fixtures for the cluster tests: NATS and etcd clusters on loopback and the
clustercheck tool, each built on first use and cached (tests/cluster/build.sh,
benchmarks/build.sh). A missing Go toolchain or failed build skips these
tests, and fails them under CI.

  nats_cluster_factory   ``make(size=3, sync_always=False)`` -> started NatsCluster
  etcd_cluster_factory   ``make(size=3, extra_args=())`` -> started 3.6 EtcdCluster
  clustercheck_bin       the clustercheck binary's path

Every cluster is stopped and removed at the end of the test, and is killed by
its watchdog if the test process dies or the cluster outlives ``lifetime``.
When the test failed, every member's log tail is printed first (pytest shows
it under "Captured stdout teardown").
"""

from __future__ import annotations

import pytest

from tests.support import binaries
from tests.support.etcd_cluster import EtcdCluster
from tests.support.nats_cluster import NatsCluster


@pytest.fixture(scope="session")
def clustercheck_bin() -> str:
    return binaries.require(binaries.clustercheck_binary)


@pytest.fixture(scope="session")
def nats_server_bin() -> str:
    return binaries.require(binaries.nats_server_binary)


@pytest.fixture(scope="session")
def etcd36_bin() -> str:
    return binaries.require(binaries.etcd36_binary)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.cluster_test_failed = rep.failed


def _factory(request, cls, binary: str):
    """make(size, **kw) -> a started ``cls`` cluster; yields make, cleans up after."""
    started = []

    def make(size: int = 3, **kw):
        c = cls(size, binary=binary, lifetime=kw.pop("lifetime", 600.0), **kw)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        if getattr(request.node, "cluster_test_failed", False):
            print(f"\n=== {c!r}: logs ===\n{c.logs()}")
        c.cleanup()


@pytest.fixture
def nats_cluster_factory(request, nats_server_bin):
    yield from _factory(request, NatsCluster, nats_server_bin)


@pytest.fixture
def etcd_cluster_factory(request, etcd36_bin):
    yield from _factory(request, EtcdCluster, etcd36_bin)
