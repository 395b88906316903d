"""The key index measured in process: the overlay alone (a SortedDict of
KeyIndex objects, the index before issue 17) against packed blocks
(brain.mvcc.packed), on the same synthetic Kubernetes-shaped keys.

    python3 -m benchmarks.index_memory [--keys 100000] [--seed 1]

Per key: bytes of the index (tracemalloc: everything the structure
allocates, the key objects included), a walk at the newest revision
(Shard.key_indexes plus get), building it (the overlay by one Shard.put per
revision, the blocks by Shard.load from the record heads a restart
reads), a put of an existing key (for blocks: its first write since they
were built) and of a new key, a rewrite cycle (the same 3% of keys, node
leases renewed, plus 3% others once, each cycle; with blocks, the merges
the store runs to bring the overlay back to its floor are in the time),
and a compaction pass (the first drops every older revision, the second
finds nothing to do); plus one live count of the pods prefix.  Times are per key, best of three;
read them as ratios within one run, since other load on the machine moves
them together.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from typing import Callable

from brain.backend import MemoryBackend
from brain.mvcc.packed import BLOCK_KEYS, StoredHead, pack_stored
from brain.mvcc.revision import pack
from brain.mvcc.shard import Shard
from brain.mvcc.store import Store

SECOND_REVISION = 0.20  # share of keys written twice
CYCLE_HOT, CYCLE_OTHERS, CYCLES = 0.03, 0.03, 4  # the rewrite cycle: shares of keys, cycles run


def kubernetes_keys(n: int, seed: int) -> list[bytes]:
    """Key shapes as issue 17 lists them: 40% node leases, 25% events, 20%
    pods, 15% other resources."""
    rng = random.Random(seed)
    namespaces = [f"ns-{i:04d}" for i in range(200)]
    others = ["configmaps", "secrets", "services", "serviceaccounts", "deployments", "replicasets"]
    keys = set()
    while len(keys) < n:
        r = rng.random()
        ns = rng.choice(namespaces)
        if r < 0.40:
            key = f"/registry/leases/kube-node-lease/node-{rng.randrange(10**7):07d}"
        elif r < 0.65:
            key = f"/registry/events/{ns}/app-{rng.randrange(10**5)}.{rng.getrandbits(64):016x}"
        elif r < 0.85:
            key = f"/registry/pods/{ns}/app-{rng.randrange(10**4)}-{rng.getrandbits(40):010x}"
        else:
            key = f"/registry/{rng.choice(others)}/{ns}/obj-{rng.randrange(10**6)}"
        keys.add(key.encode())
    out = sorted(keys)
    rng.shuffle(out)
    return out


def writes(keys: list[bytes], seed: int) -> list[bytes]:
    """The keys in write order: each once, then a share of them again."""
    rng = random.Random(seed + 1)
    return keys + rng.sample(keys, int(len(keys) * SECOND_REVISION))


def overlay_shard(order: list[bytes]) -> Shard:
    shard = Shard(0, None)
    for main, key in enumerate(order, start=2):
        shard.put(pack(main, 0), key, b"", 0)
    shard.freeze()  # records, not index: dropped as a written checkpoint drops them
    shard.release_frozen()
    return shard


def stored_heads(order: list[bytes]) -> dict[bytes, StoredHead | list[StoredHead]]:
    """What a restart collects from the records before packing
    (brain.mvcc.replay.load_records)."""
    heads: dict[bytes, StoredHead | list[StoredHead]] = {}
    for main, key in enumerate(order, start=2):
        seen = heads.get(key)
        rev = pack(main, 0)
        if seen is None:
            heads[key] = (rev, False, rev, 1, 0)
        else:
            if type(seen) is tuple:
                seen = heads[key] = [seen]
            seen.append((rev, False, seen[0][2], len(seen) + 1, 0))
    return heads


def packed_shard(order: list[bytes]) -> Shard:
    shard = Shard(0, None)
    shard.load(pack_stored(stored_heads(order), shard.block_size))
    return shard


def traced_bytes(build: Callable[[], Shard]) -> tuple[Shard, int]:
    """The structure `build` returns and the bytes still allocated for it."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    shard = build()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return shard, used


