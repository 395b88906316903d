#!/usr/bin/env python3
"""brain's JetStream streams during a rolling restart of the NATS servers
(docs/cluster.md "Operations").

    nats-streams.py step-down nats://HOST:4222 SERVER   move each stream SERVER leads to another server
    nats-streams.py wait-current nats://HOST:4222       wait until every stream has a leader and all
                                                        its replicas are current

The streams are those of the brain cluster ``--name`` (default ``brain``,
the name at the end of ``--journal-url``): its journal and its election and
membership buckets.  SERVER is a nats-server's ``server_name``.  Runs with
the Python brain is installed in (it reads the stream names from brain and
talks to NATS with nats-py, one of brain's dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


async def cluster_info(nc, stream: str) -> dict:
    """The stream's cluster section, or {} when no server answered in time:
    a stream between two leaders answers no INFO request until it has one,
    so a timeout here means "ask again", never "fail"."""
    import nats.errors

    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=2)
    except nats.errors.TimeoutError:
        return {}
    return json.loads(reply.data).get("cluster") or {}


async def step_down(nc, server: str, streams: list[str], deadline: float) -> None:
    """A stream's leader steps down only when it is ``server``: asking
    another would cost that stream an election for nothing.  The leader
    that steps down may not answer the request (it is no longer the leader
    when the answer would go): a lost answer is followed by looking at who
    leads, and the request is sent again while ``server`` still leads a few
    seconds later."""
    import nats.errors

    for stream in streams:
        asked, ask_after = False, 0.0
        while True:
            info = await cluster_info(nc, stream)
            leader = info.get("leader")
            if leader is not None and leader != server:
                break  # led elsewhere: by another server from the start, or since we asked
            if leader == server and time.monotonic() >= ask_after:
                # (a STEPDOWN request goes to whoever leads now: asking again
                # too soon, on an answer that is behind, would move a new leader)
                ask_after = time.monotonic() + 3.0
                try:
                    reply = json.loads((await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"",
                                                         timeout=2)).data)
                except nats.errors.TimeoutError:
                    reply = {"success": True}  # perhaps done: the next look says
                if not reply.get("success"):
                    sys.exit(f"{stream}: step-down refused: {reply.get('error')}")
                asked = True
            if time.monotonic() > deadline:
                sys.exit(f"{stream}: still led by {server} or by no server: {info}")
            await asyncio.sleep(0.2)
        if asked:
            print(f"{stream}: leader moved off {server}")


async def wait_current(nc, streams: list[str], deadline: float) -> None:
    for stream in streams:
        while True:
            c = await cluster_info(nc, stream)
            replicas = c.get("replicas") or []
            if c.get("leader") and replicas and all(r.get("current") for r in replicas):
                break
            if time.monotonic() > deadline:
                sys.exit(f"{stream}: not every replica is current: {c}")
            await asyncio.sleep(0.2)
        print(f"{stream}: every replica current")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("step-down", "wait-current"))
    p.add_argument("url", help="a nats-server to ask (not the one being restarted, for wait-current)")
    p.add_argument("server", nargs="?", help="step-down: the server_name to move the leaders off")
    p.add_argument("--name", default="brain", help="the brain cluster's name (default: brain)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at most (default: 60)")
    args = p.parse_args()
    if args.action == "step-down" and not args.server:
        p.error("step-down needs the server's name")
    import nats

    from brain.cluster import jetstream_streams

    nc = await nats.connect(args.url, allow_reconnect=False)
    deadline = time.monotonic() + args.timeout
    try:
        if args.action == "step-down":
            await step_down(nc, args.server, jetstream_streams(args.name), deadline)
        else:
            await wait_current(nc, jetstream_streams(args.name), deadline)
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
