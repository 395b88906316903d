"""deploy/cluster: the replica drop-in's command line is one `brain serve`
accepts once its environment file is filled in, and the NATS configuration
is one nats-server accepts (checked with the real binary, -t)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from brain.cli import serve_args
from tests.support import binaries

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _exec_start(unit: str) -> list[str]:
    text = unit.replace("\\\n", " ")
    lines = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert lines[0] == "", "a drop-in must reset ExecStart before setting it"
    return shlex.split(lines[-1])


def test_the_replica_drop_in_is_a_valid_brain_serve(tmp_path):
    env = dict(re.findall(r"^([A-Z_]+)=(\S+)$", (DEPLOY / "cluster" / "cluster.env").read_text(), re.M))
    assert set(env) == {"CLIENT_URL", "JOURNAL_URL"}
    argv = _exec_start((DEPLOY / "cluster" / "brain.service.d" / "cluster.conf").read_text())
    assert argv[0] == "/opt/brain/bin/brain" and argv[1] == "serve"
    args = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a).replace("%H", "node1") for a in argv[2:]]
    cfg = serve_args.parse_serve(args, environ={})
    assert cfg.journal_url == env["JOURNAL_URL"]
    assert cfg.advertise_client_urls == [env["CLIENT_URL"]]
    assert env["CLIENT_URL"] in cfg.listen_client_urls and cfg.client_cert_auth


def test_the_nats_configuration_is_accepted_by_nats_server(tmp_path):
    conf = (DEPLOY / "cluster" / "nats-server.conf").read_text().replace("/var/lib/nats", str(tmp_path))
    path = tmp_path / "nats.conf"
    path.write_text(conf)
    nats = binaries.require(binaries.nats_server_binary)
    out = subprocess.run([nats, "-c", str(path), "-t"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sync_interval: always" in conf
