"""Lease time: the LeaseKeeper on a fake clock (heap, lazy invalidation,
expiry, retries, keep-alive on an expired lease, recovery spreading), the
etcd-style ID generator, and the Engine's lease methods end to end (grant
rules, expiry deleting keys in one revision, durability and TTL renewal on
recovery, a Put on an expired-but-not-revoked lease).  The 100k-lease tests
measure and print their costs; they assert behaviour, never timings."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from brain.engine import Engine, EngineConfig
from brain.engine.limits import MAX_PENDING_WRITES
from brain.engine.leases import (
    MIN_LEASE_TTL,
    RECOVERY_EXTEND_SECONDS,
    IdGenerator,
    LeaseKeeper,
    effective_ttl,
)
from brain.mvcc import errors
from brain.mvcc.lease import MAX_LEASE_TTL
from brain.mvcc.requests import (
    LeaseGrantRequest,
    LeaseGrantResult,
    LeaseRevokeRequest,
    LeaseRevokeResult,
    PutRequest,
    RangeRequest,
)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeRevoker:
    """Records revokes; each returns a Future the test completes."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.futures: dict[int, Future] = {}

    def __call__(self, lease_id: int) -> Future:
        f: Future = Future()
        self.calls.append(lease_id)
        self.futures[lease_id] = f
        return f


def keeper_with(clock=None, **kw):
    rv = FakeRevoker()
    clock = clock or FakeClock()
    return LeaseKeeper(rv, clock=clock, **kw), rv, clock


def commit_revoke(keeper: LeaseKeeper, rv: FakeRevoker, lease_id: int) -> None:
    """What the engine does when a revoke commits: on_commit, then the future."""
    keeper.on_commit([LeaseRevokeRequest(lease_id)], [LeaseRevokeResult(5)])
    rv.futures[lease_id].set_result(LeaseRevokeResult(5))


# ---------------------------------------------------------------------------
# TTL rules and IDs


def test_effective_ttl_is_etcds_minimum_and_maximum():
    assert MIN_LEASE_TTL == 2
    for asked, got in [(-5, 2), (0, 2), (1, 2), (2, 2), (3, 3), (MAX_LEASE_TTL, MAX_LEASE_TTL)]:
        assert effective_ttl(asked) == got
    with pytest.raises(errors.EtcdError) as e:
        effective_ttl(MAX_LEASE_TTL + 1)
    assert e.value == errors.ErrLeaseTTLTooLarge
    assert (e.value.code, e.value.message) == ("OUT_OF_RANGE", "etcdserver: too large lease TTL")


