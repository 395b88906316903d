"""tests/support/nats_cluster.py against real nats-servers: a 3-node JetStream
cluster holds an R3 stream, refuses a publish whose expected last sequence is
stale (err_code 10071, the fence brain's leader relies on), and loses no
acknowledged message when the stream leader is killed; a single node keeps
its messages across kill -9 with sync_interval always."""

from __future__ import annotations

import asyncio
import threading
import time

import nats
import pytest
import nats.errors
from nats.js.errors import APIError, ServiceUnavailableError

STREAM = "JOURNAL"
WRONG_LAST_SEQUENCE = 10071


class Publisher:
    """Publishes to STREAM from a thread of its own, until stopped.

    Every message carries a unique Nats-Msg-Id and is retried with that id
    until acknowledged (the server de-duplicates retries), so each payload is
    acknowledged once, at one sequence. ``acked`` maps payload -> (sequence,
    ack time).
    """

    def __init__(self, urls: list[str], subject: str):
        self.urls = urls
        self.subject = subject
        self.acked: dict[bytes, tuple[int, float]] = {}
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "Publisher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the publisher did not stop"

    async def _run(self) -> None:
        nc = await nats.connect(servers=self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1,
                                connect_timeout=2)
        js = nc.jetstream()
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                payload = b"m%08d" % n
                while not self._stop.is_set():
                    try:
                        ack = await js.publish(self.subject, payload, timeout=1.0,
                                               headers={"Nats-Msg-Id": payload.decode()})
                        self.acked[payload] = (ack.seq, time.time())
                        break
                    except Exception as e:  # noqa: BLE001 - every failure is retried with the same id
                        kind = type(e).__name__
                        self.errors[kind] = self.errors.get(kind, 0) + 1
                        await asyncio.sleep(0.05)
        finally:
            await nc.close()

    def longest_gap(self) -> tuple[float, float]:
        """(longest time between two acknowledgements, when it began)."""
        times = sorted(t for _, t in self.acked.values())
        best = (0.0, 0.0)
        for a, b in zip(times, times[1:]):
            if b - a > best[0]:
                best = (b - a, a)
        return best


async def _stream_contents(urls: list[str]) -> dict[int, bytes]:
    """Every message of STREAM: sequence -> payload."""
    nc = await nats.connect(servers=urls, connect_timeout=2)
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM)
        sub = await js.pull_subscribe("j.>", durable=None, stream=STREAM)
        out: dict[int, bytes] = {}
        deadline = time.monotonic() + 30
        while len(out) < info.state.messages:
            try:
                got = await sub.fetch(batch=500, timeout=5)
            except (ServiceUnavailableError, nats.errors.TimeoutError):
                # the consumer just made, on a cluster whose killed server is
                # rejoining, may have no leader for a moment (503, CI)
                assert time.monotonic() < deadline, f"the stream gave {len(out)} of {info.state.messages} messages"
                await asyncio.sleep(0.2)
                continue
            for m in got:
                out[m.metadata.sequence.stream] = m.data
                await m.ack()
        return out
    finally:
        await nc.close()


def _run(coro):
    return asyncio.run(coro)


def test_r3_stream_fence_and_leader_kill(nats_cluster_factory):
    nc_cluster = nats_cluster_factory(3, sync_always=True)
    urls = nc_cluster.urls

    async def create_and_fence():
        nc = await nats.connect(servers=urls, connect_timeout=2)
        try:
            js = nc.jetstream()
            await js.add_stream(name=STREAM, subjects=["j.>"], num_replicas=3, storage="file",
                                duplicate_window=120.0)
            seqs = [(await js.publish("j.x", b"first-%d" % i)).seq for i in range(5)]
            assert seqs == [1, 2, 3, 4, 5]
            with pytest.raises(APIError) as stale:
                await js.publish("j.x", b"stale", headers={"Nats-Expected-Last-Sequence": "3"})
            ok = await js.publish("j.x", b"fenced", headers={"Nats-Expected-Last-Sequence": "5"})
            return stale.value, ok.seq
        finally:
            await nc.close()

    stale, fenced_seq = _run(create_and_fence())
    assert stale.err_code == WRONG_LAST_SEQUENCE, stale
    assert fenced_seq == 6

    leader = nc_cluster.wait_stream_leader(STREAM)
    pub = Publisher(urls, "j.load").start()
    try:
        time.sleep(2.0)
        before = len(pub.acked)
        t_kill = nc_cluster.kill9(leader)
        new_leader = nc_cluster.wait_stream_leader(STREAM, exclude=leader, timeout=30)
        t_elected = time.time()
        # Publishing resumes on the new leader.
        deadline = time.time() + 20
        while not any(t > t_elected for _, t in pub.acked.values()) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        pub.stop()
    assert new_leader is not leader
    assert before > 0 and any(t > t_elected for _, t in pub.acked.values()), \
        f"no publish acknowledged after the failover; errors {pub.errors}\n{nc_cluster.logs()}"
    gap, gap_start = pub.longest_gap()
    print(f"\nNATS R3 (sync always) stream-leader kill: {leader.name} -> {new_leader.name}, "
          f"new leader seen after {t_elected - t_kill:.2f} s, longest publish gap {gap:.2f} s "
          f"(from {gap_start - t_kill:+.2f} s after the kill), {len(pub.acked)} acknowledged, "
          f"errors {pub.errors}")

    nc_cluster.restart(leader)
    contents = _run(_stream_contents(urls))
    by_payload = {p: s for s, p in contents.items()}
    lost = {p: s for p, (s, _) in pub.acked.items() if by_payload.get(p) != s}
    assert not lost, f"{len(lost)} acknowledged messages missing or moved, e.g. {list(lost.items())[:5]}"
    # Nothing but the acknowledged messages, each once (retries de-duplicated).
    assert len(contents) == 6 + len(pub.acked)


def test_single_node_keeps_messages_across_kill9(nats_cluster_factory):
    cluster = nats_cluster_factory(1, sync_always=True)
    node = cluster.nodes[0]

    async def publish():
        nc = await nats.connect(servers=cluster.urls, connect_timeout=2)
        try:
            js = nc.jetstream()
            await js.add_stream(name=STREAM, subjects=["j.>"], num_replicas=1, storage="file")
            return [(await js.publish("j.x", b"m%d" % i)).seq for i in range(100)]
        finally:
            await nc.close()

    seqs = _run(publish())
    assert seqs == list(range(1, 101))
    assert cluster.stream_leader(STREAM) is node
    cluster.kill9(node)
    assert cluster.stream_leader(STREAM, timeout=0.5) is None
    cluster.restart(node)
    info = cluster.stream_info(STREAM)
    assert info["state"]["messages"] == 100 and info["state"]["last_seq"] == 100, info
    assert _run(_stream_contents(cluster.urls)) == {i + 1: b"m%d" % i for i in range(100)}
