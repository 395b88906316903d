"""A history worth migrating, written into a real etcd (or brain) over gRPC:
the differential generator's operations (puts, deletes, range deletes, Txns,
compactions), plus Txns putting several keys in one revision, leases granted
with keys attached, a revoked lease, and compactions at chosen revisions."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2
from tests.differential.generator import OpGenerator
from tests.differential.harness import call

LEASE_TTL = 900  # long enough never to expire during a test


@dataclass
class History:
    revision: int = 1
    compactions: list[int] = field(default_factory=list)
    leases: list[int] = field(default_factory=list)  # granted and still alive
    revoked: list[int] = field(default_factory=list)
    multi_put_revisions: list[int] = field(default_factory=list)


def _revision(kv) -> int:
    return kv.Range(rpc_pb2.RangeRequest(key=b"\0", count_only=True), timeout=10).header.revision


def write_history(stubs, seed: int, ops: int = 300, *, prefix: bytes = b"") -> History:
    """Apply about `ops` operations; returns what was done."""
    rng = random.Random(seed)
    gen = OpGenerator(seed)
    h = History()
    kv, lease = stubs.kv, stubs.lease
    for i in range(ops):
        r = rng.random()
        if r < 0.04:
            lid = rng.randrange(1, 1 << 40)
            if lid % 4 == 0:
                lid = -lid  # etcd grants negative IDs too (no draw of its own: the seeds' histories stay)
            lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=LEASE_TTL, ID=lid), timeout=10)
            h.leases.append(lid)
            for j in range(rng.randint(1, 3)):
                kv.Put(rpc_pb2.PutRequest(key=prefix + b"leased/%d/%d" % (lid, j), value=b"l%d" % i, lease=lid),
                       timeout=10)
        elif r < 0.06 and len(h.leases) > 1:
            lid = h.leases.pop(rng.randrange(len(h.leases)))
            lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lid), timeout=10)
            h.revoked.append(lid)
        elif r < 0.16:
            keys = rng.sample([b"a", b"b", b"k0", b"m", b"t1", b"/registry/pods/ns/p1", b"zz"], rng.randint(2, 4))
            success = [rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=prefix + k, value=b"txn%d" % i))
                       for k in keys]
            if rng.random() < 0.3:
                success.append(rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=prefix + b"s")))
            resp = kv.Txn(rpc_pb2.TxnRequest(success=success), timeout=10)
            h.multi_put_revisions.append(resp.header.revision)
        elif r < 0.18 and ops // 4 < i < 2 * ops // 3:  # the last third stays retained history
            rev = _revision(kv)
            at = rng.randint(max(2, (h.compactions or [1])[-1] + 1), rev) if rev > 2 else 0
            if at and (not h.compactions or at > h.compactions[-1]):
                try:
                    kv.Compact(rpc_pb2.CompactionRequest(revision=at, physical=rng.random() < 0.5), timeout=30)
                    h.compactions.append(at)
                except grpc.RpcError as e:  # below an earlier history's compaction
                    if e.code() != grpc.StatusCode.OUT_OF_RANGE:
                        raise
        else:
            op = gen.next_op()
            if op.method == "Compact":
                continue  # compactions are chosen above, in order
            res = call(kv, op)
            gen.observe(op, res)
    h.revision = _revision(kv)
    return h
