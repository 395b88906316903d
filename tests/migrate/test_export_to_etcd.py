"""The way back: a snapshot of brain (`etcdctl snapshot save` against brain,
i.e. the Maintenance Snapshot RPC) is an etcd database.  etcd's tools read
it (`etcdutl snapshot status` runs bbolt's consistency check first), etcd's
restore takes it, and the etcd served from the restored directory answers
every Range at every retained revision, every Watch from every retained
revision and every lease question exactly as the brain did (3.6 and 3.7;
3.5 and 3.4 too).  The file's storage and cluster versions are 3.6.0 while
brain reports 3.7.3 (brain/etcd_version.py): etcd 3.6 refuses a database of
version 3.7, and etcd 3.7 upgrades a 3.6 one as it starts."""

from __future__ import annotations

import json
import subprocess

import pytest

from brain.etcd_version import ETCD_CLUSTER_VERSION, STORAGE_VERSION
from brain.migrate.etcddb import EtcdDb
from tests.migrate.compare import fingerprint
from tests.migrate.conftest import ETCD_VERSIONS, Etcd, brain_cli, etcd_binary, etcdctl
from tests.migrate.workload import write_history
from tests.support.etcd_tools import etcd_tool

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(600)]


def restore_command(version: str, snap, etcd: Etcd) -> list[str]:
    peer = f"http://127.0.0.1:{etcd.peer_port}"
    tool = ["etcdctl"] if version == "3.4" else [etcd_tool(f"etcdutl-{version}")]
    return [*tool, "snapshot", "restore", str(snap), "--data-dir", str(etcd.data_dir), "--name", "t",
            "--initial-cluster", f"t={peer}", "--initial-advertise-peer-urls", peer]


@pytest.mark.parametrize("version", ETCD_VERSIONS)
def test_brain_snapshot_restores_into_etcd(version, brain_factory, tmp_path):
    brain = brain_factory(shards=4)
    with brain.stubs() as s:
        h = write_history(s, seed=5, ops=400)
    assert h.compactions and h.multi_put_revisions and h.leases
    assert any(lid < 0 for lid in h.leases)  # a negative lease ID is keyed as etcd keys it
    snap = tmp_path / "brain.snap"
    r = etcdctl(brain.endpoint, "snapshot", "save", str(snap))
    assert r.returncode == 0, r.stderr
    want = fingerprint(brain.endpoint)
    assert want.revision == h.revision

    # etcd's tools read it
    if version != "3.4":
        st = subprocess.run([etcd_tool(f"etcdutl-{version}"), "snapshot", "status", str(snap), "-w", "json"],
                            capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stderr
        theirs = json.loads(st.stdout)
        ours = json.loads(brain_cli("snapshot", "status", str(snap), "-w", "json").stdout)
        # (etcdutl 3.5 counts the keys of every bucket as totalKey; 3.6 and 3.7 the live keys, as brain does)
        fields = ["hash", "revision", "totalSize"] + (["totalKey", "version"] if version in ("3.6", "3.7") else [])
        assert {k: theirs[k] for k in fields} == {k: ours[k] for k in fields}
        assert theirs["revision"] == h.revision and theirs.get("version", STORAGE_VERSION) == STORAGE_VERSION
    with EtcdDb.open(str(snap)) as db:
        assert db.meta.consistent_index and db.compact_revision == h.compactions[-1]
        assert (db.meta.storage_version, db.meta.cluster_version) == (STORAGE_VERSION, ETCD_CLUSTER_VERSION)

    etcd = Etcd(etcd_binary(version))
    try:
        env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
        r = subprocess.run(restore_command(version, snap, etcd), capture_output=True, text=True, timeout=120,
                           env=env)
        assert r.returncode == 0, r.stderr
        etcd.start()
        got = fingerprint(etcd.endpoint)
        assert got.diff(want) is None, got.diff(want)
    finally:
        etcd.cleanup()


def test_brain_snapshot_save_from_etcd_and_from_brain(etcd_of, brain_factory, tmp_path):
    """`brain snapshot save` is a client of the Maintenance API like etcdctl's:
    it saves etcd's snapshot and brain's, and both read back the same."""
    etcd = etcd_of("3.6")
    brain = brain_factory(shards=1)
    for srv in (etcd, brain):
        with srv.stubs() as s:
            write_history(s, seed=3, ops=120)
        path = tmp_path / f"{srv.kind}.snap"
        r = brain_cli("snapshot", "save", str(path), "--endpoints", f"http://{srv.endpoint}")
        assert r.returncode == 0 and r.stdout == f"Snapshot saved at {path}\n", r.stderr
        assert "snapshot save: done:" in r.stderr
        theirs = subprocess.run([etcd_tool("etcdutl-3.6"), "snapshot", "status", str(path)],
                                capture_output=True, text=True, timeout=60)
        ours = brain_cli("snapshot", "status", str(path))
        assert theirs.returncode == 0 and ours.stdout == theirs.stdout, (ours.stdout, theirs.stdout)
