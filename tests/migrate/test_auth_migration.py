"""Auth travels with the data: etcd's auth buckets (users with their bcrypt
hashes, roles with their permissions, auth on, the auth revision) are
imported from an etcd data directory, and a brain snapshot restored into
etcd (and into brain) keeps them; the restored server enforces them."""

from __future__ import annotations

import subprocess

import pytest

from brain.api.pb.authpb import auth_pb2
from brain.migrate.etcddb import proto
from tests.migrate.conftest import Etcd, brain_cli, etcd_binary
from tests.migrate.test_export_to_etcd import restore_command
from tests.support.etcd_tools import etcd_tool

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(600)]

ROOT = "--user=root:rootpw"
ALICE = "--user=alice:apw"

SETUP = [
    ["user", "add", "root", "--new-user-password=rootpw"],
    ["user", "add", "alice", "--new-user-password=apw"],
    ["user", "add", "np", "--no-password"],
    ["role", "add", "pfx"],
    ["role", "grant-permission", "pfx", "--prefix=true", "readwrite", "/app/"],
    ["role", "grant-permission", "pfx", "read", "/conf"],
    ["user", "grant-role", "alice", "pfx"],
    ["put", "/app/a", "1"],
    ["put", "/conf", "c"],
    ["put", "/secret", "s"],
    ["auth", "enable"],
]

# What a server that kept the auth state answers (exit code, stdout).
CHECKS = [
    ([ROOT, "auth", "status"], None),
    ([ROOT, "user", "list"], "alice\nnp\nroot\n"),
    ([ROOT, "role", "get", "pfx"], None),
    ([ALICE, "get", "/app/a", "--print-value-only"], "1\n"),
    ([ALICE, "get", "/conf", "--print-value-only"], "c\n"),
    ([ALICE, "get", "/secret"], ""),  # permission denied
    (["get", "/secret"], ""),  # user name is empty
    ([ROOT, "get", "/secret", "--print-value-only"], "s\n"),
]


def _ctl(endpoint: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([etcd_tool("etcdctl-3.7"), f"--endpoints={endpoint}", *args], capture_output=True,
                          text=True, timeout=60)


def _answers(endpoint: str) -> list[tuple[int, str, str]]:
    out = []
    for args, _ in CHECKS:
        r = _ctl(endpoint, args)
        out.append((r.returncode, r.stdout, r.stderr.strip().splitlines()[-1] if r.returncode else ""))
    return out


def _check(answers) -> None:
    for (args, stdout), (code, got, err) in zip(CHECKS, answers):
        if stdout == "":
            assert code != 0, args
        else:
            assert code == 0, (args, err)
            if stdout is not None:
                assert got == stdout, args
    assert answers[5][2] == "Error: etcdserver: permission denied"
    assert answers[6][2] == "Error: etcdserver: user name is empty"


def test_an_etcd_data_dir_with_auth_imports_its_users_roles_and_enabled_state(etcd_of, brain_on, tmp_path):
    etcd = etcd_of("3.6")
    for args in SETUP:
        r = _ctl(etcd.endpoint, args)
        assert r.returncode == 0, (args, r.stderr)
    want = _answers(etcd.endpoint)
    _check(want)
    etcd.stop()
    target = tmp_path / "imported"
    r = brain_cli("import", str(etcd.data_dir), "--data-dir", str(target))
    assert r.returncode == 0, r.stderr
    assert "authentication" not in r.stdout + r.stderr  # no warning: it came along
    brain = brain_on(target)
    assert _answers(brain.endpoint) == want


def test_a_brain_snapshot_keeps_auth_through_etcd_and_brain(brain_factory, brain_on, tmp_path):
    brain = brain_factory(shards=4)
    for args in SETUP:
        r = _ctl(brain.endpoint, args)
        assert r.returncode == 0, (args, r.stderr)
    want = _answers(brain.endpoint)
    _check(want)
    snap = tmp_path / "brain.snap"
    r = _ctl(brain.endpoint, [ROOT, "snapshot", "save", str(snap)])
    assert r.returncode == 0, r.stderr

    etcd = Etcd(etcd_binary("3.7"))
    try:
        r = subprocess.run(restore_command("3.7", snap, etcd), capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        etcd.start()
        assert _answers(etcd.endpoint) == want
    finally:
        etcd.cleanup()

    restored = tmp_path / "restored"
    r = brain_cli("snapshot", "restore", str(snap), "--data-dir", str(restored))
    assert r.returncode == 0, r.stderr
    assert _answers(brain_on(restored).endpoint) == want


def test_users_and_roles_encode_as_etcds_protobuf():
    for u in (proto.User(b"alice", b"$2a$10$hash", (b"a", b"b")), proto.User(b"np", b"", (), True)):
        want = auth_pb2.User(name=u.name, password=u.password, roles=[r.decode() for r in u.roles],
                             options=auth_pb2.UserAddOptions(no_password=u.no_password)).SerializeToString()
        assert proto.encode_user(u) == want
        assert proto.decode_user(want) == u
    r = proto.Role(b"r", (proto.Permission(0, b"/a/", b"/a0"), proto.Permission(2, b"k"),
                          proto.Permission(1, b"z", b"\x00")))
    want = auth_pb2.Role(name=r.name, keyPermission=[auth_pb2.Permission(permType=p.perm_type, key=p.key,
                                                                         range_end=p.range_end)
                                                     for p in r.permissions]).SerializeToString()
    assert proto.encode_role(r) == want
    assert proto.decode_role(want) == r


def test_snapshot_save_and_mirror_ask_an_etcd_with_auth_on_as_a_user(etcd_of, brain_on, tmp_path):
    from tests.migrate.test_mirror import MirrorProcess

    etcd = etcd_of("3.7")
    for args in SETUP:
        r = _ctl(etcd.endpoint, args)
        assert r.returncode == 0, (args, r.stderr)
    refused = brain_cli("snapshot", "save", str(tmp_path / "none.db"), "--endpoints", etcd.endpoint)
    assert refused.returncode != 0 and "etcdserver: user name is empty" in refused.stderr
    wrong = brain_cli("snapshot", "save", str(tmp_path / "none.db"), "--endpoints", etcd.endpoint,
                      "--user", "root:nope")
    assert wrong.returncode != 0 and "authentication failed" in wrong.stderr
    r = brain_cli("snapshot", "save", str(tmp_path / "etcd.db"), "--endpoints", etcd.endpoint,
                  "--user", "root", "--password", "rootpw")
    assert r.returncode == 0, r.stderr

    m = MirrorProcess(etcd.endpoint, tmp_path / "mirrored", "--user", "root:rootpw")
    try:
        m.wait_for(r"mirror: following: revision 4 of etcd's 4 \(0 behind", timeout=60)  # three puts
        assert _ctl(etcd.endpoint, [ROOT, "put", "/app/b", "2"]).returncode == 0
        m.wait_for(r"mirror: following: revision 5 of etcd's 5 \(0 behind", timeout=60)
    finally:
        rc = m.stop()
    assert rc == 0, "\n".join(m.lines[-20:])
    brain = brain_on(tmp_path / "mirrored")
    got = _answers(brain.endpoint)
    assert got[3][1] == "1\n" and got[5][2] == "Error: etcdserver: permission denied"
    assert _ctl(brain.endpoint, [ALICE, "get", "/app/b", "--print-value-only"]).stdout == "2\n"
