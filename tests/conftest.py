"""Shared pytest fixtures: etcd / brain servers and gRPC stubs.

Fixtures
  etcd_server     module scope: one etcd 3.4 for the module (skips when
                  /usr/bin/etcd is missing; fails instead when $CI is set).
  etcd_factory    function scope: ``etcd_factory(version="3.4")`` starts another
                  fresh etcd; version "3.6" is etcd 3.6.16 (built on first use).
  brain_server    function scope: a fresh ``python -m brain serve``,
                  parametrized over shard settings from $BRAIN_TEST_SHARDS
                  (default "1,4"; 4 shards use --shard-boundaries b,k,t) on
                  plaintext TCP, and the first shard setting over mutual TLS
                  and a unix socket ($BRAIN_TEST_TRANSPORTS, default
                  "http,mtls,unix"; see tests.support.servers).
  brain_factory   function scope: ``brain_factory(shards=1, extra_args=())``.
  kv_stub         ``kv_stub(endpoint)`` -> Stubs(kv, watch, lease, maintenance),
                  channels closed at teardown.
Mark tests that need etcd with ``@pytest.mark.etcd``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import pytest  # noqa: E402

from tests.support import servers as _servers  # noqa: E402

_SERVER_SETTINGS = _servers.server_settings_from_env()


def pytest_runtest_setup(item):
    if item.get_closest_marker("etcd") is not None:
        _servers.require_etcd()


@pytest.fixture(scope="module")
def etcd_server():
    _servers.require_etcd()
    srv = _servers.start_etcd()
    yield srv
    srv.cleanup()


@pytest.fixture
def etcd_factory():
    started = []

    def make(version: str = "3.4", **kw):
        _servers.require_etcd(version)
        srv = _servers.start_etcd(version=version, **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.cleanup()


@pytest.fixture
def brain_factory():
    started = []

    def make(shards: int = 1, extra_args=(), **kw):
        _servers.require_brain()
        srv = _servers.start_brain(shards, extra_args, **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.cleanup()


@pytest.fixture(params=_SERVER_SETTINGS, ids=[_servers.setting_id(p) for p in _SERVER_SETTINGS])
def brain_server(request):
    yield from _servers.serving_brain(request.param)


@pytest.fixture
def kv_stub():
    opened = []

    def make(endpoint: str) -> _servers.Stubs:
        st = _servers.kv_stub(endpoint)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    harness = sys.modules.get("tests.differential.harness")
    if harness is None or not harness.RESULTS:
        return
    tr = terminalreporter
    tr.section("differential totals")
    by_label: dict[str, list] = {}
    for r in harness.RESULTS:
        by_label.setdefault(r.label, []).append(r)
    for label, runs in sorted(by_label.items()):
        ops = sum(r.ops_compared for r in runs)
        diffs = sum(1 for r in runs if r.diff is not None)
        tr.write_line(f"{label}: {ops} operations compared over {len(runs)} seed(s), "
                      f"{diffs} with differences")
