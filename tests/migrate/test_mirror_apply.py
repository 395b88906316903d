"""brain.migrate.mirror's apply step on a real engine, with a scripted source: etcd's
revisions land at the same numbers (a Txn's events stay one revision), a put
carrying an unseen lease brings the lease first, a gap stops the mirror,
lease polls grant and revoke, a compaction waits until brain reaches it."""

from __future__ import annotations

import pytest

from brain.migrate.source import WatchBatch
from brain.migrate.mirror import Mirror, MirrorError
from brain.mvcc.requests import EVENT_DELETE, EVENT_PUT, Event, KeyValue, RangeRequest


class Source:
    """What the mirror asks of etcd, scripted."""

    def __init__(self) -> None:
        self.lease_ttls: dict[int, int] = {}
        self.compacted = 0

    def leases(self) -> list[int]:
        return list(self.lease_ttls)

    def lease_ttl(self, lease_id: int):
        ttl = self.lease_ttls.get(lease_id)
        return None if ttl is None else (ttl, ttl)

    def compact_revision(self, floor: int) -> int:
        return max(floor, self.compacted)


def put(key: bytes, value: bytes, rev: int, lease: int = 0) -> Event:
    return Event(EVENT_PUT, KeyValue(key, 0, rev, 0, value, lease))


def delete(key: bytes, rev: int) -> Event:
    return Event(EVENT_DELETE, KeyValue(key, 0, rev, 0, b"", 0))


@pytest.fixture
def mirror(tmp_path):
    src = Source()
    m = Mirror(src, str(tmp_path / "d"), boundaries=[b"m"], out=lambda line: None)
    m.started_revision = m.applied_revision = m.source_revision = 1  # an empty store, as copy() would leave it
    m._next_rev = 2
    m.open_engine()
    yield m, src
    m.close()


def kvs(m, rev: int = 0) -> list[tuple]:
    res = m.engine.range(RangeRequest(b"\0", b"\0", revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in res.kvs]


def test_revisions_land_at_etcds_numbers(mirror):
    m, src = mirror
    src.lease_ttls[7] = 60
    m.apply(WatchBatch(4, [put(b"a", b"1", 2), put(b"b", b"1", 3), put(b"z", b"1", 3), put(b"k", b"x", 4, lease=7)]))
    m.apply(WatchBatch(5, [delete(b"a", 5)]))
    m._wait_all()
    assert m.engine.committed_rev == 5 and m.applied_revision == 5
    assert kvs(m, 3) == [(b"a", b"1", 2, 2, 1, 0), (b"b", b"1", 3, 3, 1, 0), (b"z", b"1", 3, 3, 1, 0)]
    assert kvs(m) == [(b"b", b"1", 3, 3, 1, 0), (b"k", b"x", 4, 4, 1, 7), (b"z", b"1", 3, 3, 1, 0)]
    # the unseen lease was granted before the put, so the key is attached to it
    assert m.engine.store.lessor.lease_of(b"k") == 7 and m.leases_granted == 1
    assert m.lag() == (0, 0.0)


def test_a_gap_stops_the_mirror(mirror):
    m, _src = mirror
    m.apply(WatchBatch(2, [put(b"a", b"1", 2)]))
    with pytest.raises(MirrorError, match="revision 4 where 3 was expected"):
        m.apply(WatchBatch(4, [put(b"a", b"2", 4)]))


def test_lease_polls_and_compaction(mirror):
    m, src = mirror
    src.lease_ttls = {11: 30, 12: 40}
    m.poll_leases()
    assert {lid: lease.ttl for lid, lease in m.engine.store.lessor.leases.items()} == {11: 30, 12: 40}
    del src.lease_ttls[11]
    m.poll_leases()
    assert sorted(m.engine.store.lessor.leases) == [12] and m.leases_revoked == 1
    for rev in range(2, 7):
        m.apply(WatchBatch(rev, [put(b"k", b"v%d" % rev, rev)]))
    src.compacted = 9  # etcd compacted beyond what brain has: not yet
    m._wait_all()
    m.poll_compaction()
    assert m.engine.store.compact_rev == -1
    src.compacted = 4
    m.poll_compaction()
    assert m.engine.store.compact_rev == 4 == m.compact_revision
    assert kvs(m, 4) == [(b"k", b"v4", 2, 4, 3, 0)]