def best(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def best_packing(order: list[bytes], repeat: int = 3) -> float:
    """The best time of Shard.load packing a restart's record heads (the
    heads are collected outside the timing; packing consumes them)."""
    times = []
    for _ in range(repeat):
        heads = stored_heads(order)
        t = time.perf_counter()
        Shard(0, None).load(pack_stored(heads, BLOCK_KEYS))
        times.append(time.perf_counter() - t)
    return min(times)


def walk(shard: Shard, at: int) -> int:
    found = 0
    for ki in shard.key_indexes(b"", None):
        if ki.get(at) is not None:
            found += 1
    return found


def puts(shard: Shard, keys: list[bytes], rev: int) -> float:
    """us per put of `keys`, the best of three thirds (each key written once)."""
    third = len(keys) // 3
    times = []
    for part in (keys[:third], keys[third:2 * third], keys[2 * third:3 * third]):
        t = time.perf_counter()
        for key in part:
            rev += 1
            shard.put(pack(rev, 0), key, b"", 0)
        times.append((time.perf_counter() - t) * 1e6 / len(part))
    return min(times)


def rewrite_cycles(shard: Shard, keys: list[bytes], rev: int, seed: int, merges: bool) -> float:
    """us per written key of the last of CYCLES cycles, each writing the
    same CYCLE_HOT share of `keys` and a fresh CYCLE_OTHERS share, then
    (`merges`) merging as the store does between batches until no merge
    is due."""
    rng = random.Random(seed + 3)
    picked = rng.sample(keys, int(len(keys) * (CYCLE_HOT + CYCLE_OTHERS * CYCLES)))
    hot, others = picked[:int(len(keys) * CYCLE_HOT)], picked[int(len(keys) * CYCLE_HOT):]
    floor = Store(MemoryBackend(1), []).overlay_floor(shard)
    per_key = 0.0
    for cycle in range(CYCLES):
        batch = hot + others[cycle * len(others) // CYCLES:(cycle + 1) * len(others) // CYCLES]
        rng.shuffle(batch)
        t = time.perf_counter()
        for key in batch:
            rev += 1
            shard.put(pack(rev, 0), key, b"", 0)
        while merges and shard.merge_due(floor):
            shard.merge(2000, floor)
        per_key = (time.perf_counter() - t) * 1e6 / len(batch)
    return per_key


def compact_all(shard: Shard, rev: int) -> None:
    cursor = None
    while True:
        cursor, _ = shard.compact(rev, cursor, 1 << 30)
        if cursor is None:
            return


def measure(n: int, seed: int) -> list[tuple[str, float, float]]:
    keys = kubernetes_keys(n, seed)
    order = writes(keys, seed)
    newest = len(order) + 1
    gc.disable()  # keep collections out of the timings (and out of the byte counts)
    try:
        overlay, overlay_bytes = traced_bytes(lambda: overlay_shard(order))
        packed, packed_bytes = traced_bytes(lambda: packed_shard(order))
        assert walk(overlay, newest) == walk(packed, newest) == n
        rows = [("index bytes per key", overlay_bytes / n, packed_bytes / n)]
        per_key_us = 1e6 / n
        rows.append(("walk at the newest revision, us/key",
                     best(lambda: walk(overlay, newest)) * per_key_us, best(lambda: walk(packed, newest)) * per_key_us))
        rows.append(("build, us/key (overlay: puts; blocks: load)",
                     best(lambda: overlay_shard(order), 1) * 1e6 / len(order),
                     best_packing(order) * per_key_us))
        pods = (b"/registry/pods/", b"/registry/pods0")
        assert overlay.live_count(*pods) == packed.live_count(*pods)
        rows.append(("live count of /registry/pods/, us",
                     best(lambda: overlay.live_count(*pods), 100) * 1e6, best(lambda: packed.live_count(*pods), 100) * 1e6))
        sample = random.Random(seed + 2).sample(keys, min(n, 20000))
        fresh = [b"/registry/zz-new/" + k for k in sample]
        for batch, (label, keys_put) in enumerate((("put of an existing key, us", sample),
                                                   ("put of a new key, us", fresh))):
            rev = newest + batch * len(sample)  # each batch above the last: puts are newer than anything indexed
            rows.append((label, *(puts(shard, keys_put, rev) for shard in (overlay, packed))))
        rev = newest + 2 * len(sample)
        rows.append(("rewrite cycle, us/key (blocks: merges included)",
                     rewrite_cycles(overlay_shard(order), keys, rev, seed, False),
                     rewrite_cycles(packed_shard(order), keys, rev, seed, True)))
        overlay2, packed2 = overlay_shard(order), packed_shard(order)
        for label in ("compaction pass at the newest revision, us/key", "the same pass again, us/key"):
            rows.append((label, best(lambda: compact_all(overlay2, newest), 1) * per_key_us,
                         best(lambda: compact_all(packed2, newest), 1) * per_key_us))
    finally:
        gc.enable()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rows = measure(args.keys, args.seed)
    print(f"{args.keys} Kubernetes-shaped keys, {SECOND_REVISION:.0%} written twice")
    print(f"| {'measure':<48} | {'overlay (KeyIndex)':>18} | {'packed blocks':>13} |")
    print(f"|{'-' * 50}|{'-' * 20}|{'-' * 15}|")
    for label, a, b in rows:
        print(f"| {label:<48} | {a:>18.2f} | {b:>13.2f} |")


if __name__ == "__main__":
    main()
