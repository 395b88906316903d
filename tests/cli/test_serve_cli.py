"""brain.cli.serve_args, brain.cli.serve and brain.config: etcd's flag
names, defaults, env vars and value parsing; brain.logging_setup formats."""

from __future__ import annotations

import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brain import logging_setup
from brain.cli import serve, serve_args
from brain.config import (
    ConfigError,
    ServerConfig,
    parse_seconds,
    parse_listen_url,
    parse_retention,
    parse_shard_boundaries,
)

REPO = Path(__file__).resolve().parents[2]


def parse(*argv, env=None) -> ServerConfig:
    return serve_args.parse_serve(list(argv), environ=env or {})


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


def test_read_lease_flag_reaches_the_cluster_options(monkeypatch):
    import brain.cluster as cluster

    assert parse().read_lease is False  # etcd's ReadIndex by default: no clock involved
    seen = {}

    class FakeReplica:
        @classmethod
        def open(cls, options, engine_config):
            seen["read_lease"] = options.read_lease
            return cls()

    monkeypatch.setattr(cluster, "Replica", FakeReplica)
    for argv, want in ((["--read-lease=false"], False), (["--read-lease"], True), ([], False)):
        c = parse("--journal-url", "nats://127.0.0.1:4222/t", *argv)
        serve.open_replica(c, None)
        assert seen.pop("read_lease") is want, argv


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


@pytest.mark.parametrize(
    "env,want",
    [
        ({"BRAIN_SHARDS": "abc"},
         "invalid value 'abc' for BRAIN_SHARDS (the environment variable for --shards): invalid integer 'abc'"),
        ({"ETCD_MAX_TXN_OPS": "x"}, "for ETCD_MAX_TXN_OPS (the environment variable for --max-txn-ops)"),
        ({"ETCD_CLIENT_CERT_AUTH": "maybe"}, "for ETCD_CLIENT_CERT_AUTH (the environment variable for "
                                              "--client-cert-auth): invalid boolean"),
        # BRAIN_ wins over ETCD_: the variable named is the one that was used
        ({"ETCD_SHARDS": "2", "BRAIN_SHARDS": "two"}, "for BRAIN_SHARDS"),
        # a value of the right type that the config refuses names the variable too
        ({"BRAIN_SHARDS": "0"}, "--shards must be at least 1, got 0 (set by the environment: BRAIN_SHARDS=0)"),
    ],
)
def test_a_bad_environment_value_names_its_variable(env, want, capsys):
    """The user who never typed --shards must learn where it came from."""
    with pytest.raises(SystemExit) as ei:
        parse(env=env)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert want in err, err
    assert "argument --" not in err


def test_a_bad_flag_on_the_command_line_is_not_blamed_on_the_environment(capsys):
    with pytest.raises(SystemExit):
        parse("--shards", "abc", env={"ETCD_SHARDS": "abc"})
    err = capsys.readouterr().err
    assert "argument --shards: invalid integer 'abc'" in err and "ETCD_SHARDS" not in err


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
        (["--client-cert-allowed-cn", "a", "--client-cert-allowed-hostname", "b,c"],
         '--client-cert-allowed-cn and --client-cert-allowed-hostname are mutually exclusive '
         '(cns=["a"], hostnames=["b" "c"])'),
        (["--grpc-front", "grpcio", "--client-cert-allowed-hostname", "h"],
         "--client-cert-allowed-hostname needs --grpc-front native"),
        (["--grpc-front", "grpcio", "--client-crl-file", "crl.der"], "--client-crl-file needs --grpc-front native"),
        (["--max-txn-ops", "0"], "--max-txn-ops"),
        (["--shards", "0"], "--shards"),
    ],
)
def test_bad_values_exit_2_with_a_message(argv, msg, capsys):
    with pytest.raises(SystemExit) as ei:
        parse(*argv)
    assert ei.value.code == 2
    assert msg in capsys.readouterr().err


