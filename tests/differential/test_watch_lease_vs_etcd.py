"""Watch and Lease differential tests: etcd (3.4, 3.6.16 and 3.7.3) and brain driven
in lockstep through seeded sequences of KV writes, compactions, Watch stream
actions (creates of every kind, cancels, RequestProgress) and Lease calls,
plus a lease expiry phase.  See watch_harness.py / watch_compare.py for what
is compared and WATCH_LEASE_BEHAVIOUR.md for the observed etcd behaviour and
the deliberate exclusions.

    pytest tests/differential/test_watch_lease_vs_etcd.py -s
    DIFF_WATCH_SEEDS=2,3,10 DIFF_WATCH_OPS=200 BRAIN_TEST_SHARDS=1,4,8 pytest ...
    DIFF_WATCH_AVOID=negative_start,...   # leave out features (see watch_run --help)

Every run (etcd vs etcd and each brain vs etcd seed) must cover EXPECTED and
EXPECTED_TAGS, so a generator or harness change cannot quietly stop testing
something; the default seeds were picked so that each covers them in 200 ops
against every version.  The third oracle (3.7) runs two of the three seeds
by default (SEEDS_BY_VERSION) and on the plain listener only, to keep the
suite's time bounded (about 100 s); DIFF_WATCH_SEEDS applies to every
version.  Reproduce a failure with the command printed in its
report (python -m tests.differential.watch_run --seed S --ops N [--shards K]
[--etcd-version 3.6]).
"""

from __future__ import annotations

import os

import pytest

from tests.differential import harness
from tests.differential.watch_generator import AVOIDABLE
from tests.differential.watch_harness import run_watch_differential
from tests.support import servers as _servers
from tests.support.etcd_tools import ORACLE_VERSIONS

pytestmark = pytest.mark.etcd

DEFAULT_SEEDS = "2,3,10"
DEFAULT_OPS = 200  # x 3 seeds = 600 ops (+ 3 expiry phases) per etcd version and shard setting
SELF_CHECK_SEED = 2  # re-pick if the generator changes: it must cover EXPECTED
SELF_CHECK_OPS = 250

# What every run must exercise (guards against the generator silently losing
# coverage).  (kind.method, outcome prefix)
EXPECTED = [
    ("create.Create", "created (single key"),
    ("create.Create", "created (prefix"),
    ("create.Create", "created (from key"),
    ("create.Create", "rejected: mvcc: duplicate watch ID provided on the WatchStream"),
    ("create.Create", "rejected: mvcc: watcher range is empty"),
    ("cancel.Cancel", "answered (registered id)"),
    ("cancel.Cancel", "no answer (unknown id)"),
    ("progress.Progress", "answered"),
    ("kv.Compact", "ok"),
    ("kv.Txn", "ok"),
    ("kv.DeleteRange", "ok"),
    ("lease.LeaseGrant", "ok (server-chosen id)"),
    ("lease.LeaseGrant", "ok (client id"),
    ("lease.LeaseGrant", "OUT_OF_RANGE: etcdserver: too large lease TTL"),
    ("lease.LeaseRevoke", "ok"),
    ("lease.LeaseRevoke", "NOT_FOUND: etcdserver: requested lease not found"),
    ("lease.LeaseTimeToLive", "ok"),
    ("lease.LeaseLeases", "ok"),
    ("lease.LeaseKeepAlive", "ok"),
]
EXPECTED_TAGS = ["start=historical", "start=current", "start=future", "start=compaction revision",
                 "start=0", "prev_kv"]


# Default seeds per oracle where they differ from DEFAULT_SEEDS.
SEEDS_BY_VERSION = {"3.7": "2,10"}


def _seeds(version: str = "3.4") -> list[int]:
    raw = os.environ.get("DIFF_WATCH_SEEDS", SEEDS_BY_VERSION.get(version, DEFAULT_SEEDS))
    return [int(s) for s in raw.replace(" ", "").split(",") if s]


def _ops() -> int:
    return int(os.environ.get("DIFF_WATCH_OPS", DEFAULT_OPS))


