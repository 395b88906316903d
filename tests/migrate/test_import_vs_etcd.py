"""`brain import` against real etcd files (3.4, 3.5, 3.6), differentially: a
real etcd writes a history (puts, Txns putting several keys in one revision,
deletes, range deletes, leases, a revoke, compactions); its data directory
(etcd stopped) and an `etcdctl snapshot save` file are imported; brain
serving each import answers every Range at every retained revision, every
Watch from every retained revision and every lease question exactly as
that etcd does."""

from __future__ import annotations

import json

import pytest

from brain.migrate.etcddb import EtcdDb
from tests.migrate.compare import fingerprint
from tests.migrate.conftest import ETCD_VERSIONS, brain_cli, etcdctl
from tests.migrate.workload import write_history
from tests.support.servers import free_port

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(600)]


@pytest.mark.parametrize("version", ETCD_VERSIONS)
def test_import_answers_as_etcd_did(version, etcd_of, brain_on, tmp_path):
    etcd = etcd_of(version)
    with etcd.stubs() as s:
        h = write_history(s, seed=11, ops=400)
    assert h.compactions and h.multi_put_revisions and h.leases and h.revoked
    snap = tmp_path / "etcd.snap"
    r = etcdctl(etcd.endpoint, "snapshot", "save", str(snap))
    assert r.returncode == 0, r.stderr
    # etcd's own view, then stopped for the data-directory import
    want = fingerprint(etcd.endpoint)
    assert want.revision == h.revision and want.compact == h.compactions[-1]

    with EtcdDb.open(str(snap)) as db:  # the reader agrees with etcd on the basics
        assert (db.current_revision, db.compact_revision) == (h.revision, h.compactions[-1])
        assert sorted(lease.id for lease in db.leases()) == sorted(h.leases)
        assert db.meta.consistent_index and (db.meta.term is None) == (version == "3.4")

    etcd.stop()
    from_dir = tmp_path / "from-dir"
    r = brain_cli("import", str(etcd.data_dir), "--data-dir", str(from_dir))
    assert r.returncode == 0, r.stderr
    assert f"at revision {h.revision} (compacted at {h.compactions[-1]};" in r.stdout
    assert "import: done:" in r.stderr
    from_snap = tmp_path / "from-snap"
    r = brain_cli("import", str(snap), "--data-dir", str(from_snap), "--shards", "1")
    assert r.returncode == 0, r.stderr
    assert "etcd snapshot" in r.stdout

    # etcd again, on its data directory: nothing changed by the import
    etcd.start()
    assert fingerprint(etcd.endpoint).diff(want) is None
    for data_dir, shards in ((from_dir, 4), (from_snap, 1)):
        brain = brain_on(data_dir, shards=shards)
        got = fingerprint(brain.endpoint)
        assert got.diff(want) is None, f"{data_dir.name}: {got.diff(want)}"
        # and it goes on from there: the next write is the next revision
        r = etcdctl(brain.endpoint, "put", "after-import", "1", "-w", "json")
        assert json.loads(r.stdout)["header"]["revision"] == h.revision + 1
        brain.stop()


def test_import_refusals(etcd_of, tmp_path):
    etcd = etcd_of("3.4")
    etcdctl(etcd.endpoint, "put", "k", "v")
    # etcd still running: its database is locked
    r = brain_cli("import", str(etcd.data_dir), "--data-dir", str(tmp_path / "b"))
    assert r.returncode == 1 and "locked by a running etcd" in r.stderr and "brain mirror" in r.stderr
    assert not (tmp_path / "b").exists()
    snap = tmp_path / "s.snap"
    assert etcdctl(etcd.endpoint, "snapshot", "save", str(snap)).returncode == 0
    etcd.stop()

    ok = brain_cli("import", str(snap), "--data-dir", str(tmp_path / "b"))
    assert ok.returncode == 0, ok.stderr
    again = brain_cli("import", str(snap), "--data-dir", str(tmp_path / "b"))
    assert again.returncode == 1 and "holds brain data; pass --replace" in again.stderr
    replaced = brain_cli("import", str(etcd.data_dir), "--data-dir", str(tmp_path / "b"), "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert not [n for n in (tmp_path / "b").iterdir() if n.name.startswith(".brain")]

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    r = brain_cli("import", str(snap), "--data-dir", str(tmp_path / "other"))
    assert r.returncode == 1 and "not brain's (notes.txt)" in r.stderr
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]

    r = brain_cli("import", str(snap), "--data-dir", str(etcd.data_dir))
    assert r.returncode == 1 and "is an etcd data directory" in r.stderr

    # serving etcd's directory: refused, naming it and how to import it; nothing written into it
    before = sorted(p.name for p in etcd.data_dir.iterdir())
    r = brain_cli("serve", "--data-dir", str(etcd.data_dir), "--listen-client-urls",
                  f"http://127.0.0.1:{free_port()}", timeout=60)
    assert r.returncode == 1
    assert f"{etcd.data_dir} is an etcd data directory" in r.stderr
    assert f"brain import {etcd.data_dir} --data-dir" in r.stderr
    assert sorted(p.name for p in etcd.data_dir.iterdir()) == before

    damaged = tmp_path / "damaged.snap"
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))
    r = brain_cli("import", str(damaged), "--data-dir", str(tmp_path / "c"))
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr and not (tmp_path / "c").exists()

    r = brain_cli("import", str(tmp_path), "--data-dir", str(tmp_path / "c"))
    assert r.returncode == 1 and "not an etcd data directory" in r.stderr
