"""brain.progress: the lines long operations print (rate, time left)."""

from __future__ import annotations

from brain.progress import Progress, human_bytes, human_seconds


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_rate_and_time_left():
    clock, lines = Clock(), []
    p = Progress("import", unit="revisions", total_bytes=1_000_000, out=lines.append, interval=2.0, clock=clock)
    p.update(10, 1000)
    assert lines == []  # not before the interval
    clock.t += 2.0
    p.update(40_000, 250_000)
    assert lines == ["import: 40,000 revisions, 250.0 kB of 1.0 MB (25%), 125.0 kB/s, 20,000 revisions/s, 6s left"]
    clock.t += 6.0
    p.bytes = 1_000_000
    p.items = 160_000
    assert p.done("revision 5") == 8.0
    assert lines[-1] == ("import: done: 160,000 revisions, 1.0 MB in 8.0s (125.0 kB/s, 20,000 revisions/s); "
                         "revision 5")


def test_bytes_only_and_item_totals():
    clock, lines = Clock(), []
    p = Progress("snapshot save", unit=None, out=lines.append, clock=clock)
    clock.t += 4
    p.update(nbytes=2_000_000, force=True)
    assert lines == ["snapshot save: 2.0 MB, 500.0 kB/s"]
    q = Progress("export", unit="revisions", total_items=100, out=lines.append, clock=clock)
    clock.t += 1
    q.update(25, force=True)
    assert lines[-1] == "export: 25 of 100 revisions, 25 revisions/s, 3s left"


def test_human_units():
    assert human_bytes(999) == "999 B" and human_bytes(165_208_064) == "165.2 MB"
    assert human_seconds(59.4) == "59s" and human_seconds(61) == "1m01s" and human_seconds(7322) == "2h02m"


def test_human_bytes_rounds_half_up_to_a_tenth_as_etcds_tools_do():
    # 1.15 and 2.25 are halves: up, whatever their binary fraction says
    assert human_bytes(1150) == "1.2 kB" and human_bytes(2250) == "2.3 kB"
    assert human_bytes(2249) == "2.2 kB" and human_bytes(999_949) == "999.9 kB"
    assert human_bytes(1_000_000) == "1.0 MB" and human_bytes(9.5) == "10 B"
    # etcdctl's `snapshot status` (go-humanize's Bytes): the tenth only below 10
    assert human_bytes(165_208_064, etcdctl=True) == "165 MB"
    assert human_bytes(9_949, etcdctl=True) == "9.9 kB" and human_bytes(9_950, etcdctl=True) == "10 kB"
    assert human_bytes(7, etcdctl=True) == "7 B" and human_bytes(2250, etcdctl=True) == "2.3 kB"