def test_id_generator_is_etcds_layout_unique_positive():
    gen = IdGenerator(member_id=0xABCD_1234_5678_9ABC, now_ms=0x12_3456_789A)
    ids = [gen.next() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(0 < i < 2**63 for i in ids)
    # member id's low 16 bits on top (masked to 63 bits), then ms << 8 + counter
    assert ids[0] == ((0x9ABC << 48) | (0x12_3456_789A << 8) | 1) & (2**63 - 1)
    assert ids[1] == ids[0] + 1
    # a counter overflowing into the timestamp is fine (etcd: intentional)
    assert ids[300] == ids[0] + 300


def test_id_generator_restart_later_does_not_repeat():
    a = IdGenerator(7, now_ms=1_000_000)
    first = {a.next() for _ in range(200)}
    b = IdGenerator(7, now_ms=1_000_001)  # restarted a millisecond later
    second = {b.next() for _ in range(200)}
    # 200 ids per ms would overlap; etcd accepts that (<< 256 per ms), so only
    # check the common case of fewer than 256 ids per millisecond
    assert len(first & {x for x in second if x > max(first)}) == 0
    assert min(second) > min(first)


# ---------------------------------------------------------------------------
# LeaseKeeper on a fake clock


def test_expiry_after_ttl_and_not_before():
    k, rv, clock = keeper_with()
    k.granted(1, 10)
    k.granted(2, 5)
    assert k.expire_due() == []
    clock.advance(4.999)
    assert k.expire_due() == []
    clock.advance(0.001)
    assert k.expire_due() == [2]
    assert rv.calls == [2]
    assert k.expire_due() == []  # in flight: not submitted twice
    commit_revoke(k, rv, 2)
    assert 2 not in k and 1 in k
    clock.advance(5)
    assert k.expire_due() == [1]


def test_keepalive_moves_the_deadline():
    k, rv, clock = keeper_with()
    k.granted(1, 2)
    clock.advance(1.5)
    assert k.renew(1) == 2
    clock.advance(1.0)  # 2.5 s after grant, 1.0 after the renewal
    assert k.expire_due() == []
    left, ttl = k.remaining(1)
    assert ttl == 2 and left == pytest.approx(1.0)
    clock.advance(1.0)
    assert k.expire_due() == [1]


def test_a_stopped_keeper_refuses_renewals_as_not_leader():
    k, rv, clock = keeper_with()
    k.granted(1, 10)
    k.stop()
    with pytest.raises(errors.EtcdError) as e:
        k.renew(1)
    assert e.value == errors.ErrNotLeader


def test_unknown_lease():
    k, rv, clock = keeper_with()
    with pytest.raises(errors.EtcdError) as e:
        k.renew(42)
    assert e.value == errors.ErrLeaseNotFound
    assert k.remaining(42) is None


def test_revoked_lease_is_forgotten_and_its_stale_entries_skipped():
    k, rv, clock = keeper_with()
    k.granted(1, 3)
    for _ in range(5):
        k.renew(1)
    k.revoked(1)
    clock.advance(100)
    assert k.expire_due() == []
    assert k.next_deadline() is None and k.heap_size == 0


def test_regrant_of_same_id_is_not_confused_with_old_entries():
    k, rv, clock = keeper_with()
    k.granted(9, 2)
    k.revoked(9)
    clock.advance(1)
    k.granted(9, 5)
    clock.advance(2)  # the first grant's deadline passed
    assert k.expire_due() == []
    clock.advance(3)
    assert k.expire_due() == [9]


def test_revoke_failure_is_retried_after_the_retry_interval():
    k, rv, clock = keeper_with(retry_interval=7.0)
    k.granted(1, 2)
    clock.advance(2)
    assert k.expire_due() == [1]
    rv.futures[1].set_exception(errors.ErrStopped)
    assert 1 in k
    clock.advance(6.9)
    assert k.expire_due() == []
    clock.advance(0.2)
    assert k.expire_due() == [1]
    assert rv.calls == [1, 1]


def test_revoke_answered_not_found_forgets_the_lease():
    k, rv, clock = keeper_with()
    k.granted(1, 2)
    clock.advance(3)
    k.expire_due()
    rv.futures[1].set_exception(errors.ErrLeaseNotFound)
    assert 1 not in k
    clock.advance(100)
    assert k.expire_due() == []


def test_inflight_limit_bounds_outstanding_revokes():
    k, rv, clock = keeper_with(max_inflight=10)
    for i in range(1, 26):
        k.granted(i, 2)
    clock.advance(2)
    first = k.expire_due()
    assert len(first) == 10 and k.expire_due() == []
    for i in first[:4]:
        commit_revoke(k, rv, i)
    assert len(k.expire_due()) == 4
    for i in list(rv.futures):
        if not rv.futures[i].done():
            commit_revoke(k, rv, i)
    assert len(k.expire_due()) == 10
    assert len(k.expire_due()) == 0
    for i in list(rv.futures):
        if not rv.futures[i].done():
            commit_revoke(k, rv, i)
    assert len(k.expire_due()) == 1
    assert sorted(rv.calls) == list(range(1, 26))


def test_keepalive_on_an_expired_lease_waits_for_the_revoke_then_not_found():
    k, rv, clock = keeper_with()
    k.granted(1, 2)
    clock.advance(2)
    out = []

    def renew():
        try:
            out.append(k.renew(1))
        except errors.EtcdError as e:
            out.append(e)

    t = threading.Thread(target=renew)
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # waiting for the revoke, like etcd
    assert k.expire_due() == [1]
    commit_revoke(k, rv, 1)
    t.join(5)
    assert out == [errors.ErrLeaseNotFound]


def test_keepalive_on_an_expired_lease_times_out_if_never_revoked():
    k, rv, clock = keeper_with(renew_wait=0.05)
    k.granted(1, 2)
    clock.advance(5)
    with pytest.raises(errors.EtcdError) as e:
        k.renew(1)
    assert e.value == errors.ErrTimeout


def test_remaining_goes_negative_once_expired_and_ids_by_expiry():
    k, rv, clock = keeper_with()
    k.granted(30, 30)
    k.granted(10, 10)
    k.granted(20, 20)
    assert k.ids_by_expiry() == [10, 20, 30]
    clock.advance(10.5)
    assert k.remaining(10)[0] == pytest.approx(-0.5)
    k.renew(20)  # now expires at 30.5 > 30's 30
    assert k.ids_by_expiry() == [10, 30, 20]


def test_on_commit_tracks_grants_and_revokes_and_ignores_failures():
    k, rv, clock = keeper_with()
    k.on_commit(
        [LeaseGrantRequest(5, 1), LeaseGrantRequest(5, 2), PutRequest(b"k"), LeaseRevokeRequest(3)],
        [LeaseGrantResult(1, 1, 5), errors.ErrLeaseExist, object(), errors.ErrLeaseNotFound],
    )
    assert 1 in k and 2 not in k and len(k) == 1
    k.on_commit([LeaseRevokeRequest(1)], [LeaseRevokeResult(3)])
    assert len(k) == 0


def test_heap_stays_bounded_under_many_keepalives():
    k, rv, clock = keeper_with()
    for i in range(1, 101):
        k.granted(i, 60)
    for _ in range(200):
        for i in range(1, 101):
            k.renew(i)
        clock.advance(0.1)
    assert k.heap_size <= 2 * 100 + 1024 + 1
    clock.advance(61)
    assert sorted(k.expire_due()) == list(range(1, 101))


def test_restore_gives_full_ttl_plus_extension():
    k, rv, clock = keeper_with()
    k.restore([(1, 10), (2, 60)])
    assert k.remaining(1) == (10 + RECOVERY_EXTEND_SECONDS, 10)
    assert k.remaining(2) == (60 + RECOVERY_EXTEND_SECONDS, 60)
    clock.advance(10 + RECOVERY_EXTEND_SECONDS)
    assert k.expire_due() == [1]


def test_restore_spreads_a_pile_of_simultaneous_expiries():
    k, rv, clock = keeper_with(max_inflight=10**6)
    n = 5000
    k.restore([(i, 10) for i in range(1, n + 1)], revoke_rate=1000)
    # at most 3/4 of the revoke rate per second, the first window unchanged
    per_second: dict[int, int] = {}
    for i in range(1, n + 1):
        left, _ = k.remaining(i)
        per_second[int(left)] = per_second.get(int(left), 0) + 1
    assert per_second[11] == 750  # the first window keeps its deadline
    assert max(per_second.values()) <= 750 + 1
    assert max(per_second) <= 11 + n // 750 + 1  # about n / 750 seconds in all
    clock.advance(11.0)
    assert len(k.expire_due()) == 750


def test_expiry_thread_revokes_on_time():
    revoked = []
    done = threading.Event()

    def revoke(lease_id):
        f: Future = Future()
        revoked.append((lease_id, time.monotonic()))
        keeper.revoked(lease_id)
        f.set_result(None)
        if len(revoked) == 3:
            done.set()
        return f

    keeper = LeaseKeeper(revoke)
    keeper.start()
    try:
        start = time.monotonic()
        keeper.granted(1, 0.3)
        keeper.granted(2, 0.1)  # earlier than the thread's current wait: it is woken
        keeper.granted(3, 0.2)
        assert done.wait(5)
        assert [i for i, _ in revoked] == [2, 3, 1]
        for (i, at), ttl in zip(revoked, (0.1, 0.2, 0.3)):
            assert at - start >= ttl
    finally:
        keeper.stop()


# ---------------------------------------------------------------------------
# 100k leases: bookkeeping cost (printed, not asserted)


def test_100k_leases_grant_keepalive_expiry_bookkeeping(capsys):
    n = 100_000
    done: Future = Future()
    done.set_result(None)  # the revoke itself is the engine's cost, not measured here
    clock = FakeClock()
    k = LeaseKeeper(lambda lease_id: done, clock=clock, max_inflight=n)
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        k.granted(i, 10 + i % 50)
    t1 = time.perf_counter()
    for i in range(1, n + 1):
        k.renew(i)
    t2 = time.perf_counter()
    heap_peak = k.heap_size
    order = k.ids_by_expiry()
    t3 = time.perf_counter()
    clock.advance(100)
    due = k.expire_due()
    t4 = time.perf_counter()
    k.on_commit([LeaseRevokeRequest(i) for i in due], [LeaseRevokeResult(1)] * len(due))
    t5 = time.perf_counter()
    assert len(order) == n and sorted(due) == list(range(1, n + 1)) and len(k) == 0
    with capsys.disabled():
        print(f"\n100k leases (keeper): grant {(t1 - t0) / n * 1e6:.2f} us, keepalive {(t2 - t1) / n * 1e6:.2f} us, "
              f"list by expiry {(t3 - t2) * 1e3:.0f} ms, find expired {(t4 - t3) / n * 1e6:.2f} us/lease, "
              f"forget {(t5 - t4) / n * 1e6:.2f} us/lease; heap {heap_peak} entries after one keepalive each")


def test_100k_leases_through_the_engine(tmp_path, capsys):
    """Grant 100k leases through the write path, keep each alive once, let
    them all expire (fake clock) and check every one is revoked."""
    n = 100_000
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[]))
    try:
        clock = FakeClock(time.monotonic())
        eng.committer.role.keeper._clock = clock
        t0 = time.perf_counter()
        # at most etcd's 5000 in flight: beyond, a client's write is refused (brain.engine.limits)
        for start in range(1, n + 1, MAX_PENDING_WRITES):
            futs = [eng.submit(LeaseGrantRequest(60, i)) for i in range(start, min(start + MAX_PENDING_WRITES, n + 1))]
            for f in futs:
                f.result()
        t1 = time.perf_counter()
        for i in range(1, n + 1):
            assert eng.lease_keepalive(i) == 60
        t2 = time.perf_counter()
        assert len(eng.lease_leases().ids) == n
        t3 = time.perf_counter()
        rev = eng.committed_rev
        clock.advance(61)
        with eng.committer.role.keeper._cv:
            eng.committer.role.keeper._cv.notify()
        deadline = time.monotonic() + 60
        while len(eng.committer.role.keeper) and time.monotonic() < deadline:
            eng.committer.role.keeper.expire_due()
            time.sleep(0.01)
        t4 = time.perf_counter()
        assert len(eng.store.lessor) == 0 and len(eng.committer.role.keeper) == 0
        assert eng.committed_rev == rev  # no keys: revokes make no revision
        with capsys.disabled():
            print(f"\n100k leases (engine): grant {(t1 - t0):.2f} s total, keepalive {(t2 - t1) / n * 1e6:.2f} us, "
                  f"LeaseLeases {(t3 - t2) * 1e3:.0f} ms, expire+revoke all {(t4 - t3):.2f} s, "
                  f"batches {eng.statistics().batches}")
    finally:
        eng.close()


