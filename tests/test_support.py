"""tests.support itself: a server is never started twice, and the session
check of tests/conftest.py names and kills the processes a test leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support import leaks, servers


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_start_refuses_a_server_that_is_running():
    servers.require_brain()
    srv = servers.start_brain()
    try:
        pid = srv.proc.pid
        with pytest.raises(servers.ServerRunningError, match="running already"):
            srv.start()
        assert srv.proc.pid == pid and srv.running  # still the first process, still tracked
    finally:
        srv.cleanup()
    assert not _alive(pid)


def test_with_on_a_started_server_is_refused_and_stops_it():
    """``with start_brain() as srv`` used to start a second process; the
    first one, forgotten, outlived the test and its deleted data dir."""
    servers.require_brain()
    srv = servers.start_brain()
    pid = srv.proc.pid
    try:
        with pytest.raises(servers.ServerRunningError):
            with srv:
                pass
    finally:
        srv.cleanup()
    assert not _alive(pid) and not srv.root.exists()


def test_marked_processes_finds_this_runs_processes_only(tmp_path):
    token = "leak-test-" + os.urandom(4).hex()
    env = dict(os.environ, **{leaks.RUN: token, leaks.TEST_ID: "t::one", leaks.SCOPE: "function"})
    ours = subprocess.Popen(["sleep", "60"], env=env)
    other = subprocess.Popen(["sleep", "60"], env=dict(env, **{leaks.RUN: token + "-other"}))
    try:
        found = leaks.marked_processes(token)
        assert [p.pid for p in found] == [ours.pid]
        assert found[0].marks[leaks.TEST_ID] == "t::one" and found[0].cmdline == "sleep 60"
        assert "started by t::one: sleep 60" in found[0].describe()
        leaks.kill(found)
        assert ours.wait(10) == -9
        assert other.poll() is None  # not this run's: left alone
        assert leaks.survivors(lambda: leaks.marked_processes(token), grace=5) == []
    finally:
        for p in (ours, other):
            p.kill()
            p.wait(10)


_LEAKY_TESTS = textwrap.dedent('''
    import subprocess
    import pytest

    # at import (collection): no test owns it, the session's end finds it
    subprocess.Popen(["sleep", "61"])

    @pytest.fixture(scope="module")
    def leaky_module_fixture():
        subprocess.Popen(["sleep", "62"])
        yield

    def test_leaves_one_behind():
        subprocess.Popen(["sleep", "63"])

    def test_cleans_up():
        p = subprocess.Popen(["sleep", "64"])
        p.kill()
        p.wait()

    def test_uses_the_module_fixture(leaky_module_fixture):
        pass
''')


def _inner_session(directory, test_file: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BRAIN_TEST_LEAK_GRACE="0.5",
               PYTHONPATH=str(servers.REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           str(directory / test_file)], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_process_left_at_the_sessions_end_fails_a_passing_run(tmp_path):
    (tmp_path / "test_left.py").write_text(textwrap.dedent('''
        import subprocess
        subprocess.Popen(["sleep", "65"])

        def test_passes():
            pass
    '''))
    r = _inner_session(tmp_path, "test_left.py")
    assert r.returncode == 1 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert "processes left behind" in r.stdout and ": sleep 65" in r.stdout, r.stdout


def test_the_session_check_names_each_process_left_behind(tmp_path):
    """An inner pytest session with tests/conftest.py as its plugin: each
    process left behind is an error of the test (or fixture) that started
    it, the one started outside any test fails the session at its end, and
    all of them are killed."""
    (tmp_path / "test_leaky.py").write_text(_LEAKY_TESTS)
    r = _inner_session(tmp_path, "test_leaky.py")
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert "3 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_leaves_one_behind" in out, out
    assert "started by test_leaky.py::test_leaves_one_behind: sleep 63" in out, out
    assert "ERROR at teardown of test_uses_the_module_fixture" in out, out
    assert ("started by fixture leaky_module_fixture (module scope) of "
            "test_leaky.py::test_uses_the_module_fixture: sleep 62") in out, out
    assert "processes left behind" in out and "started by <no test: started outside any test>: sleep 61" in out, out
    assert "sleep 64" not in out, out
    # (the short summary may repeat a line, depending on the terminal's width)
    pids = {int(line.split("pid ", 1)[1].split()[0]) for line in out.splitlines() if "sleep 6" in line}
    assert len(pids) == 3 and not any(_alive(p) for p in pids), out