# Left out by default, per etcd version (WATCH_LEASE_BEHAVIOUR.md):
# - negative_start: etcd 3.4 mishandles a negative start_revision (its sync
#   loop reads history from the revision as an unsigned number, and every
#   other watcher caught up in the same sync batch silently loses its history
#   too; watch_run --seed 10 --ops 40); etcd 3.6.16 refuses the create
#   (created + canceled, "etcdserver: mvcc: required revision has been
#   compacted") where brain creates the watcher as 3.4 does: a difference
#   reported, not fixed here.
# - unanswered_progress (3.6 and 3.7): etcd 3.6.16 drops a RequestProgress on a
#   stream that has no watcher or one that is not synced; brain answers it
#   (at once, or once every watcher is synced).  etcd 3.7.3 behaves as 3.6.16 here.
# - fast_keys_only (3.4 and 3.6): brain behaves as etcd 3.7.3
#   (brain/etcd_version.py), which answers a keys_only range that is not
#   sorted by value from its key index and leaves out the keys' lease; etcd
#   3.4 and 3.6 read the records and return it (watch_run --seed 2 --ops 113
#   --etcd-version 3.6 --avoid negative_start,unanswered_progress shows the
#   difference).  Against 3.7 it is compared.
# `DIFF_WATCH_AVOID=` (empty) puts everything back.
DEFAULT_AVOID = {"3.4": "negative_start,fast_keys_only", "3.6": "negative_start,unanswered_progress,fast_keys_only",
                 "3.7": "negative_start,unanswered_progress"}


def _avoid(version: str) -> tuple[str, ...]:
    raw = os.environ.get("DIFF_WATCH_AVOID", DEFAULT_AVOID[version])
    avoid = tuple(a for a in raw.replace(" ", "").split(",") if a)
    unknown = [a for a in avoid if a not in AVOIDABLE]
    assert not unknown, f"DIFF_WATCH_AVOID: unknown {unknown}; known {sorted(AVOIDABLE)}"
    return avoid


def _repro_version(version: str) -> str:
    return "" if version == "3.4" else f" --etcd-version {version}"


def _record(res, label):
    # tests/conftest.py prints harness.RESULTS totals at the end of the session
    res.label = label
    harness.RESULTS.append(res)
    print(res.summary())


def assert_covered(res, min_events: int) -> None:
    """The run exercised everything in EXPECTED and EXPECTED_TAGS, compared
    at least ``min_events`` watch events and 3 progress responses, and ran
    the lease expiry phase."""
    seen = list(res.outcomes)
    missing = [(k, o) for k, o in EXPECTED if not any(k == sk and so.startswith(o) for sk, so in seen)]
    assert not missing, f"the run no longer covers: {missing}\n{res.summary()}"
    tags = [t for t in EXPECTED_TAGS if not any(t in so for _, so in seen)]
    assert not tags, f"the run no longer covers: {tags}\n{res.summary()}"
    c = res.counts
    assert c["events"] >= min_events and c["progress"] >= 3 and c["expiry phases"] == 1, res.summary()


versions = pytest.mark.parametrize("etcd_version", ORACLE_VERSIONS, ids=lambda v: f"etcd{v}")
SELF_CHECK_VERSIONS = ORACLE_VERSIONS if os.environ.get("DIFF_OPS") else ["3.7"]


@pytest.mark.parametrize("etcd_version", SELF_CHECK_VERSIONS, ids=lambda v: f"etcd{v}")
def test_watch_lease_etcd_vs_etcd_self_check(etcd_version, oracle_factory):
    """Two etcds agree under the harness (it is deterministic and its
    normalisation is sound), and the stream covers what it should.  On
    etcd 3.7, the version brain behaves as (brain/etcd_version.py); on every
    oracle version with DIFF_OPS set (``make test-full``)."""
    a, b = oracle_factory(etcd_version), oracle_factory(etcd_version)
    res = run_watch_differential(a.endpoint, b.endpoint, SELF_CHECK_SEED, SELF_CHECK_OPS,
                                 labels=("etcd", "etcd#2"), avoid=_avoid(etcd_version),
                                 repro_extra=" --brain etcd" + _repro_version(etcd_version))
    _record(res, f"watch+lease etcd {etcd_version} vs etcd {etcd_version}")
    assert res.diff is None, res.diff.report()
    assert res.ops_done == SELF_CHECK_OPS
    assert_covered(res, min_events=100)