# ---------------------------------------------------------------------------
# the Engine


@pytest.fixture(params=[1, 3], ids=["1shard", "3shards"])
def config(request, tmp_path):
    boundaries = [] if request.param == 1 else [b"f", b"p"]
    return EngineConfig(str(tmp_path / "data"), shards=request.param, shard_boundaries=boundaries)


def crash(eng: Engine) -> None:
    """Drop an engine without a checkpoint (as kill -9 would)."""
    eng.close(checkpoint=False)


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_grant_rules(config):
    eng = Engine.open(config)
    try:
        r = eng.lease_grant(LeaseGrantRequest(ttl=1))
        assert r.ttl == 2 and 0 < r.id < 2**63 and r.revision == 1
        assert eng.lease_grant(LeaseGrantRequest(ttl=0)).ttl == 2
        assert eng.lease_grant(LeaseGrantRequest(ttl=-5)).ttl == 2
        assert eng.lease_grant(LeaseGrantRequest(ttl=MAX_LEASE_TTL)).ttl == MAX_LEASE_TTL
        with pytest.raises(errors.EtcdError) as e:
            eng.lease_grant(LeaseGrantRequest(ttl=MAX_LEASE_TTL + 1))
        assert e.value == errors.ErrLeaseTTLTooLarge
        assert eng.lease_grant(LeaseGrantRequest(ttl=10, id=77)).id == 77
        with pytest.raises(errors.EtcdError) as e:
            eng.lease_grant(LeaseGrantRequest(ttl=10, id=77))
        assert e.value == errors.ErrLeaseExist
        with pytest.raises(errors.EtcdError) as e:  # the TTL is checked first, as in etcd
            eng.lease_grant(LeaseGrantRequest(ttl=MAX_LEASE_TTL + 1, id=77))
        assert e.value == errors.ErrLeaseTTLTooLarge
        assert eng.lease_grant(LeaseGrantRequest(ttl=10, id=-5)).id == -5
        ids = {eng.lease_grant(LeaseGrantRequest(ttl=30)).id for _ in range(50)}
        assert len(ids) == 50 and all(i > 0 for i in ids)
    finally:
        eng.close()


