"""What `brain serve` needs installed, checked on the process: which
transport serves (no silent fallback from the native one to grpcio), and
a one-line exit naming the fix when the native transport module or the
NATS client of a cluster replica cannot be imported.

A missing module is simulated, not made: a sitecustomize.py on the
child's PYTHONPATH puts an import hook first on sys.meta_path that refuses
the named modules as a missing install would (ModuleNotFoundError), so no
file of the checkout or of site-packages is touched.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.support.servers import REPO_ROOT, BrainServer, free_port, http_get, require_brain

_HIDING_HOOK = '''\
import os
import sys

_HIDDEN = tuple(m for m in os.environ.get("BRAIN_TEST_HIDDEN_MODULES", "").split(",") if m)


class _Hide:
    """Refuse the hidden modules (and their submodules) as if not installed."""

    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in _HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hide())
'''


@pytest.fixture
def hiding_path(tmp_path) -> Path:
    """A directory holding the import hook, for the child's PYTHONPATH."""
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(_HIDING_HOOK)
    return d


def _env_hiding(hook_dir: Path, modules: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(hook_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["BRAIN_TEST_HIDDEN_MODULES"] = modules
    return env


def _serve(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brain", "serve", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _log_line(srv: BrainServer, text: str, timeout: float = 10.0) -> str:
    """The first log line holding ``text``, waited for: the startup lines
    are written after the client listeners answer."""
    deadline = time.monotonic() + timeout
    while True:
        for line in srv.log_tail().splitlines():
            if text in line:
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} line in the log:\n{srv.log_tail()}")
        time.sleep(0.05)


def _startup_line(srv: BrainServer) -> str:
    return _log_line(srv, "serving client requests")


PROTOBUF_LISTS = "lists are encoded by protobuf"


def _protobuf_list_lines(srv: BrainServer) -> list[str]:
    return [line for line in srv.log_tail().splitlines() if PROTOBUF_LISTS in line]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_the_hook_hides_what_it_names(hiding_path):
    """The simulation itself: the hook makes the module unimportable, and
    only the named one."""
    env = _env_hiding(hiding_path, "brain._transport")
    code = ("import importlib\n"
            "try:\n    importlib.import_module('brain._transport')\nexcept ModuleNotFoundError as e:\n"
            "    print('hidden', e.name)\n"
            "import brain.api.native_front as f\nprint('available', f.available())\nimport grpc\nprint('grpc ok')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.split("\n")[:3] == ["hidden brain._transport", "available False", "grpc ok"], p.stderr


# -- which transport serves ----------------------------------------------------------


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_the_startup_line_and_metrics_name_the_transport_that_serves(front):
    """The log line says which front serves; the native transport's own
    counters (it counts the connections it accepted) appear only when it
    does, so the line cannot claim a transport that is not serving."""
    require_brain()
    metrics = f"http://127.0.0.1:{free_port()}"
    srv = BrainServer(shards=1, extra_args=["--grpc-front", front, "--listen-metrics-urls", metrics])
    try:
        srv.start()
        with srv.stubs() as s:
            s.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
        line = _startup_line(srv)
        assert re.search(rf"\bgrpc-front={front}\b", line), line
        assert _protobuf_list_lines(srv) == [], "the native encoder is there, yet lists fell back to protobuf"
        _log_line(srv, "serving metrics and health on")  # the metrics listener starts after the client's
        status, body = http_get(metrics + "/metrics")
        assert status == 200
        accepted = re.search(r"^brain_transport_connections_accepted_total (\S+)$", body, re.MULTILINE)
        if front == "native":
            assert accepted and float(accepted.group(1)) >= 1, "the native transport accepted no connection"
        else:
            assert accepted is None, "grpcio serves, yet the native transport reports connections"
    finally:
        srv.cleanup()


# -- the native transport missing -------------------------------------------------------


def test_native_front_without_its_module_exits_1_naming_grpcio(tmp_path, hiding_path):
    require_brain()
    data = tmp_path / "data"
    env = _env_hiding(hiding_path, "brain._transport")
    p = _serve(env, "--data-dir", str(data), "--listen-client-urls", f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 1, p.stderr
    lines = _error_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    assert "--grpc-front native: brain's transport module brain._transport cannot be imported" in lines[0]
    assert "No module named 'brain._transport'" in lines[0]
    assert lines[0].endswith("or start it with --grpc-front grpcio"), lines[0]
    assert not data.exists(), "the data dir was created before the transport was found missing"


def test_grpcio_front_serves_without_the_native_module(hiding_path):
    """The way out the message names works: grpcio serves without the
    module, and says once, when it starts, that lists are encoded by
    protobuf and why."""
    require_brain()
    srv = BrainServer(shards=1, extra_args=["--grpc-front", "grpcio"],
                      env={"BRAIN_TEST_HIDDEN_MODULES": "brain._transport", "PYTHONPATH": str(hiding_path)})
    try:
        srv.start()
        with srv.stubs() as s:
            assert s.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10).header.revision == 2
            assert s.kv.Range(pb.RangeRequest(key=b"k"), timeout=10).kvs[0].value == b"v"
        line = _startup_line(srv)
        assert "grpc-front=grpcio" in line
        fallback = _protobuf_list_lines(srv)
        assert len(fallback) == 1, srv.log_tail()
        assert "brain._transport cannot be imported (No module named 'brain._transport')" in fallback[0], fallback
    finally:
        srv.cleanup()


# -- a cluster replica's NATS client -----------------------------------------------------


def _requirement_name(req: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", req).group(0).lower().replace("_", "-")


def _unconditional(requirements: list[str]) -> set[str]:
    """Names of the requirements without an environment marker (not an extra's)."""
    return {_requirement_name(r) for r in requirements if ";" not in r}


def test_nats_py_is_a_dependency_of_brain_not_of_an_extra():
    """A plain `pip install .` must bring what `--journal-url` needs."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "nats-py" in _unconditional(project["dependencies"])
    assert not any("nats-py" in {_requirement_name(r) for r in reqs}
                   for reqs in project.get("optional-dependencies", {}).values())


def test_installed_brain_etcd_requires_nats_py():
    """The installed distribution's metadata (what pip resolved from) says
    the same, once it was built from this pyproject.toml."""
    import importlib.metadata
    import tomllib

    from tests.support.servers import unavailable

    try:
        requires = importlib.metadata.requires("brain-etcd") or []
    except importlib.metadata.PackageNotFoundError:
        unavailable("brain-etcd is not installed (pip install -e '.[test]')")
    wanted = _unconditional(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    installed = _unconditional(requires)
    if installed != wanted:
        unavailable(f"the installed brain-etcd was built from another pyproject.toml (it requires "
                    f"{sorted(installed)}, this checkout {sorted(wanted)}): reinstall it")
    assert "nats-py" in installed


def test_replica_without_nats_py_exits_1_naming_the_fix(tmp_path, hiding_path):
    require_brain()
    data = tmp_path / "data"
    env = _env_hiding(hiding_path, "nats")
    p = _serve(env, "--data-dir", str(data), "--listen-client-urls", f"http://127.0.0.1:{free_port()}",
               "--journal-url", f"nats://127.0.0.1:{free_port()}/t")
    assert p.returncode == 1, p.stderr
    lines = _error_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    assert "--journal-url needs the NATS client nats-py, which cannot be imported (No module named 'nats')" \
        in lines[0]
    assert "pip install 'nats-py>=2.16,<3'" in lines[0]
    assert not data.exists(), "the data dir was created before nats-py was found missing"


def test_replica_import_error_is_one_line_wherever_it_surfaces(hiding_path):
    """Code that connects without going through `brain serve`'s check
    still gets the one-line error, not a ModuleNotFoundError traceback."""
    env = _env_hiding(hiding_path, "nats")
    code = ("from brain.journal.natsio import NatsConnection, NatsClientMissing\n"
            "try:\n    NatsConnection(['nats://127.0.0.1:1'])\nexcept NatsClientMissing as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("--journal-url needs the NATS client nats-py"), p.stdout + p.stderr
