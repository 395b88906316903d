"""Keep the election bucket's stream led by another nats-server than the
journal's.

Every JetStream stream has its own Raft leader among the servers holding
it, and nothing stops one server from leading both brain's journal and its
election bucket.  When that server dies both lose their leader at once:
the brain leader can neither append nor renew its key, so it cannot lead
on through the outage (brain.cluster.election) and steps down once the
key's TTL has passed, then waits for NATS to elect both leaders again (a
write pause of 12 s measured, against 4-9.8 s when only the journal lost
its leader; docs/cluster.md "Failover").  With the two led from different
servers, one death takes the leader of one of them only, and the brain
leader rides it out.

The brain leader checks every ``INTERVAL`` seconds and, when the leaders
coincide, asks the bucket's stream leader to step down in favour of a
current replica of the bucket on another server (``placement.preferred``
of ``$JS.API.STREAM.LEADER.STEPDOWN``, nats-server 2.11 and later).  The
bucket, not the journal, moves: its stream is a few messages, so its
hand-over is a Raft leadership transfer of a few milliseconds that no
write waits on (a renewal that meets it is retried at the next renewal,
well inside the key's TTL).
"""

from __future__ import annotations

import logging

from ..journal.jetstream_stream import api_error, jetstream_api

log = logging.getLogger("brain.cluster.placement")

INTERVAL = 5.0  # seconds between checks on the leader
REQUEST_TIMEOUT = 2.0


def _cluster(conn, stream: str) -> dict:
    info = jetstream_api(conn, f"$JS.API.STREAM.INFO.{stream}", timeout=REQUEST_TIMEOUT)
    err = api_error(info)
    if err:
        raise RuntimeError(f"stream info of {stream}: {err[1]} (code {err[0]})")
    return info.get("cluster") or {}


def separate_leaders(conn, journal_stream: str, bucket_stream: str) -> str | None:
    """If one nats-server leads both streams, move the bucket's lead to a
    current replica on another server; the server asked to lead it, or
    None when nothing was moved (the leaders differ, or no replica is
    current)."""
    journal = _cluster(conn, journal_stream)
    bucket = _cluster(conn, bucket_stream)
    leader = bucket.get("leader")
    if not leader or leader != journal.get("leader"):
        return None
    current = [r["name"] for r in bucket.get("replicas") or []
               if r.get("current") and not r.get("offline") and r.get("name") != leader]
    if not current:
        return None
    target = sorted(current)[0]
    reply = jetstream_api(conn, f"$JS.API.STREAM.LEADER.STEPDOWN.{bucket_stream}",
                          {"placement": {"preferred": target}}, timeout=REQUEST_TIMEOUT)
    if api_error(reply) or not reply.get("success"):
        log.info("moving the lead of %s off %s (which also leads %s) was refused: %s", bucket_stream, leader,
                 journal_stream, api_error(reply))
        return None
    log.info("nats-server %s led both %s and %s; moved the lead of %s to %s", leader, journal_stream,
             bucket_stream, bucket_stream, target)
    return target
