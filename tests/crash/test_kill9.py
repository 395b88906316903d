"""Crash tests: concurrent writers, kill -9 at random moments, restart.

After every restart, every acknowledged write must be there with its value
and revision (read back at its own revision, so a later overwrite cannot mask
a loss), revisions never go back, and the server keeps accepting writes.
Cycles: BRAIN_CRASH_CYCLES (CI runs a short version; `make test-full` runs 25).

The data dir is on a real disk (not /dev/shm), so the journal's preallocation,
renames and fdatasyncs go through a disk filesystem.  kill -9 keeps the page
cache, so these runs cannot tell an fdatasync from none: tests/crash/
test_fdatasync.py covers that by failing and stalling fdatasync itself.
"""

from __future__ import annotations

import os
import random
import threading
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2
from tests.support.servers import grpc_channel, require_brain, server_settings_from_env, setting_id, start_brain

CYCLES = int(os.environ.get("BRAIN_CRASH_CYCLES", "6"))
WRITERS = 6


class Writers:
    """Threads writing puts and Txns until told to stop; every acknowledged
    write is recorded as (key, value, revision)."""

    def __init__(self, endpoint: str, cycle: int, seed: int) -> None:
        self.endpoint = endpoint
        self.cycle = cycle
        self.rng = random.Random(seed)
        self.acked: list[tuple[bytes, bytes, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(WRITERS)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def wait_first_ack(self, within: float = 20.0) -> None:
        """Until a write is acknowledged (a loaded machine can take longer
        than the shortest kill delay to connect the writers)."""
        deadline = time.monotonic() + within
        while not self.acked and time.monotonic() < deadline:
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def _run(self, wid: int) -> None:
        from brain.api.pb.etcdserverpb import rpc_pb2_grpc

        channel = grpc_channel(self.endpoint)
        kv = rpc_pb2_grpc.KVStub(channel)
        seq = 0
        try:
            while not self.stop.is_set():
                seq += 1
                # A small shared key space (overwrites, versions) plus unique keys.
                if seq % 3 == 0:
                    key = b"shared/%d" % (seq % 17)
                else:
                    key = b"w%d/c%d/%06d" % (wid, self.cycle, seq)
                value = b"%d-%d-%d-" % (self.cycle, wid, seq) + os.urandom(8).hex().encode()
                try:
                    if seq % 5 == 0:
                        resp = kv.Txn(rpc_pb2.TxnRequest(
                            compare=[rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.VERSION,
                                                     result=rpc_pb2.Compare.GREATER, version=-1)],
                            success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value))],
                        ), timeout=5)
                        rev = resp.header.revision
                    else:
                        rev = kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=5).header.revision
                except grpc.RpcError:
                    if self.stop.is_set():
                        return
                    time.sleep(0.05)
                    continue
                with self.lock:
                    self.acked.append((key, value, rev))
        finally:
            channel.close()


def verify(endpoint: str, acked: list[tuple[bytes, bytes, int]], min_rev: int) -> int:
    from tests.support.servers import kv_stub

    with kv_stub(endpoint) as stubs:
        head = stubs.kv.Range(rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00", count_only=True), timeout=30)
        assert head.header.revision >= min_rev, "revision went back after restart"
        revs = [r for _, _, r in acked]
        assert len(set(revs)) == len(revs), "two acknowledged writes share a revision"
        for key, value, rev in acked:
            resp = stubs.kv.Range(rpc_pb2.RangeRequest(key=key, revision=rev), timeout=30)
            assert len(resp.kvs) == 1, f"acknowledged write of {key!r} at {rev} is lost"
            kv = resp.kvs[0]
            assert (kv.value, kv.mod_revision) == (value, rev), f"{key!r} at {rev}: got {kv.value!r}@{kv.mod_revision}"
        return head.header.revision


def verify_history(endpoint: str, acked: list[tuple[bytes, bytes, int]]) -> None:
    """All acknowledged writes at once: one watch from revision 1 replays the
    whole history; every acknowledged (key, value, revision) must be in it."""
    import queue

    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    want = {rev: (key, value) for key, value, rev in acked}
    top = max(want)
    channel = grpc_channel(endpoint)
    reqs: queue.Queue = queue.Queue()
    reqs.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
        key=b"\x00", range_end=b"\x00", start_revision=1)))
    seen = {}
    try:
        for resp in rpc_pb2_grpc.WatchStub(channel).Watch(iter(reqs.get, None), timeout=120):
            for ev in resp.events:
                seen[ev.kv.mod_revision] = seen.get(ev.kv.mod_revision, []) + [(ev.kv.key, ev.kv.value)]
            if seen and max(seen) >= top:
                break
    finally:
        reqs.put(None)
        channel.close()
    for rev, kv in want.items():
        assert kv in seen.get(rev, []), f"acknowledged write {kv[0]!r} at {rev} missing from history"


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("setting", server_settings_from_env(), ids=setting_id)
def test_kill9_loses_no_acknowledged_write(setting):
    """Every setting on plaintext gets the full cycle count; mutual TLS and
    unix sockets, whose durability path is the same, a third of it (what
    they add is the clients reconnecting through TLS and the socket file)."""
    require_brain()
    shards, transport = setting
    cycles = CYCLES if transport == "http" else max(2, CYCLES // 3)
    rng = random.Random(1234 + shards)
    srv = start_brain(shards=shards, extra_args=["--checkpoint-interval", "0.7s"], on_disk=True, transport=transport)
    all_acked: list[tuple[bytes, bytes, int]] = []
    last_rev = 0
    try:
        for cycle in range(cycles):
            with Writers(srv.endpoint, cycle, rng.random()) as w:
                w.wait_first_ack()
                time.sleep(rng.uniform(0.3, 1.5))
                srv.kill9()
            all_acked.extend(w.acked)
            assert w.acked, f"cycle {cycle}: no write was acknowledged"
            srv.start()
            # This cycle's writes one by one, at their own revisions; every
            # earlier cycle's writes again at the end, in one history read.
            last_rev = verify(srv.endpoint, w.acked, max(last_rev, max(r for _, _, r in all_acked)))
        verify_history(srv.endpoint, all_acked)
        print(f"crash cycles: {cycles}, acknowledged writes checked: {len(all_acked)}")
    finally:
        srv.cleanup()
