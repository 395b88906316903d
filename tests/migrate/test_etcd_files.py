"""Edge cases of etcd's files, written with our writer exactly as etcd lays
them out: a compaction etcd had scheduled but not finished, the newest
revision compacted away, a fresh etcd, etcd's users and alarms."""

from __future__ import annotations

import pytest

from brain.engine import Engine, EngineConfig
from brain.migrate.etcd_import import import_etcd
from brain.migrate.etcddb import EtcdDb, proto, schema
from brain.migrate.etcddb.proto import KeyValue, Lease, encode_key_value
from brain.migrate.etcddb.writer import DbMeta, Member, write_etcd_db
from brain.migrate.bbolt import BoltWriter
from brain.mvcc import errors
from brain.mvcc.requests import RangeRequest


def put(main, sub, key, value, create, version, lease=0):
    return schema.rev_key(main, sub), encode_key_value(KeyValue(key, create, main, version, value, lease))


def tomb(main, sub, key):
    return schema.rev_key(main, sub, True), encode_key_value(KeyValue(key))


def write(path, entries, *, compact=-1, leases=(), scheduled=None):
    with open(path, "w+b") as f:
        write_etcd_db(f, entries, list(leases), DbMeta(consistent_index=9, term=2, compact_revision=compact,
                                                        members=[Member(1, "e")]))
    if scheduled is not None:  # etcd crashed between scheduling a compaction and finishing it
        rewrite(path, {b"meta": {schema.META_SCHEDULED_COMPACT: schema.rev_key(scheduled)}})


def rewrite(path, changes: dict[bytes, dict[bytes, bytes]]) -> None:
    """Write the database again with keys of some buckets set (a whole new
    file: our writer builds whole files)."""
    with EtcdDb.open(str(path)) as db:
        buckets = {name: dict(b) for name, b in db.bolt.root().buckets()}
    for name, kv in changes.items():
        buckets.setdefault(name, {}).update(kv)
    with open(path, "w+b") as f:
        w = BoltWriter(f)
        values = {name: w.bucket(sorted(items.items())) for name, items in buckets.items()}
        w.finish(sorted(values.items()))


def dump(eng, rev=0):
    res = eng.range(RangeRequest(b"\0", b"\0", revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in res.kvs]


@pytest.fixture
def opened(tmp_path):
    engines = []

    def open_(path):
        eng = Engine.open(EngineConfig(str(path), shards=1, shard_boundaries=[]))
        engines.append(eng)
        return eng

    yield open_
    for e in engines:
        e.close()


def test_an_unfinished_compaction_is_finished_by_brain(tmp_path, opened):
    # k: 2, 3, 4, deleted at 5, put again at 6; j: put at 3 (with k, one Txn)
    entries = [put(2, 0, b"k", b"a", 2, 1), put(3, 0, b"k", b"b", 2, 2), put(3, 1, b"j", b"x", 3, 1),
               put(4, 0, b"k", b"c", 2, 3), tomb(5, 0, b"k"), put(6, 0, b"k", b"d", 6, 1)]
    db = tmp_path / "db"
    write(db, entries, compact=2, scheduled=5)  # finished at 2, scheduled at 5: nothing below 5 dropped yet
    with EtcdDb.open(str(db)) as e:
        assert (e.meta.finished_compact, e.meta.scheduled_compact, e.compact_revision) == (2, 5, 5)
    res = import_etcd(str(db), str(tmp_path / "b"), boundaries=[], out=lambda line: None)
    assert (res.revision, res.compact_revision, res.records, res.keys) == (6, 5, 6, 2)
    eng = opened(tmp_path / "b")
    with pytest.raises(errors.EtcdError) as e:
        eng.range(RangeRequest(b"k", revision=4))
    assert e.value == errors.ErrCompacted
    assert dump(eng, 5) == [(b"j", b"x", 3, 3, 1, 0)]
    assert dump(eng) == [(b"j", b"x", 3, 3, 1, 0), (b"k", b"d", 6, 6, 1, 0)]


def test_the_newest_revision_compacted_away(tmp_path, opened):
    """etcd 3.4 drops a tombstone at the compaction revision: when that was
    the newest revision, etcd still serves it as its revision, so does brain."""
    db = tmp_path / "db"
    write(db, [put(2, 0, b"j", b"x", 2, 1)], compact=3)  # k put at ... deleted at 3 = compaction: gone
    res = import_etcd(str(db), str(tmp_path / "b"), boundaries=[], out=lambda line: None)
    assert (res.revision, res.compact_revision) == (3, 3)
    eng = opened(tmp_path / "b")
    assert eng.committed_rev == 3 and dump(eng) == [(b"j", b"x", 2, 2, 1, 0)]


def test_a_fresh_etcd_and_leases(tmp_path, opened):
    """A negative lease ID (etcd grants them) is keyed in two's complement,
    as etcd's int64ToBytes writes it, and read back as it was."""
    db = tmp_path / "db"
    write(db, [], leases=[Lease(5, 30), Lease(6, 90), Lease(-9, 20)])
    with EtcdDb.open(str(db)) as e:
        keys = [k for k, _ in e.bolt.root().bucket(schema.LEASE)]
    assert keys == [schema.u64(5), schema.u64(6), b"\xff" * 7 + b"\xf7"]
    res = import_etcd(str(db), str(tmp_path / "b"), boundaries=[], out=lambda line: None)
    assert (res.revision, res.compact_revision, res.records, res.leases) == (1, -1, 0, 3)
    eng = opened(tmp_path / "b")
    assert eng.committed_rev == 1
    assert {lid: lease.ttl for lid, lease in eng.store.lessor.leases.items()} == {5: 30, 6: 90, -9: 20}


def test_auth_is_imported_and_alarms_are_reported_not_imported(tmp_path, opened):
    db = tmp_path / "db"
    write(db, [put(2, 0, b"k", b"v", 2, 1)])
    root = proto.encode_user(proto.User(b"root", b"$2a$10$x", (b"root",)))
    role = proto.encode_role(proto.Role(b"r", (proto.Permission(0, b"/a/", b"/a0"),)))
    rewrite(db, {b"auth": {schema.AUTH_ENABLED: b"\x01", schema.AUTH_REVISION: schema.u64(9)},
                 b"authUsers": {b"root": root}, b"authRoles": {b"r": role},
                 b"alarm": {b"\x08\x01\x10\x01": b""}})
    res = import_etcd(str(db), str(tmp_path / "b"), boundaries=[], out=lambda line: None)
    assert len(res.warnings) == 1
    assert "1 etcd alarm(s) are not imported" in res.warnings[0]
    auth = opened(tmp_path / "b").auth
    assert (auth.enabled, auth.revision, sorted(auth.users), sorted(auth.roles)) == (True, 9, ["root"], ["r"])
    assert auth.users["root"].roles == ("root",) and auth.roles["r"].perms[0].range_end == b"/a0"
