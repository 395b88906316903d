"""`python -m brain serve` as a process: signals, exit codes, startup
failures, log formats, restart, TLS listeners."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from tests.integration.conftest import require_etcdctl, run_etcdctl
from tests.support.servers import REPO_ROOT, BrainServer, free_port, grpc_channel, require_brain, require_tool


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_brain(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brain", *args], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def stop_with(srv: BrainServer, sig: int) -> int:
    srv.proc.send_signal(sig)
    return srv.proc.wait(timeout=30)


@pytest.fixture
def brain():
    require_brain()
    srv = BrainServer(shards=1)
    yield srv
    srv.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly(brain, sig):
    brain.start()
    with brain.stubs() as s:
        s.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    assert stop_with(brain, sig) == 0
    log = brain.log_tail()
    assert f"received {signal.Signals(sig).name}, shutting down" in log
    assert "stopped" in log.splitlines()[-1]


def test_a_sigterm_delivered_twice_at_once_still_drains(brain):
    # make serve under a process-group kill: the group's SIGTERM and make's own, passed on, a moment apart.
    brain.start()
    with brain.stubs() as s:
        s.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    brain.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)  # the first has been handled: two signals pending at once would be taken as one
    brain.proc.send_signal(signal.SIGTERM)
    assert brain.proc.wait(timeout=30) == 0
    log = brain.log_tail()
    assert "exiting without draining" not in log
    assert "stopped" in log.splitlines()[-1]


def test_sigterm_with_open_watch_does_not_wait_out_the_grace(brain):
    import queue
    import time

    brain.extra_args = ["--shutdown-grace", "20"]
    brain.start()
    ch = grpc_channel(brain.endpoint)
    reqs: queue.Queue = queue.Queue()
    call = rpc_pb2_grpc.WatchStub(ch).Watch(iter(reqs.get, None))
    reqs.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w")))
    assert next(call).created
    started = time.monotonic()
    try:
        assert stop_with(brain, signal.SIGTERM) == 0
        assert time.monotonic() - started < 10  # the open stream is ended, not waited for
    finally:
        reqs.put(None)
        ch.close()


def test_startup_line_and_restart_keeps_data(brain):
    brain.start()
    log = brain.log_tail()
    line = next(l for l in log.splitlines() if "serving client requests" in l)
    from brain import __version__

    assert f"brain {__version__} serving client requests" in line
    assert f"endpoints={brain.client_url}" in line
    assert f"data-dir={brain.data_dir}" in line
    assert "layout=" in line
    with brain.stubs() as s:
        rev = s.kv.Put(pb.PutRequest(key=b"persist", value=b"1"), timeout=10).header.revision
    brain.restart()
    with brain.stubs() as s:
        r = s.kv.Range(pb.RangeRequest(key=b"persist"), timeout=10)
    assert r.kvs[0].value == b"1" and r.header.revision == rev


def test_metrics_listen_before_the_client_port(brain):
    """A probe that saw the client port accept finds /health there too: the
    metrics listeners are up before the client port (CI once asked /health
    right after the client port answered, and it was not listening yet)."""
    metrics = f"http://127.0.0.1:{free_port()}"
    brain.extra_args = [*brain.extra_args, "--listen-metrics-urls", metrics]
    brain.start()
    import urllib.request

    with urllib.request.urlopen(metrics + "/health", timeout=10) as r:  # no retry: it must be up already
        assert r.status == 200 and json.loads(r.read())["health"] == "true"
    lines = brain.log_tail().splitlines()
    order = [i for i, l in enumerate(lines) if "serving metrics and health" in l or "serving client requests" in l]
    assert ["serving metrics and health" in lines[i] for i in order] == [True, False], lines


def test_no_subcommand_serves_and_json_logs(brain):
    brain._command = lambda: [sys.executable, "-m", "brain", "--data-dir", str(brain.data_dir),
                              "--listen-client-urls", brain.client_url, "--log-format", "json"]
    brain.start()
    assert stop_with(brain, signal.SIGTERM) == 0
    records = [json.loads(l) for l in brain.log_tail().splitlines() if l.startswith("{")]
    serving = [r for r in records if "serving client requests" in r["msg"]]
    assert serving and serving[0]["endpoints"] == brain.client_url and serving[0]["level"] == "info"


def test_port_in_use_exits_1_with_etcds_message(tmp_path):
    require_brain()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_brain("serve", "--data-dir", str(tmp_path / "d"), "--listen-client-urls", f"http://127.0.0.1:{port}")
        assert p.returncode == 1
        assert f"listen tcp 127.0.0.1:{port}: bind: address already in use" in p.stderr
        assert not (tmp_path / "d").exists()  # found before the data dir was created
        p = run_brain("serve", "--data-dir", str(tmp_path / "d"), "--listen-client-urls", "http://127.0.0.1:0",
                      "--listen-metrics-urls", f"http://127.0.0.1:{port}")
        assert p.returncode == 1
        assert f"listen tcp 127.0.0.1:{port}: bind: address already in use" in p.stderr
        assert not (tmp_path / "d").exists()


def test_taken_port_is_found_before_recovery(brain):
    """A data dir with history is not recovered (no engine log lines) when
    the port is taken: the check comes first."""
    brain.start()
    with brain.stubs() as s:
        s.kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    assert stop_with(brain, signal.SIGTERM) == 0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_brain("serve", "--data-dir", str(brain.data_dir), "--listen-client-urls", f"http://127.0.0.1:{port}",
                      "--log-level", "debug")
    assert p.returncode == 1
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert lines and lines[-1].endswith(f"listen tcp 127.0.0.1:{port}: bind: address already in use"), p.stderr
    assert not any("brain.engine" in l or "brain.journal" in l for l in lines), p.stderr


def test_key_file_problems_are_found_before_the_data_dir(tmp_path, certs):
    require_brain()
    data = tmp_path / "d"
    https = ["--listen-client-urls", f"https://127.0.0.1:{free_port()}"]
    missing = tmp_path / "server.key"
    p = run_brain("serve", "--data-dir", str(data), *https, "--cert-file", str(certs / "server.crt"),
                  "--key-file", str(missing))
    assert p.returncode == 1
    assert f"--key-file {missing}: No such file or directory" in p.stderr
    p = run_brain("serve", "--data-dir", str(data), *https, "--cert-file", str(certs / "server.crt"),
                  "--key-file", str(certs / "client.key"))
    assert p.returncode == 1
    assert f"--cert-file {certs / 'server.crt'} with --key-file {certs / 'client.key'}: key values mismatch" in p.stderr
    assert not data.exists()


def test_data_dir_errors_name_the_cause(tmp_path):
    require_brain()
    listen = ["--listen-client-urls", f"http://127.0.0.1:{free_port()}"]
    p = run_brain("serve", "--data-dir", "/proc/brain-data", *listen)
    assert p.returncode == 1
    assert "cannot create data dir /proc/brain-data: /proc is a proc filesystem" in p.stderr
    assert "No such file or directory" not in p.stderr
    f = tmp_path / "file"
    f.write_text("")
    p = run_brain("serve", "--data-dir", str(f), *listen)
    assert p.returncode == 1
    assert f"data dir {f} is a regular file, not a directory" in p.stderr
    assert "File exists" not in p.stderr


def test_data_dir_in_use_exits_1(brain, tmp_path):
    brain.start()
    p = run_brain("serve", "--data-dir", str(brain.data_dir), "--listen-client-urls", f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 1
    assert "cannot open data dir" in p.stderr


def test_bad_flag_exits_2():
    require_brain()
    p = run_brain("serve", "--listen-client-urls", "localhost:2379")
    assert p.returncode == 2
    assert "URL scheme must be http, https, unix, or unixs" in p.stderr
    for argv in (["serve", "--no-such-flag"], ["--no-such-flag"]):
        p = run_brain(*argv)
        assert p.returncode == 2
        assert p.stderr.startswith("usage: brain serve [-h]"), p.stderr  # not the top-level usage
        assert p.stderr.rstrip().endswith("brain serve: error: unrecognized arguments: --no-such-flag")


# --- TLS ---------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    require_tool("openssl", "openssl")
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=brain-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    # A second, unrelated CA: its client certificate must be refused.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue-ca.key", "-out", "rogue-ca.crt",
             "-days", "2", "-subj", "/CN=rogue-ca", cwd=d)
    for name, cn, ca in (("server", "localhost", "ca"), ("client", "brain-client", "ca"),
                         ("rogue", "brain-client", "rogue-ca")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    return d


def _tls_server(certs: Path, *extra: str) -> tuple[BrainServer, str]:
    require_brain()
    srv = BrainServer(shards=1)
    tls_port = free_port()
    srv.extra_args = [
        "--listen-client-urls", f"{srv.client_url},https://127.0.0.1:{tls_port}",
        "--cert-file", str(certs / "server.crt"), "--key-file", str(certs / "server.key"), *extra,
    ]
    srv.start()
    return srv, f"127.0.0.1:{tls_port}"


def test_https_listener(certs):
    srv, tls = _tls_server(certs)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes())
        with grpc.secure_channel(tls, creds) as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"tls", value=b"yes"), timeout=10)
            assert kv.Range(pb.RangeRequest(key=b"tls"), timeout=10).kvs[0].value == b"yes"
        require_etcdctl()
        r = run_etcdctl(f"https://{tls}", f"--cacert={certs / 'ca.crt'}", "get", "tls", "--print-value-only")
        assert (r.rc, r.out) == (0, "yes\n"), r.err
    finally:
        srv.cleanup()


def test_client_cert_auth(certs):
    srv, tls = _tls_server(certs, "--trusted-ca-file", str(certs / "ca.crt"), "--client-cert-auth")
    try:
        ca = (certs / "ca.crt").read_bytes()
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca)
        with grpc.secure_channel(tls, anonymous) as ch:
            with pytest.raises(grpc.RpcError) as ei:
                rpc_pb2_grpc.KVStub(ch).Range(pb.RangeRequest(key=b"x"), timeout=5)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        unknown = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / "rogue.key").read_bytes(),
            certificate_chain=(certs / "rogue.crt").read_bytes(),
        )
        with grpc.secure_channel(tls, unknown) as ch:
            with pytest.raises(grpc.RpcError) as ei:
                rpc_pb2_grpc.KVStub(ch).Range(pb.RangeRequest(key=b"x"), timeout=5)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        require_etcdctl()
        r = run_etcdctl(f"https://{tls}", f"--cacert={certs / 'ca.crt'}", f"--cert={certs / 'rogue.crt'}",
                        f"--key={certs / 'rogue.key'}", "--dial-timeout=3s", "--command-timeout=5s", "get", "x")
        assert r.rc != 0
        mutual = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / "client.key").read_bytes(),
            certificate_chain=(certs / "client.crt").read_bytes(),
        )
        with grpc.secure_channel(tls, mutual) as ch:
            assert rpc_pb2_grpc.KVStub(ch).Range(pb.RangeRequest(key=b"x"), timeout=10).count == 0
        require_etcdctl()
        r = run_etcdctl(f"https://{tls}", f"--cacert={certs / 'ca.crt'}", f"--cert={certs / 'client.crt'}",
                        f"--key={certs / 'client.key'}", "put", "mtls", "ok")
        assert (r.rc, r.out) == (0, "OK\n"), r.err
    finally:
        srv.cleanup()
