"""deploy/groups: the example layout runs as `brain groups` reads it, and
each group's unit (the template brain-group@.service with the environment
file `brain groups --write-env` writes) is a `brain serve` whose data lies
where the unit lets it write; systemd-analyze finds nothing wrong with the
units but the binary this machine has not installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brain.cli import group_layout, serve_args

REPO = Path(__file__).resolve().parents[2]
GROUPS = REPO / "deploy" / "groups"


def _unit(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (GROUPS / name).read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _env(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", path.read_text(), re.M))


def test_the_example_layout_moves_leases_and_events_off_the_main_group():
    layout = group_layout.load(GROUPS / "groups.toml")
    assert layout.apiserver_flags() == [
        "--etcd-servers=https://127.0.0.1:2379",
        "--etcd-servers-overrides=coordination.k8s.io/leases#https://127.0.0.1:2479,/events#https://127.0.0.1:2479"]


def test_each_groups_unit_is_a_brain_serve_writing_where_its_unit_may(tmp_path):
    unit = _unit("brain-group@.service")
    assert unit["EnvironmentFile"] == ["/etc/brain/groups/%i.env"]
    [exec_start] = unit["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[:2] == ["/opt/brain/bin/brain", "serve"]
    out = tmp_path / "etc-brain-groups"  # stands for /etc/brain/groups
    r = subprocess.run([sys.executable, "-m", "brain", "groups", "--layout", str(GROUPS / "groups.toml"),
                        "--write-env", str(out)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    envs = sorted(out.glob("*.env"))
    assert [p.stem for p in envs] == ["leases-events", "main"]
    for path in envs:
        group = path.stem
        cfg = serve_args.parse_serve(argv[1:], environ=_env(path))
        state = unit["StateDirectory"][0].replace("%i", group)
        writable = unit["ReadWritePaths"][0].replace("%i", group)
        assert state == f"brain/groups/{group}" and writable == f"/var/lib/{state}"
        assert Path(cfg.data_dir).is_relative_to(writable), cfg.data_dir
        assert cfg.name == group
        # as deploy/brain.service serves: mutual TLS with brain-node.sh pki's files, the raised quota
        assert (cfg.cert_file, cfg.key_file, cfg.trusted_ca_file, cfg.client_cert_auth) == (
            "/etc/brain/pki/server.crt", "/etc/brain/pki/server.key", "/etc/brain/pki/ca.crt", True)
        assert cfg.quota_backend_bytes == 8 * 1024 ** 3 and cfg.log_format == "json"
    assert "systemctl enable --now brain-group@leases-events" in r.stdout
    assert _unit("brain-group@.service")["WantedBy"] == ["brain-groups.target"]
    assert _unit("brain-group@.service")["PartOf"] == ["brain-groups.target"]


def test_systemd_analyze_finds_nothing_but_the_missing_binary(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    for name in ("brain-group@.service", "brain-groups.target"):
        shutil.copy(GROUPS / name, tmp_path / name)
    (tmp_path / "brain-group@main.service").symlink_to("brain-group@.service")
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "./brain-group@main.service",
                        "./brain-groups.target"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines()
                if ln.strip() and "/opt/brain/bin/brain is not executable" not in ln]
    assert problems == []