def _drop_third_event(resp):
    """Tamper: drop the last event of the 3rd response carrying events."""
    _drop_third_event.seen = getattr(_drop_third_event, "seen", 0) + (1 if resp.events else 0)
    if resp.events and _drop_third_event.seen == 3:
        del resp.events[-1]
    return resp


def _bump_prev_kv(resp):
    """Tamper: change the first prev_kv seen."""
    for ev in resp.events:
        if ev.HasField("prev_kv") and not getattr(_bump_prev_kv, "done", False):
            ev.prev_kv.version += 1
            _bump_prev_kv.done = True
    return resp


@pytest.mark.parametrize("tamper", [_drop_third_event, _bump_prev_kv], ids=lambda f: f.__name__)
def test_watch_harness_detects_differences(oracle_factory, tamper):
    """The comparison is not vacuous: a corrupted watch response from the
    second etcd is reported as a watch stream difference."""
    for attr in ("seen", "done"):
        if hasattr(tamper, attr):
            delattr(tamper, attr)
    a, b = oracle_factory(), oracle_factory()
    res = run_watch_differential(a.endpoint, b.endpoint, SELF_CHECK_SEED, SELF_CHECK_OPS,
                                 labels=("etcd", "tampered"), expiry=False,
                                 other_response_filter=tamper)
    assert res.diff is not None, "tampering went unnoticed:\n" + res.summary()
    report = res.diff.report()
    assert "watch stream" in res.diff.where and "reproduce:" in report, report


def pytest_generate_tests(metafunc):
    """Per etcd version, every seed of that version on the plain listener (1
    and 4 shards) and one seed on each other listener kind (mutual TLS,
    unix): the differential checks what brain answers, which the transport
    only carries (its own suites run on every kind).  The third oracle (3.7)
    runs on the plain listener only: the other kinds are brain's transport,
    the same whichever etcd it is compared with."""
    if metafunc.function.__name__ != "test_brain_watch_lease_matches_etcd":
        return
    cases = []
    for setting in _servers.server_settings_from_env():
        for version in ORACLE_VERSIONS:
            seeds = _seeds(version)
            if setting[1] != "http":
                seeds = [] if version in SEEDS_BY_VERSION else seeds[1:2] or seeds
            cases += [(setting, seed, version) for seed in seeds]
    metafunc.parametrize(("brain", "seed", "etcd_version"), cases, indirect=["brain"],
                         ids=[f"{_servers.setting_id(st)}-seed{seed}-etcd{v}" for st, seed, v in cases])


@pytest.fixture
def brain(request):
    """brain_server (tests/conftest.py) with the setting given per case."""
    yield from _servers.serving_brain(request.param)


def test_brain_watch_lease_matches_etcd(etcd_version, seed, brain, oracle_factory):
    brain_server = brain
    etcd = oracle_factory(etcd_version)
    shards = brain_server.shards
    extra = (f" --shards {shards}" if shards != 1 else "") + _repro_version(etcd_version)
    res = run_watch_differential(etcd.endpoint, brain_server.endpoint, seed, _ops(),
                                 labels=("etcd", "brain"), avoid=_avoid(etcd_version), repro_extra=extra)
    _record(res, f"watch+lease brain shards={shards} vs etcd {etcd_version}")
    c = res.counts
    print(f"{res.ops_done} operations; compared {c['unary']} unary answers, {c['events']} watch events, "
          f"{c['controls']} control responses, {c['progress']} progress responses, "
          f"{c['expiry phases']} expiry phase(s) (seed {seed}, shards={shards}, etcd {etcd_version})")
    assert res.diff is None, res.diff.report()
    assert res.ops_done == _ops()
    assert_covered(res, min_events=40)
