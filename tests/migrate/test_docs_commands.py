"""docs/migration.md's snapshot commands, run as written.

* `brain snapshot status` prints exactly what etcdutl 3.6 prints, and etcd
  3.4's etcdctl differs where the docs say (TOTAL KEYS counts every bucket
  entry, no VERSION): the docs name the version brain matches.
* The way back: the docs say where etcdutl comes from, and their restore
  command (host names replaced by loopback) turns a brain snapshot into an
  etcd data directory, through etcdutl 3.6 and, for etcd 3.4, etcdctl;
  that etcd then serves every key brain had.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from brain.api.pb.etcdserverpb import rpc_pb2
from brain.migrate import snapshot as snaps
from brain.migrate.etcddb import EtcdDb
from tests.migrate.conftest import Etcd, brain_cli, etcd_binary
from tests.migrate.test_snapshot import workload
from tests.support.engines import dump, opened_engines
from tests.support.etcd_tools import etcd_tool
from tests.support.servers import kv_stub

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(300)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start:end if end > 0 else None]


def prose(text: str) -> str:
    """``text`` with its line breaks and indents as single spaces."""
    return " ".join(text.split())


def shell_commands(text: str) -> list[list[str]]:
    """The commands of the ```sh blocks in ``text``, continuation lines joined."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """A brain snapshot of puts, overwrites, deletes and a lease, and the keys it holds."""
    root = tmp_path_factory.mktemp("snap")
    with opened_engines(root) as make:
        eng = make("src")
        workload(eng)
        path = root / "brain.db"
        snaps.save_snapshot(eng, str(path))
        return path, dump(eng)


def test_snapshot_status_is_etcdutl_36s_and_the_docs_say_so(snapshot):
    path, keys = snapshot
    claims = prose(section("## Snapshots are etcd databases"))
    assert "prints exactly what etcdutl 3.6 does" in claims
    assert "etcd 3.4's `etcdctl snapshot status`" in claims and "every entry of every bucket" in claims

    ours = brain_cli("snapshot", "status", str(path), "-w", "table")
    theirs = subprocess.run([etcd_tool("etcdutl-3.6"), "snapshot", "status", str(path), "-w", "table"],
                            capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout == theirs.stdout
    st = json.loads(brain_cli("snapshot", "status", str(path), "-w", "json").stdout)
    assert st["totalKey"] == len(keys)

    etcd_bin = etcd_binary("3.4")  # skips (fails under CI) without Debian's etcd; etcdctl comes with it
    assert etcd_bin
    old = subprocess.run(["etcdctl", "snapshot", "status", str(path), "-w", "json"], capture_output=True,
                         text=True, timeout=60, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})
    assert old.returncode == 0, old.stderr
    old = json.loads(old.stdout)
    with EtcdDb.open(str(path)) as db:
        entries = sum(len(list(bucket.items())) for _name, bucket in db.bolt.root().buckets())
    assert (old["hash"], old["revision"], old["totalSize"]) == (st["hash"], st["revision"], st["totalSize"])
    assert old["totalKey"] == entries != st["totalKey"] and "version" not in old


@pytest.mark.parametrize("version", ["3.6", "3.4"])
def test_the_way_back_runs_as_the_docs_say(version, snapshot, tmp_path):
    path, keys = snapshot
    way_back = section("### The way back")
    said = prose(way_back)
    assert "`bash benchmarks/build.sh etcdutl-3.6`" in said and "`.cache/bench/bin/etcdutl-3.6`" in said
    assert "`ETCDCTL_API=3 etcdctl snapshot restore`" in said
    [restore] = [c for c in shell_commands(way_back) if c[:3] == ["etcdutl", "snapshot", "restore"]]

    etcd = Etcd(etcd_binary(version))
    try:
        peer = f"http://127.0.0.1:{etcd.peer_port}"
        # the docs' example hosts, paths and member name, made this machine's
        local = {"brain.db": str(path), "/var/lib/etcd-restored": str(etcd.data_dir), "etcd-0": "t",
                 "https://etcd-0.example:2380": peer, "etcd-0=https://etcd-0.example:2380": f"t={peer}"}
        args = [local.get(a, a) for a in restore[1:]]
        unknown = [a for a in args if "example" in a or a.startswith("/var/")]
        assert not unknown, f"the docs' command names something this test does not replace: {unknown}"
        tool = [etcd_tool("etcdutl-3.6")] if version == "3.6" else ["etcdctl"]
        r = subprocess.run([*tool, *args], capture_output=True, text=True, timeout=120,
                           env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        etcd.start()
        with kv_stub(etcd.endpoint) as s:
            got = s.kv.Range(rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00"), timeout=10).kvs
        assert [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in got] == keys
    finally:
        etcd.cleanup()