def test_client_certificate_narrowing_flags_split_as_etcd_splits_them():
    c = parse("--client-cert-allowed-hostname", "a.test,,10.0.0.1, b.test", "--client-crl-file", "crl.der")
    # every comma splits, nothing is trimmed or dropped (etcd's flags.StringsValue)
    assert c.client_cert_allowed_hostname == ["a.test", "", "10.0.0.1", " b.test"]
    assert (c.client_cert_allowed_cn, c.client_crl_file) == ([], "crl.der")
    assert parse("--client-cert-allowed-cn=").client_cert_allowed_cn == [""]
    c = parse(env={"ETCD_CLIENT_CRL_FILE": "e.der", "BRAIN_CLIENT_CERT_ALLOWED_CN": "x,y"})
    assert (c.client_cert_allowed_cn, c.client_crl_file) == (["x", "y"], "e.der")
    assert parse(env={"ETCD_CLIENT_CERT_ALLOWED_HOSTNAME": "e.test"}).client_cert_allowed_hostname == ["e.test"]


def test_both_allowed_lists_from_the_environment_are_named(capsys):
    with pytest.raises(SystemExit):
        parse("--client-cert-allowed-hostname", "h", env={"ETCD_CLIENT_CERT_ALLOWED_CN": "c"})
    assert "mutually exclusive" in capsys.readouterr().err


def test_narrowing_notices():
    from brain.api.server import narrowing_notices

    def notices(*argv):
        c = parse("--cert-file", "c", "--key-file", "k", "--trusted-ca-file", "ca", *argv)
        return narrowing_notices(c, c.listeners())

    https = ["--listen-client-urls", "https://127.0.0.1:2379"]
    assert notices(*https, "--client-cert-auth") == []
    assert notices(*https, "--client-cert-auth", "--client-cert-allowed-hostname", "a") == []
    assert notices("--client-crl-file", "x") == ["scheme is http/unix: ignoring --client-crl-file"]
    assert notices(*https, "--client-cert-allowed-hostname", "a", "--client-crl-file", "x") == [
        "--client-cert-allowed-hostname, --client-crl-file narrow client certificates, and without "
        "--client-cert-auth none is asked for: they change nothing"]
    assert notices(*https, "--client-cert-auth", "--client-cert-allowed-hostname", "a,, b") == [
        "--client-cert-allowed-hostname has an empty entry, which matches no certificate",
        '--client-cert-allowed-hostname: [" b"] are matched as written, spaces included (as etcd does)']
    assert notices(*https, "--client-cert-auth", "--client-cert-allowed-cn=") == [
        "--client-cert-allowed-cn has an empty entry, which lets in a certificate without a common name"]


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
    assert parse_seconds("300ms") == pytest.approx(0.3)
    assert parse_seconds("-2s") == -2
    assert parse_seconds(" 1.5 ") == 1.5  # a bare number counts seconds
    for bad in ("", "h", "5 m", "1d"):
        with pytest.raises(ValueError):
            parse_seconds(bad)
    with pytest.raises(ConfigError):
        parse_retention("periodic", "-1h")


def test_negative_quota_is_kept_disabled_like_etcd():
    assert parse("--quota-backend-bytes", "-1").quota_backend_bytes == -1


