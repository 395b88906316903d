"""Quick LMDB backend timings (not a test): python tests/backend/bench_lmdb.py"""

from __future__ import annotations

import os
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from brain.backend import LmdbBackend, WriteBatch  # noqa: E402


def rev(main: int) -> bytes:
    return struct.pack(">QQ", main, 0)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def main() -> None:
    n = 100_000
    value = os.urandom(300)
    with tempfile.TemporaryDirectory() as tmp, LmdbBackend(Path(tmp) / "db", 4) as backend:
        base = [0]

        def write_batch() -> None:
            start = base[0]
            base[0] += n
            backend.write(WriteBatch(puts=[(0, rev(i), value) for i in range(start, start + n)]))

        lo, med = best(write_batch, 5)
        print(f"write 100k x 300 B puts (append path): best {lo * 1e3:.1f} ms, median {med * 1e3:.1f} ms")

        def write_shuffled() -> None:
            keys = [rev(i) for i in range(base[0], base[0] + n)]
            base[0] += n
            random.shuffle(keys)
            backend.write(WriteBatch(puts=[(1, k, value) for k in keys]))

        lo, med = best(write_shuffled, 3)
        print(f"write 100k x 300 B puts (shuffled):    best {lo * 1e3:.1f} ms, median {med * 1e3:.1f} ms")

        total = base[0]
        keys = [rev(random.randrange(0, 5 * n)) for _ in range(200_000)]
        get = backend.get
        started = time.perf_counter()
        for k in keys:
            get(0, k)
        per_get = (time.perf_counter() - started) / len(keys)
        print(f"get (hit, random of {5 * n}):          {per_get * 1e6:.2f} us")

        batches = [random.sample(range(5 * n), 1000) for _ in range(200)]
        batches = [[rev(i) for i in b] for b in batches]
        started = time.perf_counter()
        for b in batches:
            backend.get_many(0, b)
        per_many = (time.perf_counter() - started) / len(batches)
        print(f"get_many 1000 random keys:             {per_many * 1e6:.0f} us")

        started = time.perf_counter()
        count = sum(1 for _ in backend.scan(0))
        print(f"scan {count} entries:                  {(time.perf_counter() - started) * 1e3:.0f} ms")

        started = time.perf_counter()
        backend.write(WriteBatch(deletes=[(0, rev(i)) for i in range(n)]))
        print(f"write 100k deletes:                    {(time.perf_counter() - started) * 1e3:.1f} ms")
        stats = backend.statistics()
        print(f"statistics: {stats}  (total puts {total})")


if __name__ == "__main__":
    main()
