"""Seeded random generator of etcd v3 KV operations.

The generator is deterministic for a given seed *and* a given sequence of
observed reference responses: it tracks the current revision and the
compaction revision from what the reference server (etcd) answered, so that
historical / compacted / future revisions and compaction targets are chosen
relative to the real store state.  Two fresh servers that behave identically
therefore always receive the identical operation stream.

No leases are ever granted.  The only lease use is ``Put(lease=<id that does
not exist>)`` (NotFound "etcdserver: requested lease not found") and the
``lease`` operand of Txn compares (every key has lease 0).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from brain.api.pb.etcdserverpb import rpc_pb2

RangeRequest = rpc_pb2.RangeRequest
Compare = rpc_pb2.Compare

# A small key alphabet so operations collide.  Ordered bytewise; chosen so the
# brain shard boundaries used by the tests (b, k, t) split it into populated
# shards, and with edge keys (0x00, 0xff) for range-end arithmetic.
KEYS: list[bytes] = sorted([
    b"\x00",
    b"/registry/pods/ns/p1",
    b"/registry/pods/ns/p2",
    b"/registry/pods/ns2/p1",
    b"/registry/services/ns/s1",
    b"a",
    b"ab",
    b"abc",
    b"b",
    b"b0",
    b"bz",
    b"k",
    b"k0",
    b"kz",
    b"m",
    b"s",
    b"t",
    b"t1",
    b"tz",
    b"z",
    b"zz",
    b"\xff",
    b"\xff\xff",
])

# Extra range starts that are prefixes rather than stored keys.
RANGE_STARTS: list[bytes] = [
    b"/registry/",
    b"/registry/pods/",
    b"/registry/pods/ns/",
    b"a",
    b"b",
    b"k",
    b"t",
    b"\x00",
]

VALUE_POOL: list[bytes] = [b"", b"v", b"v1", b"v2", b"x" * 64, b"\x00", b"\xff"]

# Leases never exist on either server (nothing ever grants one).
MISSING_LEASE_IDS = [0x7EADBEEF, 1, 7, 0x1234567890]

MAX_TXN_OPS = 128  # etcd's --max-txn-ops default


def prefix_end(key: bytes) -> bytes:
    """etcd's GetPrefixRangeEnd: the smallest key greater than every key with prefix ``key``."""
    b = bytearray(key)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\x00"  # all 0xff: no upper bound


@dataclass
class Op:
    """One RPC: ``method`` is the KV service method name."""

    method: str  # "Range" | "Put" | "DeleteRange" | "Txn" | "Compact"
    request: object
    tags: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        from google.protobuf import text_format

        body = text_format.MessageToString(self.request, as_one_line=False).rstrip()
        tags = f" [{', '.join(self.tags)}]" if self.tags else ""
        return f"{self.method}{tags}\n{body}" if body else f"{self.method}{tags} (empty request)"


