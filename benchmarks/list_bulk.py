"""Lists in bulk measured in process (issue 17): a keys_only Range of every
key and a full list of the pods in pages, from the Range step to the
response bytes a transport sends, over a store restarted from lmdb (every
key in packed blocks) plus a few recent writes (overlay keys).

    python3 -m benchmarks.list_bulk [--keys 100000] [--seed 1] [--recent 0.01]

The data has issue 17's shapes (benchmarks.index_memory.kubernetes_keys:
40% node leases ~350 B, 25% events ~700 B, 20% pods 1.5-4 KiB, 15% others
~1 KiB, 20% written twice); node leases and events carry a lease, as in
Kubernetes.  Times are CPU us per listed key, best of three, in one process
without gRPC: read them as the server's share of a list, and compare runs
made on the same machine.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from pathlib import Path

from benchmarks.index_memory import kubernetes_keys, writes
from brain.api.kv import KVService
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.backend.lmdb_backend import LmdbBackend
from brain.backend.protocol import WriteBatch
from brain.mvcc.revision import pack
from brain.mvcc.shard_map import DEFAULT_SHARDS, default_boundaries
from brain.mvcc.store import Store

LEASES = 1000  # leases the leased keys are spread over
PODS = (b"/registry/pods/", b"/registry/pods0")
PAGE = 10_000  # the apiserver's consistency checker's page


def value_size(key: bytes, rng: random.Random) -> int:
    if key.startswith(b"/registry/leases/"):
        return 350
    if key.startswith(b"/registry/events/"):
        return 700
    if key.startswith(b"/registry/pods/"):
        return rng.randrange(1536, 4096)
    return 1024


def leased(key: bytes) -> bool:
    return key.startswith((b"/registry/leases/", b"/registry/events/"))


class StoreReads:
    """The engine's read interface (range, range_columns, range_chunk,
    identity) over a bare store at its newest revision: what KVService
    asks of an engine."""

    cluster_id = 0x1234
    member_id = 0x5678
    term = 2

    def __init__(self, store: Store) -> None:
        self.store = store

    def range(self, req):
        return self.store.range(req, self.store.revision)

    def range_columns(self, req):
        return self.store.range_columns(req, self.store.revision)

    def range_chunk(self, req):
        return self.store.range_chunk(req, self.store.revision)


def restarted_store(path: Path, keys: list[bytes], seed: int, recent: float) -> tuple[Store, LmdbBackend]:
    """A store over lmdb at `path` holding `keys` written as index_memory
    writes them, restarted (its index packed from the stored records), then
    a share `recent` of the keys written again (they go to the overlay)."""
    rng = random.Random(seed + 3)
    backend = LmdbBackend(path, DEFAULT_SHARDS)
    boundaries = default_boundaries(DEFAULT_SHARDS)
    store = Store(backend, boundaries)
    for lease_id in range(1, LEASES + 1):
        store.lessor.grant(lease_id, 3600)
    values = {n: bytes(n) for n in range(0, 4097)}

    def write(order: list[bytes]) -> None:
        for key in order:
            main = store.revision + 1
            store.put_at(pack(main, 0), key, values[value_size(key, rng)], rng.randrange(1, LEASES + 1) if leased(key) else 0)
            store.finish_revision(main)

    write(writes(keys, seed))
    cut = store.checkpoint_cut()
    backend.write(WriteBatch(puts=list(cut.records())))
    store.checkpoint_done()
    restarted = Store(backend, boundaries)
    restarted.load_checkpoint(store.revision, cut.leases, compact_rev=-1, compaction_finished=True)
    store = restarted
    write(rng.sample(keys, int(len(keys) * recent)))
    return store, backend


def best(fn, repeat: int = 3) -> float:
    """The least CPU time of `repeat` runs of `fn`: CPU time, not wall time,
    so other processes on the machine move it less."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def keys_only_all(kv: KVService) -> bytes:
    return kv.range(rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00", keys_only=True)).SerializeToString()


def pods_in_pages(kv: KVService, keys_only: bool) -> int:
    """Every pod listed in pages of PAGE as the apiserver pages (the next
    page from the last key + \\0 at the first page's revision); returns
    the bytes sent."""
    key, revision, sent = PODS[0], 0, 0
    while True:
        resp = kv.range(rpc_pb2.RangeRequest(key=key, range_end=PODS[1], limit=PAGE, revision=revision,
                                             keys_only=keys_only))
        sent += len(resp.SerializeToString())
        revision = resp.header.revision
        if not resp.more:
            return sent
        key = resp.kvs[-1].key + b"\x00"


def measure(n: int, seed: int, recent: float) -> list[tuple[str, float]]:
    keys = kubernetes_keys(n, seed)
    pods = sum(1 for k in keys if k.startswith(PODS[0]))
    with tempfile.TemporaryDirectory() as tmp:
        store, backend = restarted_store(Path(tmp) / "db", keys, seed, recent)
        try:
            kv = KVService(StoreReads(store))
            gc.collect()
            gc.disable()
            try:
                rows = [
                    ("keys_only Range of every key, us/key", best(lambda: keys_only_all(kv)) * 1e6 / n),
                    (f"pods in pages of {PAGE}, us/key", best(lambda: pods_in_pages(kv, False)) * 1e6 / pods),
                    (f"pods in pages of {PAGE}, keys_only, us/key", best(lambda: pods_in_pages(kv, True)) * 1e6 / pods),
                ]
            finally:
                gc.enable()
        finally:
            backend.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--recent", type=float, default=0.01, help="share of keys written again after the restart")
    args = parser.parse_args()
    t = time.perf_counter()
    rows = measure(args.keys, args.seed, args.recent)
    print(f"{args.keys} Kubernetes-shaped keys, {args.recent:.0%} rewritten after the restart "
          f"({time.perf_counter() - t:.0f} s)")
    for label, us in rows:
        print(f"| {label:<44} | {us:>7.2f} |")


if __name__ == "__main__":
    main()