def test_server_chosen_id_skips_existing_leases(config):
    eng = Engine.open(config)
    try:
        # occupy the next two ids the generator would hand out
        probe = IdGenerator(eng.member_id)
        probe._suffix = eng._lease_ids._suffix
        a, b = probe.next(), probe.next()
        eng.lease_grant(LeaseGrantRequest(30, a))
        eng.lease_grant(LeaseGrantRequest(30, b))
        r = eng.lease_grant(LeaseGrantRequest(30))
        assert r.id not in (a, b, 0)
    finally:
        eng.close()


def test_time_to_live_keys_and_leases(config):
    eng = Engine.open(config)
    try:
        eng.lease_grant(LeaseGrantRequest(10, 1))
        eng.lease_grant(LeaseGrantRequest(30, 2))
        eng.put(PutRequest(b"z", b"1", lease=1))
        eng.put(PutRequest(b"a", b"1", lease=1))
        eng.put(PutRequest(b"m", b"1", lease=2))
        r = eng.lease_time_to_live(1, keys=True)
        assert (r.id, r.ttl, r.granted_ttl, r.keys, r.revision) == (1, 9, 10, [b"a", b"z"], 4)
        assert eng.lease_time_to_live(1).keys == []
        eng.put(PutRequest(b"a", b"2"))  # moved off the lease
        assert eng.lease_time_to_live(1, keys=True).keys == [b"z"]
        with pytest.raises(errors.EtcdError) as e:
            eng.lease_time_to_live(3)
        assert e.value == errors.ErrLeaseNotFound
        assert eng.lease_leases().ids == [1, 2]
        assert eng.lease_keepalive(1) == 10
        with pytest.raises(errors.EtcdError) as e:
            eng.lease_keepalive(3)
        assert e.value == errors.ErrLeaseNotFound
    finally:
        eng.close()


