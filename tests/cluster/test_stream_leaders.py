"""The election bucket's stream leader, apart from the journal's, and the
death of the nats-server that leads it.

- brain's leader moves the bucket's stream lead off the server that also
  leads the journal (brain.cluster.placement), so one nats-server's death
  takes at most one of the two leaders;
- kill -9 of the nats-server leading the bucket (not the journal): the brain
  leader cannot renew its key until NATS elects the bucket a new leader (4-9
  s), but the journal still acknowledges its appends, so it leads on
  (brain.cluster.election): the same leader, the same epoch, writes going
  on, nothing lost; once the bucket answers again the key is renewed (or
  written again, it having expired meanwhile).  Before, the brain leader
  stepped down once the key's TTL (2 s) had passed and nobody could take the
  key until the bucket had a leader: a pause of the TTL plus NATS's election.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from tests.support import clustercheck
from tests.support.brain_cluster import BrainCluster

JOURNAL = "{name}_journal"
BUCKET = "KV_{name}_leader"
# The writer's pause across the bucket leader's death, generous for a loaded
# machine; stepping down instead costs the key's TTL (2 s) plus NATS's own
# election of the bucket (4-9 s).
PAUSE_BOUND = 1.5


def _streams(cluster) -> tuple[str, str]:
    return JOURNAL.format(name=cluster.name), BUCKET.format(name=cluster.name)


def _wait_apart(nats, journal: str, bucket: str, within: float):
    """Wait until both streams have leaders on different servers; those two."""
    deadline = time.monotonic() + within
    while True:
        j, b = nats.stream_leader(journal), nats.stream_leader(bucket)
        if j is not None and b is not None and j is not b:
            return j, b
        assert time.monotonic() < deadline, f"{journal} led by {j}, {bucket} by {b} after {within:.0f} s"
        time.sleep(0.2)


def _log_has(member, text: str) -> bool:
    return text in member.log_path.read_text(errors="replace")


@dataclass
class Apart:
    nats: object
    cluster: BrainCluster
    lead: object  # the brain leader
    journal: str
    bucket: str
    journal_leader: object  # nats nodes
    bucket_leader: object


@pytest.fixture
def apart(nats_cluster_factory):
    """A brain cluster of 3 on 3 nats-servers, once its two streams are led
    from different servers."""
    nats = nats_cluster_factory(3, sync_always=True)
    cluster = BrainCluster(3, nats, lifetime=300.0)
    cluster.start()
    try:
        lead = cluster.wait_leader()
        journal, bucket = _streams(cluster)
        j, b = _wait_apart(nats, journal, bucket, within=30)
        yield Apart(nats, cluster, lead, journal, bucket, j, b)
    finally:
        cluster.cleanup()


def test_the_bucket_is_led_apart_from_the_journal_and_an_idle_leader_rides_out_its_death(apart):
    nats, cluster, lead, journal, bucket, j = (apart.nats, apart.cluster, apart.lead, apart.journal, apart.bucket,
                                               apart.journal_leader)
    # put the bucket's lead on the journal's server: the leader moves it back off
    reply = nats.js_request(f"$JS.API.STREAM.LEADER.STEPDOWN.{bucket}", {"placement": {"preferred": j.name}})
    assert reply.get("success"), reply
    deadline = time.monotonic() + 10
    while nats.stream_leader(bucket) is not j:
        assert time.monotonic() < deadline, "the bucket's lead did not move to the journal's server"
        time.sleep(0.1)
    t0 = time.monotonic()
    j2, b2 = _wait_apart(nats, journal, bucket, within=20)
    print(f"\nbucket led by {j.name} with the journal; moved to {b2.name} after {time.monotonic() - t0:.1f} s")
    assert j2 is j, "the journal's lead moved: the bucket's should have"
    assert _log_has(lead, f"moved the lead of {bucket} to"), cluster.logs()
    # no writes: the leader's failed renewals ask the journal for an empty
    # record, whose acknowledgement it leads on, as with writes (below)
    term = max(cluster.terms().values())
    t_kill = nats.kill9(b2)
    nats.wait_stream_leader(bucket, exclude=b2, timeout=30)
    elected = time.time() - t_kill
    time.sleep(3)
    print(f"idle: the bucket's new leader after {elected:.2f} s")
    assert cluster.wait_leader() is lead and max(cluster.terms().values()) == term, cluster.logs()
    assert elected <= 2.0 or _log_has(lead, "leading on while the key's bucket cannot answer"), cluster.logs()
    nats.restart(b2)


def test_the_leader_rides_out_the_death_of_the_buckets_nats_leader(apart, clustercheck_bin, tmp_path):
    nats, cluster, lead, journal, bucket, b = (apart.nats, apart.cluster, apart.lead, apart.journal, apart.bucket,
                                               apart.bucket_leader)
    term = max(cluster.terms().values())
    record = tmp_path / "acked.json"
    stop = tmp_path / "stop"
    writer = clustercheck.start("write", cluster.endpoints, binary=clustercheck_bin, duration=60, rate=300,
                                clients=16, record=record, pause_threshold=0.2, stop_file=stop)
    with writer:
        time.sleep(3)
        if nats.stream_leader(journal) is b:  # moved meanwhile: this test is about the bucket's alone
            _, b = _wait_apart(nats, journal, bucket, within=20)
        t_kill = nats.kill9(b)
        new = nats.wait_stream_leader(bucket, exclude=b, timeout=30)
        t_elected = time.time() - t_kill
        time.sleep(4)  # the key renewed (or written again) and writes after it
        nats.restart(b)
        time.sleep(2)
        stop.touch()
        w = writer.result()
    v = clustercheck.run("verify", cluster.endpoints, binary=clustercheck_bin, record=record)
    pause = clustercheck.pause_after(w, t_kill, window=15)
    print(f"\nkill -9 of nats-server {b.name} (led {bucket}): its new leader {new.name} after {t_elected:.2f} s, "
          f"longest write pause after the kill {pause:.2f} s; {w['acked']} acked, pauses {w.get('pauses')}")
    assert w["violations"] == 0 and v["violations"] == 0, (w, v)
    assert v["missing"] == 0 and v["acked"] == w["acked"] > 1000, v
    assert cluster.wait_leader() is lead, "the lead moved: the leader stepped down"
    assert max(cluster.terms().values()) == term, "a new epoch: the leader stepped down and was elected again"
    assert t_elected > 2.0, "NATS elected the bucket's leader within the key's TTL: nothing was tested"
    assert _log_has(lead, "leading on while the key's bucket cannot answer"), cluster.logs()
    assert (_log_has(lead, "the election key is renewed again")
            or _log_has(lead, "created it again")), cluster.logs()
    assert pause <= PAUSE_BOUND, (pause, w.get("pauses"))
