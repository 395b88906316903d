"""brain.cli and brain.config: etcd's flag names, defaults, env vars and
value parsing; brain.logging_setup formats."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from brain import cli, logging_setup
from brain.config import (
    ConfigError,
    ServerConfig,
    parse_go_duration,
    parse_listen_url,
    parse_retention,
    parse_shard_boundaries,
)

REPO = Path(__file__).resolve().parents[2]


def parse(*argv, env=None) -> ServerConfig:
    return cli.parse_serve(list(argv), environ=env or {})


def test_defaults_like_etcd():
    c = parse("serve")
    assert c.name == "default"
    assert c.data_dir == "default.brain"
    assert c.listen_client_urls == ["http://localhost:2379"]
    assert [lu.address for lu in c.listeners()] == ["127.0.0.1:2379"]
    assert c.max_request_bytes == 1572864
    assert c.grpc_max_recv_bytes == 1572864 + 512 * 1024
    assert c.max_txn_ops == 128
    assert c.quota_backend_bytes == 2 * 1024**3
    assert (c.auto_compaction_mode, c.auto_compaction_retention) == ("periodic", "0")
    assert c.shards is None and c.shard_boundaries is None
    assert (c.log_level, c.log_format) == ("info", "text")
    assert c.client_cert_auth is False


def test_no_subcommand_means_serve():
    assert parse() == parse("serve")
    assert parse("--name", "n1").data_dir == "n1.brain"


def test_all_flags():
    c = parse(
        "serve", "--name", "m1", "--data-dir", "/d",
        "--listen-client-urls", "http://127.0.0.1:1,unix:///tmp/s",
        "--advertise-client-urls", "http://10.0.0.1:2379",
        "--listen-metrics-urls", "http://127.0.0.1:2381",
        "--max-request-bytes", "1000", "--max-txn-ops", "5",
        "--quota-backend-bytes", "0",
        "--auto-compaction-mode", "revision", "--auto-compaction-retention", "1000",
        "--shards", "3", "--shard-boundaries", "b,t",
        "--backend", "memory",
        "--cert-file", "c.pem", "--key-file", "k.pem", "--trusted-ca-file", "ca.pem", "--client-cert-auth",
        "--log-level", "debug", "--log-format", "json", "--grpc-workers", "4", "--shutdown-grace", "1.5",
    )
    assert c.name == "m1" and c.data_dir == "/d"
    assert c.listen_client_urls == ["http://127.0.0.1:1", "unix:///tmp/s"]
    assert c.advertise_client_urls == ["http://10.0.0.1:2379"]
    assert c.listen_metrics_urls == ["http://127.0.0.1:2381"]
    assert (c.max_request_bytes, c.max_txn_ops) == (1000, 5)
    assert c.quota_backend_bytes == 2 * 1024**3  # 0 means the default
    assert (c.auto_compaction_mode, c.auto_compaction_retention) == ("revision", "1000")
    assert c.shards == 3 and c.shard_boundaries == [b"b", b"t"]
    assert c.backend == "memory"
    assert (c.cert_file, c.key_file, c.trusted_ca_file, c.client_cert_auth) == ("c.pem", "k.pem", "ca.pem", True)
    assert (c.log_level, c.log_format, c.grpc_workers, c.shutdown_grace) == ("debug", "json", 4, 1.5)


def test_equals_form_and_bool_values():
    c = parse("--data-dir=/x", "--client-cert-auth=false", "--trusted-ca-file=ca")
    assert c.data_dir == "/x" and c.client_cert_auth is False


def test_env_vars_etcd_and_brain_prefixes():
    env = {"ETCD_DATA_DIR": "/etcd", "ETCD_MAX_TXN_OPS": "7", "ETCD_NAME": "envname"}
    c = parse(env=env)
    assert (c.data_dir, c.max_txn_ops, c.name) == ("/etcd", 7, "envname")
    env["BRAIN_DATA_DIR"] = "/brain"
    assert parse(env=env).data_dir == "/brain"
    # the command line wins over both
    assert parse("--data-dir", "/flag", env=env).data_dir == "/flag"
    assert parse("--data-dir=/flag", env=env).data_dir == "/flag"
    assert parse(env={"ETCD_CLIENT_CERT_AUTH": "true", "ETCD_TRUSTED_CA_FILE": "ca"}).client_cert_auth is True


def test_no_abbreviated_flags(capsys):
    with pytest.raises(SystemExit):
        parse("--data", "/x")


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--shards", "3", "--shard-boundaries", "b"], "needs 2 boundary keys"),
        (["--shard-boundaries", "t,b"], "strictly increasing"),
        (["--shard-boundaries", "a,,b"], "must not be empty"),
        (["--auto-compaction-retention", "soon"], "auto-compaction-retention"),
        (["--auto-compaction-mode", "revision", "--auto-compaction-retention", "1h"], "whole number"),
        (["--auto-compaction-mode", "weekly"], "auto-compaction-mode"),
        (["--listen-client-urls", "127.0.0.1:2379"], "URL scheme must be http, https, unix, or unixs"),
        (["--listen-client-urls", "https://127.0.0.1:2379"], "--cert-file, --key-file"),
        (["--log-level", "chatty"], "--log-level"),
        (["--log-format", "xml"], "--log-format"),
        (["--client-cert-auth"], "--trusted-ca-file"),
        (["--max-txn-ops", "0"], "--max-txn-ops"),
        (["--shards", "0"], "--shards"),
    ],
)
def test_bad_values_exit_2_with_a_message(argv, msg, capsys):
    with pytest.raises(SystemExit) as ei:
        parse(*argv)
    assert ei.value.code == 2
    assert msg in capsys.readouterr().err


def test_shards_from_boundaries_alone():
    c = parse("--shard-boundaries", "b,k,t")
    assert c.shards is None and c.effective_shards() == 4


def test_shard_boundary_escapes():
    assert parse_shard_boundaries(r"a\,b,c\\d,\x00\xff,/registry/pods/") == [
        b"a,b", b"c\\d", b"\x00\xff", b"/registry/pods/"
    ]
    assert parse_shard_boundaries("ü") == ["ü".encode()]
    for bad in ("a\\", r"\q", r"\x4"):
        with pytest.raises(ConfigError):
            parse_shard_boundaries(bad)


def test_listen_urls():
    assert parse_listen_url("http://localhost:2379").address == "127.0.0.1:2379"
    assert parse_listen_url("http://0.0.0.0:2379").address == "0.0.0.0:2379"
    assert parse_listen_url("http://[::1]:2379").address == "[::1]:2379"
    lu = parse_listen_url("https://127.0.0.1:2379/")
    assert lu.secure and not lu.is_unix and lu.address == "127.0.0.1:2379"
    lu = parse_listen_url("unix:///tmp/brain.sock")
    assert (lu.address, lu.path, lu.is_unix, lu.secure) == ("unix:/tmp/brain.sock", "/tmp/brain.sock", True, False)
    lu = parse_listen_url("unixs://rel.sock")
    assert (lu.address, lu.path, lu.secure) == ("unix:rel.sock", "rel.sock", True)
    for bad in ("localhost:2379", "ftp://x:1", "http://host", "http://h:1/path", "unix://"):
        with pytest.raises(ConfigError):
            parse_listen_url(bad)


def test_retention_parsing_like_etcd():
    assert parse_retention("periodic", "0") == 0
    assert parse_retention("periodic", "1") == 3600  # a bare number counts hours
    assert parse_retention("periodic", "5m") == 300
    assert parse_retention("periodic", "1h30m") == 5400
    assert parse_retention("periodic", "1.5h") == 5400
    assert parse_retention("revision", "1000") == 1000
    assert parse_go_duration("300ms") == pytest.approx(0.3)
    assert parse_go_duration("-2s") == -2
    for bad in ("", "h", "5 m", "1d"):
        with pytest.raises(ValueError):
            parse_go_duration(bad)
    with pytest.raises(ConfigError):
        parse_retention("periodic", "-1h")


def test_negative_quota_is_kept_disabled_like_etcd():
    assert parse("--quota-backend-bytes", "-1").quota_backend_bytes == -1


def test_version_and_help_via_python_m():
    out = subprocess.run([sys.executable, "-m", "brain", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    from brain import __version__

    assert out.stdout.splitlines()[0] == f"brain Version: {__version__}"
    assert "API version: 3.6" in out.stdout
    out = subprocess.run([sys.executable, "-m", "brain", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--listen-client-urls", "--max-request-bytes", "--shard-boundaries", "--auto-compaction-retention"):
        assert flag in out.stdout


def _log_line(fmt: str) -> str:
    buf = io.StringIO()
    logging_setup.configure("debug", fmt, stream=buf)
    try:
        logging.getLogger("brain.test").info("hello %s", "world", extra={"fields": {"a": 1, "b": "x y"}})
    finally:
        logging_setup.configure("info", "text")  # back to stderr
    return buf.getvalue().strip()


def test_text_log_format():
    line = _log_line("text")
    assert line.endswith('INFO  brain.test: hello world a=1 b="x y"')


def test_json_log_format():
    obj = json.loads(_log_line("json"))
    assert obj["level"] == "info" and obj["msg"] == "hello world" and obj["logger"] == "brain.test"
    assert obj["a"] == 1 and obj["b"] == "x y" and obj["ts"].endswith("Z")


def test_engine_tuning_flags():
    c = parse("--checkpoint-interval", "0.7s", "--checkpoint-journal-bytes", "1000",
              "--checkpoint-memtable-records", "50", "--journal-segment-bytes", "4096")
    assert c.checkpoint_interval == pytest.approx(0.7)
    assert (c.checkpoint_journal_bytes, c.checkpoint_memtable_records, c.journal_segment_bytes) == (1000, 50, 4096)
    assert parse("--checkpoint-interval", "2").checkpoint_interval == 2.0
    assert parse().checkpoint_interval is None
    with pytest.raises(SystemExit):
        parse("--checkpoint-interval", "0s")


def test_engine_config_mapping():
    from brain.api.server import _engine_config

    ec = _engine_config(parse("--data-dir", "/d", "--name", "n", "--shard-boundaries", "b,t", "--max-txn-ops", "9",
                              "--quota-backend-bytes", "123", "--auto-compaction-mode", "revision",
                              "--auto-compaction-retention", "10", "--backend", "memory",
                              "--checkpoint-interval", "1m", "--journal-segment-bytes", "4096"))
    assert (ec.data_dir, ec.name, ec.shards, ec.shard_boundaries) == ("/d", "n", 3, [b"b", b"t"])
    assert (ec.max_txn_ops, ec.quota_backend_bytes, ec.backend) == (9, 123, "memory")
    assert (ec.auto_compaction_mode, ec.auto_compaction_retention) == ("revision", "10")
    assert (ec.checkpoint_interval_seconds, ec.segment_bytes) == (60.0, 4096)
    # unset flags keep the engine's own defaults
    from brain.engine import EngineConfig

    dflt = _engine_config(parse("--data-dir", "/d"))
    ref = EngineConfig(data_dir="/d")
    assert (dflt.shards, dflt.shard_boundaries, dflt.backend, dflt.checkpoint_interval_seconds) == (
        ref.shards, ref.shard_boundaries, ref.backend, ref.checkpoint_interval_seconds)