def test_revoke_deletes_keys_in_one_revision(config):
    eng = Engine.open(config)
    try:
        eng.lease_grant(LeaseGrantRequest(60, 5))
        for k in (b"q", b"b", b"x", b"g"):
            eng.put(PutRequest(k, b"v", lease=5))
        eng.put(PutRequest(b"other", b"v"))
        rev = eng.committed_rev
        r = eng.lease_revoke(LeaseRevokeRequest(5))
        assert r.revision == rev + 1 == eng.committed_rev
        assert [kv.key for kv in eng.range(RangeRequest(b"\0", b"\0")).kvs] == [b"other"]
        assert len(eng.range(RangeRequest(b"\0", b"\0", revision=rev)).kvs) == 5
        assert eng.lease_leases().ids == []
        with pytest.raises(errors.EtcdError):
            eng.lease_time_to_live(5)
        # a lease without keys: revoking it makes no revision
        eng.lease_grant(LeaseGrantRequest(60, 6))
        assert eng.lease_revoke(LeaseRevokeRequest(6)).revision == rev + 1
    finally:
        eng.close()


def test_expiry_deletes_keys_in_one_revision(config):
    eng = Engine.open(config)
    try:
        clock = FakeClock(time.monotonic())
        eng.committer.role.keeper._clock = clock
        eng.lease_grant(LeaseGrantRequest(5, 1))
        eng.lease_grant(LeaseGrantRequest(50, 2))
        for k in (b"a", b"n", b"z"):
            eng.put(PutRequest(k, b"v", lease=1))
        eng.put(PutRequest(b"keep", b"v", lease=2))
        rev = eng.committed_rev
        clock.advance(4)
        eng.committer.role.keeper.expire_due()
        assert eng.committed_rev == rev
        clock.advance(1)
        eng.committer.role.keeper.expire_due()
        assert wait_for(lambda: eng.committed_rev == rev + 1)
        assert [kv.key for kv in eng.range(RangeRequest(b"\0", b"\0")).kvs] == [b"keep"]
        assert eng.lease_leases().ids == [2]
        assert eng.statistics().leases_expired == 1  # etcd_debugging_server_lease_expired_total
        with pytest.raises(errors.EtcdError) as e:
            eng.lease_keepalive(1)
        assert e.value == errors.ErrLeaseNotFound
    finally:
        eng.close()


