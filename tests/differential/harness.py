"""Drive the same generated operation stream into two servers and compare.

The first server is the reference (etcd); its answers steer the generator
(current / compaction revision).  Both servers must be fresh (same revision,
empty keyspace) when a run starts.

brain behaves as etcd 3.7.3 (brain/etcd_version.py).  The KV stream puts no
key on a lease, so a keys_only answer is the same from 3.4, 3.6 and 3.7 (3.7
leaves the lease out of keys_only KeyValues not sorted by value), and this
harness compares everything against every version.  Where 3.6 and 3.7 differ
with leases, brain is compared with 3.7 only: the watch/lease harness
(watch_generator.py, ``fast_keys_only``) and test_range_stream_vs_etcd.py
(ETCD_BEHAVIOUR.md, "etcd 3.6.16 and 3.7.3").
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2

from .compare import ErrorResult, first_difference, normalize, render
from .generator import Op, OpGenerator

DEFAULT_RPC_TIMEOUT = 15.0


# Results recorded by tests (tests/conftest.py prints totals at the end).
RESULTS: list["RunResult"] = []


class NotFreshError(RuntimeError):
    """The two servers do not start from the same (empty) state."""


@dataclass
class Diff:
    seed: int
    index: int           # 0-based op number within the seed's stream
    op: Op
    where: str           # first differing path
    ref_result: object
    other_result: object
    labels: tuple[str, str]
    repro_extra: str = ""  # extra runner flags, e.g. " --shards 4"

    def report(self) -> str:
        a, b = self.labels
        return (
            f"DIFFERENCE at op #{self.index} (seed {self.seed}): {self.where}\n"
            f"--- op ---\n{self.op.describe()}\n"
            f"--- {a} ---\n{render(self.ref_result)}\n"
            f"--- {b} ---\n{render(self.other_result)}\n"
            f"reproduce: python -m tests.differential.run --seed {self.seed} "
            f"--ops {self.index + 1}{self.repro_extra}"
        )


@dataclass
class RunResult:
    seed: int
    label: str = ""      # e.g. "brain shards=4 vs etcd", for summaries
    ops_compared: int = 0
    diff: Diff | None = None
    # (method, outcome) -> count; outcome is "ok" or "CODE: details"
    outcomes: collections.Counter = field(default_factory=collections.Counter)

    def summary(self) -> str:
        lines = [f"{self.label + ' ' if self.label else ''}seed {self.seed}: "
                 f"{self.ops_compared} ops compared"
                 + ("" if self.diff is None else f", first difference at op #{self.diff.index}")]
        for (method, outcome), n in sorted(self.outcomes.items()):
            lines.append(f"  {method:12s} {n:5d}  {outcome}")
        return "\n".join(lines)


def call(kv_stub, op: Op, timeout: float = DEFAULT_RPC_TIMEOUT):
    try:
        return getattr(kv_stub, op.method)(op.request, timeout=timeout)
    except grpc.RpcError as e:
        return ErrorResult.from_rpc_error(e)


def _state_probe(kv_stub):
    return call(kv_stub, Op("Range", rpc_pb2.RangeRequest(
        key=b"\x00", range_end=b"\x00", count_only=True)))


def check_fresh(ref_kv, other_kv, labels=("etcd", "other")) -> None:
    a, b = _state_probe(ref_kv), _state_probe(other_kv)
    for name, r in zip(labels, (a, b)):
        if isinstance(r, ErrorResult):
            raise NotFreshError(f"{name}: state probe failed: {r}")
        if r.count != 0 or r.header.revision != 1:
            raise NotFreshError(
                f"{name} is not a fresh server (revision {r.header.revision}, {r.count} keys); "
                "the differential run needs two fresh servers at revision 1")


def _outcome(op: Op, ref) -> str:
    """Coarse classification of the reference result, for coverage summaries."""
    if isinstance(ref, ErrorResult):
        return f"{ref.code}: {ref.details}"
    if op.method == "Range":
        if op.request.count_only:
            return "ok count_only"
        n = len(ref.kvs)
        size = "0 kvs" if n == 0 else "1 kv" if n == 1 else "2-12 kvs" if n <= 12 else ">12 kvs"
        return f"ok {size}" + (" more" if ref.more else "")
    if op.method == "Txn":
        return f"ok succeeded={ref.succeeded}"
    if op.method == "Put":
        return "ok prev_kv" if ref.HasField("prev_kv") else "ok"
    if op.method == "DeleteRange":
        return "ok deleted>0" if ref.deleted else "ok deleted=0"
    return "ok"


def run_differential(ref_kv, other_kv, seed: int, n_ops: int, *,
                     labels: tuple[str, str] = ("etcd", "brain"),
                     timeout: float = DEFAULT_RPC_TIMEOUT,
                     require_fresh: bool = True,
                     label: str = "",
                     repro_extra: str = "",
                     log=None) -> RunResult:
    """Send ``n_ops`` generated ops to both KV stubs; stop at the first difference."""
    if require_fresh:
        check_fresh(ref_kv, other_kv, labels)
    gen = OpGenerator(seed)
    result = RunResult(seed=seed, label=label)
    for i in range(n_ops):
        op = gen.next_op()
        ref = call(ref_kv, op, timeout)
        other = call(other_kv, op, timeout)
        if log is not None:
            log(i, op, ref, other)
        where = first_difference(normalize(op.method, op.request, ref),
                                 normalize(op.method, op.request, other),
                                 labels=labels)
        result.outcomes[(op.method, _outcome(op, ref))] += 1
        if where is not None:
            result.diff = Diff(seed, i, op, where, ref, other, labels, repro_extra)
            return result
        result.ops_compared += 1
        gen.observe(op, ref)
    return result
