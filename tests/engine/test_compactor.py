import pytest

from brain.engine.compactor import PeriodicPlanner, parse_retention


def test_parse_retention_like_etcd():
    assert parse_retention("periodic", "1") == 3600
    assert parse_retention("periodic", "0") == 0
    assert parse_retention("periodic", "5m") == 300
    assert parse_retention("periodic", "1h30m") == 5400
    assert parse_retention("periodic", "500ms") == 0.5
    assert parse_retention("periodic", ".5h") == 1800  # Go's grammar (brain/go_duration.py)
    assert parse_retention("periodic", "1μs") == 1e-6
    assert parse_retention("revision", "1000") == 1000
    for bad in ("", "5x", "m5", "1h x", "-1h"):
        with pytest.raises(ValueError):
            parse_retention("periodic", bad)
    with pytest.raises(ValueError):
        parse_retention("weekly", "1")


def test_periodic_compacts_to_the_revision_one_period_ago():
    p = PeriodicPlanner(period=100.0, now=0.0)  # samples every 10 s
    assert p.tick == 10.0
    t = 0.0
    rev = 1
    compacted = []
    for _ in range(40):
        p.sample(rev)
        t += p.tick
        rev += 7  # 7 revisions per tick
        due = p.due(t)
        if due is not None:
            compacted.append((t, due))
            p.done(due, t)
    # First compaction once a full period has passed, at the revision current a period earlier.
    first_t, first_rev = compacted[0]
    assert first_t == 100.0 and first_rev == 1
    # Then every period (min(period, 1h)), each time to the revision one window back.
    assert [t for t, _ in compacted[:3]] == [100.0, 200.0, 300.0]
    # The window holds period/tick + 1 samples: the oldest was taken one period
    # before the newest sample (t=190), i.e. at t=90.
    assert compacted[1][1] == 1 + 7 * 9