def test_expiry_on_the_real_clock(config):
    eng = Engine.open(config)
    try:
        r = eng.lease_grant(LeaseGrantRequest(1))  # raised to 2 s
        eng.put(PutRequest(b"e1", b"v", lease=r.id))
        eng.put(PutRequest(b"e2", b"v", lease=r.id))
        t0 = time.monotonic()
        assert wait_for(lambda: not eng.range(RangeRequest(b"e", b"f")).kvs, timeout=10)
        took = time.monotonic() - t0
        assert 1.5 < took < 4.0
        assert eng.committed_rev == 4
    finally:
        eng.close()


def test_put_on_an_expired_but_not_yet_revoked_lease_is_accepted_then_deleted(config):
    """etcd accepts it (the lease exists until its revoke applies); the key
    goes with the revoke."""
    eng = Engine.open(config)
    gate = threading.Event()
    submit = eng.committer.role.keeper._revoke

    def gated(lease_id):
        gate.wait(10)
        return submit(lease_id)

    eng.committer.role.keeper._revoke = gated
    try:
        clock = FakeClock(time.monotonic())
        eng.committer.role.keeper._clock = clock
        eng.lease_grant(LeaseGrantRequest(2, 1))
        clock.advance(3)
        threading.Thread(target=eng.committer.role.keeper.expire_due, daemon=True).start()
        assert eng.put(PutRequest(b"late", b"v", lease=1)).revision == 2
        assert eng.lease_time_to_live(1).ttl == -1  # 3 s after a 2 s grant
        gate.set()
        assert wait_for(lambda: not eng.range(RangeRequest(b"late")).kvs)
        assert eng.committed_rev == 3
    finally:
        gate.set()
        eng.close()