def test_version_and_help_via_python_m():
    out = subprocess.run([sys.executable, "-m", "brain", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    from brain import __version__

    assert out.stdout.splitlines()[0] == f"brain Version: {__version__}"
    assert "API version: 3.7" in out.stdout
    out = subprocess.run([sys.executable, "-m", "brain", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--listen-client-urls", "--max-request-bytes", "--shard-boundaries", "--auto-compaction-retention"):
        assert flag in out.stdout


def _log_line(fmt: str) -> str:
    buf = io.StringIO()
    logging_setup.configure("debug", fmt, stream=buf)
    try:
        logging.getLogger("brain.test").info("hello %s", "world", extra={"fields": {
            "a": 1, "b": "x y", "ips": [], "dns": ["a.test", "b c"]}})
    finally:
        logging_setup.configure("info", "text")  # back to stderr
    return buf.getvalue().strip()


def test_text_log_format():
    line = _log_line("text")
    assert line.endswith('INFO  brain.test: hello world a=1 b="x y" ips=[] dns=["a.test","b c"]')


def test_json_log_format():
    obj = json.loads(_log_line("json"))
    assert obj["level"] == "info" and obj["msg"] == "hello world" and obj["logger"] == "brain.test"
    assert obj["a"] == 1 and obj["b"] == "x y" and obj["ts"].endswith("Z")
    assert obj["ips"] == [] and obj["dns"] == ["a.test", "b c"]


def test_engine_tuning_flags():
    c = parse("--checkpoint-interval", "0.7s", "--checkpoint-journal-bytes", "1000",
              "--checkpoint-memtable-records", "50", "--journal-segment-bytes", "4096")
    assert c.checkpoint_interval == pytest.approx(0.7)
    assert (c.checkpoint_journal_bytes, c.checkpoint_memtable_records, c.journal_segment_bytes) == (1000, 50, 4096)
    assert parse("--checkpoint-interval", "2").checkpoint_interval == 2.0
    assert parse().checkpoint_interval is None
    with pytest.raises(SystemExit):
        parse("--checkpoint-interval", "0s")


def test_engine_tuning_flags_show_the_engines_defaults_in_help(capsys):
    from brain.engine.config import EngineConfig

    with pytest.raises(SystemExit):
        parse("serve", "-h")
    text = " ".join(capsys.readouterr().out.split())
    e = EngineConfig(data_dir="")
    for flag, default in (("--checkpoint-interval", f"{e.checkpoint_interval_seconds:g}s"),
                          ("--checkpoint-journal-bytes", str(e.checkpoint_journal_bytes)),
                          ("--checkpoint-memtable-records", str(e.checkpoint_memtable_records)),
                          ("--journal-segment-bytes", str(e.segment_bytes))):
        entry = text.split(f" {flag} {flag[2:].upper().replace('-', '_')} ", 1)[1].split(" --", 1)[0]
        assert f"default {default}" in entry, (flag, entry)


def test_engine_config_mapping():

    ec = serve.make_engine_config(parse("--data-dir", "/d", "--name", "n", "--shard-boundaries", "b,t", "--max-txn-ops", "9",
                              "--quota-backend-bytes", "123", "--auto-compaction-mode", "revision",
                              "--auto-compaction-retention", "10", "--backend", "memory",
                              "--checkpoint-interval", "1m", "--journal-segment-bytes", "4096"))
    assert (ec.data_dir, ec.name, ec.shards, ec.shard_boundaries) == ("/d", "n", 3, [b"b", b"t"])
    assert (ec.max_txn_ops, ec.quota_backend_bytes, ec.backend) == (9, 123, "memory")
    assert (ec.auto_compaction_mode, ec.auto_compaction_retention) == ("revision", "10")
    assert (ec.checkpoint_interval_seconds, ec.segment_bytes) == (60.0, 4096)
    # unset flags keep the engine's own defaults
    from brain.engine import EngineConfig

    dflt = serve.make_engine_config(parse("--data-dir", "/d"))
    ref = EngineConfig(data_dir="/d")
    assert (dflt.shards, dflt.shard_boundaries, dflt.backend, dflt.checkpoint_interval_seconds) == (
        ref.shards, ref.shard_boundaries, ref.backend, ref.checkpoint_interval_seconds)


# --- errors that name the real cause (brain.cli.preflight) --------------------


def test_unknown_flag_prints_serve_usage(capsys):
    for argv in (["serve", "--no-such-flag"], ["--no-such-flag"]):
        with pytest.raises(SystemExit) as ei:
            parse(*argv)
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: brain serve [-h]"), err
        assert "brain serve: error: unrecognized arguments: --no-such-flag" in err


def test_top_level_help_still_lists_commands(capsys):
    with pytest.raises(SystemExit) as ei:
        parse("--help")
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: brain [-h] [--version] COMMAND") and "snapshot" in out


def _startup_error(fn, *args) -> str:
    from brain.cli import preflight

    with pytest.raises(preflight.StartupError) as ei:
        fn(*args)
    return str(ei.value)


def test_data_dir_under_proc_names_the_filesystem(tmp_path):
    from brain.cli.preflight import prepare_data_dir

    msg = _startup_error(prepare_data_dir, "/proc/brain-data")
    assert msg == ("cannot create data dir /proc/brain-data: /proc is a proc filesystem (kernel state, "
                   "not storage); choose a directory on a disk")
    assert "No such file" not in msg
    assert "/proc is a proc filesystem" in _startup_error(prepare_data_dir, "/proc/self")


def test_data_dir_that_is_a_file(tmp_path):
    from brain.cli.preflight import prepare_data_dir

    f = tmp_path / "file"
    f.write_text("not brain's")
    assert _startup_error(prepare_data_dir, str(f)) == f"data dir {f} is a regular file, not a directory"
    assert _startup_error(prepare_data_dir, str(f / "sub" / "d")) == (
        f"cannot create data dir {f / 'sub' / 'd'}: {f} is a regular file, not a directory")
    assert f.read_text() == "not brain's"


def test_data_dir_created_0700_with_parents(tmp_path):
    from brain.cli.preflight import prepare_data_dir

    d = tmp_path / "a" / "b"
    prepare_data_dir(str(d))
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    prepare_data_dir(str(d))  # an existing directory is fine


def test_taken_ports_are_found_before_the_data_dir(tmp_path):
    import socket

    from brain.cli.preflight import check_before_data_dir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        for flags in (["--listen-client-urls", f"http://127.0.0.1:{port}"],
                      ["--listen-client-urls", "http://127.0.0.1:0", "--listen-metrics-urls", f"http://127.0.0.1:{port}"]):
            cfg = parse("--data-dir", str(tmp_path / "d"), *flags)
            assert _startup_error(check_before_data_dir, cfg) == (
                f"listen tcp 127.0.0.1:{port}: bind: address already in use")
            assert not (tmp_path / "d").exists()
    # a free port binds after the probe released it
    check_before_data_dir(parse("--data-dir", str(tmp_path / "d"), "--listen-client-urls", f"http://127.0.0.1:{port}"))
    assert (tmp_path / "d").is_dir()


def test_unix_listener_on_a_regular_file(tmp_path):
    from brain.cli.preflight import check_listeners

    f = tmp_path / "not-a-socket"
    f.write_text("x")
    assert _startup_error(check_listeners, parse("--listen-client-urls", f"unix://{f}")) == (
        f"listen unix {f}: bind: address already in use ({f} is a regular file)")
    assert _startup_error(check_listeners, parse("--listen-client-urls", f"unix://{tmp_path}/no/dir.sock")) == (
        f"listen unix {tmp_path}/no/dir.sock: bind: no such file or directory ({tmp_path}/no does not exist)")


def _self_signed(d: Path, stem: str) -> tuple[Path, Path]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", f"/CN={stem}", "-keyout", str(d / f"{stem}.key"), "-out",
                    str(d / f"{stem}.crt")], check=True, capture_output=True, timeout=60)
    return d / f"{stem}.crt", d / f"{stem}.key"


def test_tls_files_are_checked_before_the_data_dir(tmp_path):
    from brain.cli.preflight import check_before_data_dir

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed (Debian package openssl)")
    crt, key = _self_signed(tmp_path, "a")
    _crt_b, key_b = _self_signed(tmp_path, "b")
    empty = tmp_path / "empty.key"
    empty.write_text("")
    data = str(tmp_path / "d")

    def cfg(*flags):
        return parse("--data-dir", data, "--listen-client-urls", "https://127.0.0.1:0", *flags)

    missing = tmp_path / "missing.key"
    assert _startup_error(check_before_data_dir, cfg("--cert-file", str(crt), "--key-file", str(missing))) == (
        f"--key-file {missing}: No such file or directory")
    assert _startup_error(check_before_data_dir, cfg("--cert-file", str(crt), "--key-file", str(empty))) == (
        f"--key-file {empty}: no PEM private key in it (a '-----BEGIN ...PRIVATE KEY-----' block)")
    assert _startup_error(check_before_data_dir, cfg("--cert-file", str(crt), "--key-file", str(key_b))) == (
        f"--cert-file {crt} with --key-file {key_b}: key values mismatch")
    assert _startup_error(check_before_data_dir, cfg("--cert-file", str(crt), "--key-file", str(key),
                                                     "--trusted-ca-file", str(key))).startswith(
        f"--trusted-ca-file {key}: no PEM certificate in it")
    assert not Path(data).exists()
    check_before_data_dir(cfg("--cert-file", str(crt), "--key-file", str(key), "--trusted-ca-file", str(crt)))
    assert Path(data).is_dir()


def test_the_crl_file_is_checked_before_the_data_dir(tmp_path):
    """etcd starts with a CRL it cannot read and then refuses every client
    certificate; brain names the file first."""
    from brain.cli.preflight import check_before_data_dir
    from tests.support.tls import make_test_pki, write_crl

    pki = make_test_pki(tmp_path / "pki")
    data = str(tmp_path / "d")

    def cfg(crl):
        return parse("--data-dir", data, "--listen-client-urls", "https://127.0.0.1:0", *_tls_flags(pki),
                     "--client-crl-file", str(crl))

    missing = tmp_path / "missing.der"
    assert _startup_error(check_before_data_dir, cfg(missing)) == (
        f"--client-crl-file {missing}: No such file or directory")
    pem = write_crl(pki.ca, tmp_path / "crl.pem", [pki.client], pem=True)
    assert _startup_error(check_before_data_dir, cfg(pem)) == (
        f"--client-crl-file {pem}: x509: malformed crl (the file is PEM; etcd and brain read a DER CRL: "
        f"openssl crl -in {pem} -outform DER -out crl.der)")
    v1 = tmp_path / "v1.der"  # a version 1 CRL: Go's parser wants version 2
    v1.write_bytes(_v1_crl())
    assert _startup_error(check_before_data_dir, cfg(v1)).endswith(": x509: unsupported crl version")
    assert not Path(data).exists()
    check_before_data_dir(cfg(write_crl(pki.ca, tmp_path / "crl.der", [pki.client])))
    assert Path(data).is_dir()


def _tls_flags(pki) -> list[str]:
    return ["--cert-file", str(pki.server.cert), "--key-file", str(pki.server.key),
            "--trusted-ca-file", str(pki.ca.cert), "--client-cert-auth"]


def _v1_crl() -> bytes:
    """A CRL whose TBS has no version field (v1), otherwise well formed."""
    def tlv(tag: int, body: bytes) -> bytes:
        assert len(body) < 128
        return bytes([tag, len(body)]) + body
    alg = tlv(0x30, tlv(0x06, bytes([0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02])))
    issuer = tlv(0x30, tlv(0x31, tlv(0x30, tlv(0x06, b"\x55\x04\x03") + tlv(0x0c, b"ca"))))
    tbs = tlv(0x30, alg + issuer + tlv(0x17, b"260101000000Z"))
    return tlv(0x30, tbs + alg + tlv(0x03, b"\x00\x01"))


# --- the abuse bounds' flags (issue 25) ----------------------------------------


def test_abuse_bound_flags_defaults_values_and_environment():
    from brain.config import MAX_UINT32

    c = parse("serve")
    assert c.max_concurrent_streams == MAX_UINT32  # etcd's math.MaxUint32
    assert (c.max_connections, c.max_connection_bytes) == (4096, 16 << 20)
    assert (c.max_watchers_per_stream, c.max_leases) == (10_000, 1_000_000)
    c = parse("--max-concurrent-streams", "100", "--max-connections", "8", "--max-connection-bytes", "4194304",
              "--max-watchers-per-stream", "3", "--max-leases", "50")
    assert (c.max_concurrent_streams, c.max_connections, c.max_connection_bytes) == (100, 8, 4 << 20)
    assert (c.max_watchers_per_stream, c.max_leases) == (3, 50)
    ec = serve.make_engine_config(c)
    assert (ec.max_watchers_per_stream, ec.max_leases) == (3, 50)
    c = parse(env={"ETCD_MAX_CONCURRENT_STREAMS": "7", "BRAIN_MAX_LEASES": "9"})
    assert (c.max_concurrent_streams, c.max_leases) == (7, 9)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--max-concurrent-streams", "0"], "--max-concurrent-streams must be between 1 and 4294967295, got 0"),
        (["--max-concurrent-streams", "4294967296"], "--max-concurrent-streams must be between 1 and 4294967295"),
        (["--max-connections", "0"], "--max-connections must be positive, got 0"),
        (["--max-watchers-per-stream", "-1"], "--max-watchers-per-stream must be positive, got -1"),
        (["--max-leases", "0"], "--max-leases must be positive, got 0"),
        (["--max-leases", "many"], "invalid integer 'many'"),
        # a request at the receive limit (--max-request-bytes + 512 KiB) must fit one connection's budget
        (["--max-connection-bytes", "1000"], "--max-connection-bytes must be at least --max-request-bytes + 512 KiB "
                                             "(2097152), got 1000"),
        (["--max-request-bytes", "8388608", "--max-connection-bytes", "8388608"],
         "--max-connection-bytes must be at least --max-request-bytes + 512 KiB (8912896)"),
    ],
)
def test_abuse_bound_flags_refuse_bad_values(argv, msg, capsys):
    with pytest.raises(SystemExit) as ei:
        parse(*argv)
    assert ei.value.code == 2
    assert msg in capsys.readouterr().err
