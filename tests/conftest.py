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

Processes left behind: every process a test or fixture starts is marked in
its environment (tests.support.leaks).  After each test's teardown, a process
still alive that the test or one of its function-scoped fixtures started, or
a wider fixture finished during that teardown, is an error of that test
("ERROR at teardown"), named with its pid and command line, and is killed.
At the end of the session any marked process still alive, and any child of
the test process, fails the run the same way.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import pytest  # noqa: E402

from tests.support import leaks as _leaks  # noqa: E402
from tests.support import servers as _servers  # noqa: E402

_SERVER_SETTINGS = _servers.server_settings_from_env()

# Seconds a process may take to exit after its test's teardown: a stop that
# does not wait (SIGTERM only), a watchdog's last `sleep 1`.
LEAK_GRACE = float(os.environ.get("BRAIN_TEST_LEAK_GRACE", "5"))


class _LeakCheck:
    """State of the check for processes left behind (see the module docstring)."""

    def __init__(self):
        self.token = _leaks.begin_run()
        self._setups = itertools.count(1)
        self.fixture_setups: dict = {}  # FixtureDef -> its current setup
        self.finished: list[str] = []  # setups of wider fixtures finished since the last check
        self.left_at_end: list[str] = []

    def next_setup(self) -> str:
        return str(next(self._setups))


_leak_check: _LeakCheck | None = None


def pytest_configure(config):
    global _leak_check
    _leak_check = _LeakCheck()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """What the test (its body, its teardown) starts is marked as its own."""
    with _leaks.marked(test_id=item.nodeid, scope="function", fixture=None, setup=_leak_check.next_setup()):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """What a fixture starts is marked with the fixture, its scope and this setup of it."""
    setup = _leak_check.next_setup()
    _leak_check.fixture_setups[fixturedef] = setup
    with _leaks.marked(scope=fixturedef.scope, fixture=fixturedef.argname, setup=setup):
        return (yield)


def pytest_fixture_post_finalizer(fixturedef, request):
    setup = _leak_check.fixture_setups.pop(fixturedef, None)
    if setup is not None and fixturedef.scope != "function":
        _leak_check.finished.append(setup)


def _left_behind_message(procs, what: str) -> str:
    lines = [f"{len(procs)} process(es) {what} (killed now):"]
    lines += [f"  {p.describe()}" for p in procs]
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the whole teardown: nothing this test or its function-scoped
    fixtures started, nor any wider fixture finished meanwhile, is alive."""
    error = None
    result = None
    try:
        result = yield
    except BaseException as e:  # noqa: BLE001 - re-raised below, with the leak check's findings
        error = e
    ended = set(_leak_check.finished)
    _leak_check.finished.clear()

    def ours():
        return [p for p in _leaks.marked_processes(_leak_check.token)
                if (p.marks.get(_leaks.TEST_ID) == item.nodeid and p.marks.get(_leaks.SCOPE) == "function")
                or p.marks.get(_leaks.SETUP) in ended]

    left = _leaks.survivors(ours, LEAK_GRACE)
    if left:
        _leaks.kill(left)
        msg = _left_behind_message(left, f"outlived the teardown of {item.nodeid} by {LEAK_GRACE:g} s")
        if error is None:
            pytest.fail(msg, pytrace=False)
        error.add_note(msg)
    if error is not None:
        raise error
    return result


def pytest_sessionfinish(session, exitstatus):
    """The session's end: every fixture is torn down, so nothing of this run may be alive."""
    if _leak_check is None:
        return

    def ours():
        found = {p.pid: p for p in _leaks.marked_processes(_leak_check.token)}
        found.update((p.pid, p) for p in _leaks.live_children())
        return list(found.values())

    left = _leaks.survivors(ours, LEAK_GRACE)
    if left:
        _leaks.kill(left)
        _leak_check.left_at_end = [p.describe() for p in left]
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    if _leak_check is not None and _leak_check.left_at_end:
        terminalreporter.section("processes left behind", red=True)
        terminalreporter.write_line(f"{len(_leak_check.left_at_end)} process(es) of this run alive after the last "
                                    f"teardown (killed now; the run fails):")
        for line in _leak_check.left_at_end:
            terminalreporter.write_line(f"  {line}")
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