def test_leases_survive_close_and_get_their_ttl_again(config):
    eng = Engine.open(config)
    eng.lease_grant(LeaseGrantRequest(30, 1))
    eng.lease_grant(LeaseGrantRequest(100, 2))
    eng.put(PutRequest(b"k", b"v", lease=1))
    eng.close()
    eng = Engine.open(config)
    try:
        r = eng.lease_time_to_live(1, keys=True)
        assert r.granted_ttl == 30 and r.ttl in (30, 29) and r.keys == [b"k"]
        left, _ = eng.committer.role.keeper.remaining(1)
        assert 30 < left <= 30 + RECOVERY_EXTEND_SECONDS
        assert eng.lease_leases().ids == [1, 2]
        assert eng.range(RangeRequest(b"k")).kvs[0].lease == 1
    finally:
        eng.close()


def test_leases_survive_a_crash_from_journal_and_from_checkpoint(config):
    eng = Engine.open(config)
    eng.lease_grant(LeaseGrantRequest(40, 1))
    eng.put(PutRequest(b"a", b"v", lease=1))
    eng.checkpoint()
    eng.lease_grant(LeaseGrantRequest(40, 2))  # only in the journal
    eng.put(PutRequest(b"b", b"v", lease=2))
    eng.lease_grant(LeaseGrantRequest(40, 3))
    eng.lease_revoke(LeaseRevokeRequest(3))
    crash(eng)
    eng = Engine.open(config)
    try:
        assert sorted(eng.lease_leases().ids) == [1, 2]
        assert eng.lease_time_to_live(1, keys=True).keys == [b"a"]
        assert eng.lease_time_to_live(2, keys=True).keys == [b"b"]
        # and they still expire
        clock = FakeClock(time.monotonic())
        eng.committer.role.keeper._clock = clock
        clock.advance(41 + RECOVERY_EXTEND_SECONDS)
        eng.committer.role.keeper.expire_due()
        assert wait_for(lambda: not eng.range(RangeRequest(b"\0", b"\0")).kvs)
        assert eng.lease_leases().ids == []
    finally:
        eng.close()
    eng = Engine.open(config)
    try:
        assert eng.lease_leases().ids == [] and not eng.range(RangeRequest(b"\0", b"\0")).kvs
    finally:
        eng.close()


def test_keepalive_on_a_leader_role_that_stepped_down_is_refused(config):
    """A keep-alive that picked up the Leader role just before a step-down
    renews on that role's stopped keeper: it must be refused (ErrNotLeader,
    as a follower answers a renewal it cannot make), never acknowledged."""
    eng = Engine.open(config)
    try:
        eng.lease_grant(LeaseGrantRequest(30, 1))
        stale = eng.committer.role
        stale.stop(wait=True)  # what stepping down does to the role it gives up
        with pytest.raises(errors.EtcdError) as e:
            stale.lease_keepalive(1)
        assert e.value == errors.ErrNotLeader
        assert stale.renew_leases([1]) == [(1, errors.ErrNotLeader)]
        answers: list = []
        stale.lease_keepalive_many([1], answers.extend)
        assert answers == [(1, errors.ErrNotLeader)]
    finally:
        eng.close()


def test_keepalive_after_close_is_refused(config):
    eng = Engine.open(config)
    eng.lease_grant(LeaseGrantRequest(30, 1))
    eng.close()
    with pytest.raises(errors.EtcdError) as e:
        eng.lease_grant(LeaseGrantRequest(30, 2))
    assert e.value == errors.ErrStopped
