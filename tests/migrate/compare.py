"""What a server answers about its whole retained history, as plain data, so
two servers (an etcd and the brain its data moved to) compare with ==:

* a Range over every key at every revision from the compaction revision to
  the current one (every field of every KeyValue, count, more), and the
  error below the compaction revision;
* a Watch over every key, with prev_kv, from every one of those revisions
  (all on one stream), each followed until it reaches the current revision;
  and the cancellation of a watch from below the compaction revision;
* every lease: ID, granted TTL, attached keys.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.servers import kv_stub

ALL = b"\0"


def kv_tuple(kv) -> tuple:
    return (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass
class Fingerprint:
    revision: int
    compact: int
    ranges: dict
    below_compaction: tuple | None
    watches: dict
    compacted_watch: tuple | None
    leases: dict

    def diff(self, other: "Fingerprint") -> str | None:
        """A short description of the first difference, or None."""
        for name in ("revision", "compact", "below_compaction", "compacted_watch", "leases"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                return f"{name}: {a!r} != {b!r}"
        for rev in sorted(set(self.ranges) | set(other.ranges)):
            if self.ranges.get(rev) != other.ranges.get(rev):
                return f"range at {rev}: {self.ranges.get(rev)!r} != {other.ranges.get(rev)!r}"
        for rev in sorted(set(self.watches) | set(other.watches)):
            a, b = self.watches.get(rev), other.watches.get(rev)
            if a != b:
                n = next((i for i, (x, y) in enumerate(zip(a or [], b or [])) if x != y), min(len(a or []), len(b or [])))
                return (f"watch from {rev}: first difference at event {n}: "
                        f"{(a or [])[n:n + 2]!r} != {(b or [])[n:n + 2]!r} ({len(a or [])} vs {len(b or [])} events)")
        return None


def _range_all(kv, rev: int):
    try:
        r = kv.Range(rpc_pb2.RangeRequest(key=ALL, range_end=ALL, revision=rev), timeout=30)
        return (tuple(kv_tuple(x) for x in r.kvs), r.count, r.more)
    except grpc.RpcError as e:
        return ("error", e.code().name, e.details())


def _watch_all(channel, starts: list[int], until: int, timeout: float) -> dict:
    """Events per start revision: (type, kv, prev_kv) until `until`."""
    requests: queue.Queue = queue.Queue()
    call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(requests.get, None))
    by_id: dict[int, int] = {}
    events: dict[int, list] = {s: [] for s in starts}
    done: set[int] = set()
    canceled: dict[int, tuple] = {}
    pending = list(starts)
    lock = threading.Condition()
    error: list = []

    def pump():
        try:
            for resp in call:
                with lock:
                    if resp.created:
                        start = pending.pop(0)
                        if resp.canceled:
                            canceled[start] = (resp.compact_revision, resp.cancel_reason)
                            done.add(start)
                        else:
                            by_id[resp.watch_id] = start
                    elif resp.canceled and resp.watch_id in by_id:
                        start = by_id[resp.watch_id]
                        canceled[start] = (resp.compact_revision, resp.cancel_reason)
                        done.add(start)
                    elif resp.watch_id in by_id:
                        start = by_id[resp.watch_id]
                        for ev in resp.events:
                            events[start].append((ev.type, kv_tuple(ev.kv),
                                                  kv_tuple(ev.prev_kv) if ev.HasField("prev_kv") else None))
                            if ev.kv.mod_revision >= until:
                                done.add(start)
                    lock.notify_all()
        except grpc.RpcError as e:
            error.append(e)
            with lock:
                lock.notify_all()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        for s in starts:  # one at a time: `created` responses come back in request order
            requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                key=ALL, range_end=ALL, start_revision=s, prev_kv=True)))
        deadline = time.monotonic() + timeout
        with lock:
            while len(done) < len(starts) and not error:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"watches from {sorted(set(starts) - done)[:5]}... did not reach "
                                         f"revision {until} in {timeout}s")
                lock.wait(left)
        if error:
            raise error[0]
    finally:
        requests.put(None)
        call.cancel()
        t.join(5)
    out = {s: events[s] for s in starts}
    for s, c in canceled.items():
        out[s] = ("canceled", c)
    return out


def fingerprint(endpoint: str, *, watch_timeout: float = 60.0) -> Fingerprint:
    with kv_stub(endpoint) as stubs:
        head = stubs.kv.Range(rpc_pb2.RangeRequest(key=ALL, count_only=True), timeout=10).header.revision
        # the compaction revision: the lowest revision a Range still answers
        lo, hi = 1, head
        while lo < hi:
            mid = (lo + hi) // 2
            if isinstance(_range_all(stubs.kv, mid)[0], str):
                lo = mid + 1
            else:
                hi = mid
        compact = lo
        ranges = {rev: _range_all(stubs.kv, rev) for rev in range(compact, head + 1)}
        below = _range_all(stubs.kv, compact - 1) if compact > 1 else None
        starts = list(range(compact, head + 1))
        watches = _watch_all(stubs.channel, starts, head, watch_timeout)
        compacted = None
        if compact > 1:
            compacted = _watch_all(stubs.channel, [compact - 1], head, watch_timeout)[compact - 1]
        leases = {}
        for lease in stubs.lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest(), timeout=10).leases:
            ttl = stubs.lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=lease.ID, keys=True), timeout=10)
            leases[lease.ID] = (ttl.grantedTTL, tuple(sorted(ttl.keys)))
    return Fingerprint(head, compact, ranges, below, watches, compacted, leases)