class OpGenerator:
    """Produces ``Op`` objects; feed it the reference result of each op via ``observe``."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.cur_rev = 1          # fresh etcd/brain start at revision 1
        self.compact_rev = 0      # 0: never compacted
        self.recent_values: list[bytes] = []

    # ------------------------------------------------------------------ state
    def observe(self, op: Op, result) -> None:
        """``result`` is the reference response message or an error object."""
        header = getattr(result, "header", None)
        if header is not None and result.HasField("header") and header.revision:
            self.cur_rev = header.revision
        if op.method == "Compact" and not getattr(result, "is_error", False):
            self.compact_rev = max(self.compact_rev, op.request.revision)

    # ---------------------------------------------------------------- helpers
    def _chance(self, p: float) -> bool:
        return self.rng.random() < p

    def key(self) -> bytes:
        return self.rng.choice(KEYS)

    def range_start(self) -> bytes:
        if self._chance(0.25):
            return self.rng.choice(RANGE_STARTS)
        return self.key()

    def value(self) -> bytes:
        r = self.rng.random()
        if r < 0.12:
            v = b""
        elif r < 0.35:
            v = self.rng.choice(VALUE_POOL)
        elif r < 0.5 and self.recent_values:
            v = self.rng.choice(self.recent_values)
        else:
            v = self.rng.randbytes(self.rng.randint(0, 64))
        self.recent_values.append(v)
        del self.recent_values[:-20]
        return v

    def range_end_for(self, key: bytes, *, single_weight: float = 0.35) -> bytes:
        r = self.rng.random()
        if r < single_weight:
            return b""
        r = self.rng.random()
        if r < 0.38:
            return prefix_end(key)
        if r < 0.53:
            return b"\x00"  # every key >= key
        if r < 0.83:
            return self.key()  # may sort before key: empty range
        if r < 0.88:
            return key  # [key, key): empty
        if r < 0.95:
            return key + b"\x00"  # just key
        return b"\xff"

    def revision(self) -> int:
        """A Range revision: mostly 0, sometimes current / historical / compacted / future."""
        r = self.rng.random()
        if r < 0.65:
            return 0
        if r < 0.72:
            return self.cur_rev
        if r < 0.87:
            return self.rng.randint(max(1, self.compact_rev), self.cur_rev)
        if r < 0.94 and self.compact_rev > 1:
            return self.rng.randint(1, self.compact_rev - 1)
        return self.cur_rev + self.rng.randint(1, 3)

    def some_rev(self) -> int:
        return self.rng.randint(1, self.cur_rev + 1)

    # ---------------------------------------------------------- request makers
    def range_request(self) -> RangeRequest:
        if self._chance(0.35):  # single key: pick stored-key candidates only
            key = b"" if self._chance(0.02) else self.key()
            req = RangeRequest(key=key)
        else:
            key = b"" if self._chance(0.02) else self.range_start()
            req = RangeRequest(key=key, range_end=self.range_end_for(key or b"a", single_weight=0))
        if self._chance(0.4):
            req.limit = self.rng.choice([1, 1, 2, 2, 3, 5, 10, 100])
        req.revision = self.revision()
        if self._chance(0.6):
            req.sort_order = self.rng.choice([0, 1, 2])
        if self._chance(0.6):
            req.sort_target = self.rng.choice([0, 1, 2, 3, 4])
        req.serializable = self._chance(0.2)
        req.keys_only = self._chance(0.15)
        req.count_only = self._chance(0.1)
        if self._chance(0.1):
            req.min_mod_revision = self.some_rev()
        if self._chance(0.1):
            req.max_mod_revision = self.some_rev()
        if self._chance(0.1):
            req.min_create_revision = self.some_rev()
        if self._chance(0.1):
            req.max_create_revision = self.some_rev()
        return req

    def put_request(self, key: bytes | None = None) -> rpc_pb2.PutRequest:
        if key is None:
            key = b"" if self._chance(0.02) else self.key()
        req = rpc_pb2.PutRequest(key=key)
        req.prev_kv = self._chance(0.3)
        if self._chance(0.1):
            req.ignore_value = True
            if self._chance(0.15):
                req.value = self.value() or b"v"  # -> "etcdserver: value is provided"
        else:
            req.value = self.value()
        if self._chance(0.1):
            req.ignore_lease = True
            if self._chance(0.1):
                req.lease = self.rng.choice(MISSING_LEASE_IDS)  # -> "lease is provided"
        elif self._chance(0.03):
            req.lease = self.rng.choice(MISSING_LEASE_IDS)  # -> lease not found
        return req

    def delete_request(self, key: bytes | None = None, *, single_weight: float = 0.45):
        if key is None:
            key = b"" if self._chance(0.02) else self.range_start()
        return rpc_pb2.DeleteRangeRequest(
            key=key,
            range_end=self.range_end_for(key or b"a", single_weight=single_weight),
            prev_kv=self._chance(0.5),
        )

    def compare(self) -> Compare:
        key = b"" if self._chance(0.01) else self.key()
        c = Compare(key=key, target=self.rng.randrange(5), result=self.rng.randrange(4))
        if self._chance(0.2):
            c.range_end = self.rng.choice([prefix_end(key or b"a"), b"\x00", self.key()])
        t = c.target
        if t == Compare.VERSION:
            c.version = self.rng.choice([0, 0, 1, 1, 2, 3, 5])
        elif t == Compare.CREATE:
            c.create_revision = self.rng.choice([0, self.some_rev()])
        elif t == Compare.MOD:
            c.mod_revision = self.rng.choice([0, self.some_rev(), self.cur_rev])
        elif t == Compare.VALUE:
            if self.recent_values and self._chance(0.6):
                c.value = self.rng.choice(self.recent_values)
            else:
                c.value = self.rng.choice(VALUE_POOL)
        else:
            c.lease = 0 if self._chance(0.8) else self.rng.choice(MISSING_LEASE_IDS)
        return c

    def request_ops(self, depth: int, n: int) -> list[rpc_pb2.RequestOp]:
        ops = []
        put_keys: set[bytes] = set()
        for _ in range(n):
            r = self.rng.random()
            if r < 0.005:
                ops.append(rpc_pb2.RequestOp())  # empty op -> "key is not provided"
            elif r < 0.4:
                # usually a key not yet put at this level (duplicates are an error)
                key = None
                if not self._chance(0.08):
                    free = [k for k in KEYS if k not in put_keys]
                    key = self.rng.choice(free) if free else None
                req = self.put_request(key)
                put_keys.add(req.key)
                ops.append(rpc_pb2.RequestOp(request_put=req))
            elif r < 0.75:
                ops.append(rpc_pb2.RequestOp(request_range=self.range_request()))
            elif r < 0.92 or depth >= 2:
                # mostly single-key deletes of keys not put at this level
                key = None
                if not self._chance(0.15):
                    free = [k for k in KEYS if k not in put_keys]
                    key = self.rng.choice(free) if free else None
                single = 0.85 if key is not None else 0.4
                ops.append(rpc_pb2.RequestOp(
                    request_delete_range=self.delete_request(key, single_weight=single)))
            else:
                ops.append(rpc_pb2.RequestOp(request_txn=self.txn_request(depth + 1)))
        return ops

    def txn_request(self, depth: int = 0) -> rpc_pb2.TxnRequest:
        if depth == 0 and self._chance(0.015):
            return self._big_txn()
        ncmp = self.rng.choice([0, 1, 1, 1, 2, 2, 3])
        req = rpc_pb2.TxnRequest(compare=[self.compare() for _ in range(ncmp)])
        req.success.extend(self.request_ops(depth, self.rng.choice([0, 1, 1, 2, 2, 3, 4])))
        req.failure.extend(self.request_ops(depth, self.rng.choice([0, 1, 1, 2, 3])))
        if depth == 0:
            _avoid_etcd_ignore_after_delete_panic(req)
        return req

    def _big_txn(self) -> rpc_pb2.TxnRequest:
        """Exactly MAX_TXN_OPS (valid) or MAX_TXN_OPS+1 (too many ops) operations."""
        n = MAX_TXN_OPS + self.rng.choice([0, 1])
        where = self.rng.choice(["success", "failure", "compare"])
        req = rpc_pb2.TxnRequest()
        if where == "compare":
            req.compare.extend(
                Compare(key=self.key(), target=Compare.VERSION, result=Compare.GREATER, version=-1)
                for _ in range(n))
            req.success.append(rpc_pb2.RequestOp(request_range=RangeRequest(key=self.key())))
        else:
            ops = [rpc_pb2.RequestOp(request_range=RangeRequest(
                key=self.key(), count_only=self._chance(0.5))) for _ in range(n)]
            getattr(req, where).extend(ops)
        return req

    def compact_request(self) -> rpc_pb2.CompactionRequest:
        r = self.rng.random()
        if r < 0.6 and self.compact_rev < self.cur_rev:
            span = self.cur_rev - self.compact_rev
            rev = self.compact_rev + self.rng.randint(1, max(1, span // 2))
        elif r < 0.8 and self.compact_rev >= 1:
            rev = self.rng.randint(0, self.compact_rev)  # already compacted
        else:
            rev = self.cur_rev + self.rng.randint(1, 5)  # future
        return rpc_pb2.CompactionRequest(revision=rev, physical=self._chance(0.2))

    # ------------------------------------------------------------------- main
    def next_op(self) -> Op:
        r = self.rng.random()
        if r < 0.33:
            return Op("Put", self.put_request())
        if r < 0.61:
            return Op("Range", self.range_request())
        if r < 0.70:
            return Op("DeleteRange", self.delete_request(single_weight=0.7))
        if r < 0.975:
            return Op("Txn", self.txn_request())
        return Op("Compact", self.compact_request())


def _walk_ops(txn: rpc_pb2.TxnRequest):
    for op in list(txn.success) + list(txn.failure):
        yield op
        if op.WhichOneof("request") == "request_txn":
            yield from _walk_ops(op.request_txn)


def _avoid_etcd_ignore_after_delete_panic(txn: rpc_pb2.TxnRequest) -> None:
    """etcd 3.4/3.5 *panics* (the server process dies) when a Txn's put with
    ignore_value/ignore_lease runs after a delete in the same Txn removed its
    key: the pre-check saw the key, the apply does not ("unexpected error
    during txn: etcdserver: key not found").  Never generate that: when the
    Txn tree holds any DeleteRange, its puts lose the ignore_* flags (an
    ignore_value put gets the value "iv" instead)."""
    ops = list(_walk_ops(txn))
    if not any(op.WhichOneof("request") == "request_delete_range" for op in ops):
        return
    for op in ops:
        if op.WhichOneof("request") == "request_put":
            put = op.request_put
            if put.ignore_value:
                put.ignore_value = False
                if not put.value:
                    put.value = b"iv"
            put.ignore_lease = False
