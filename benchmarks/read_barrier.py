"""What a linearizable range costs on a 3-replica brain cluster: the read
index (brain.engine.readindex) and the range behind it, on the leader and
on a follower, with and without the leader's read lease.

    python3 -m benchmarks.read_barrier [--seconds 5] [--readers 1,16] [--json out.json]

Three nats-servers (``sync_interval: always``, an R3 journal) and three
replicas in this process (brain.cluster.Replica, the engine's API: no gRPC
in the way, so the figures are the read path's own).  Each row runs
``readers`` threads that loop ``wait_linearizable()`` + ``range`` for
``--seconds`` and reports reads/s and the latency percentiles.  The brain
it measures is the one on ``sys.path``: run it once per tree, in the same
shell session, to compare two versions.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from brain.cluster import ClusterOptions, Replica
from brain.engine import EngineConfig
from brain.mvcc.requests import PutRequest, RangeRequest
from tests.support.nats_cluster import NatsCluster


def _open_replicas(nats: NatsCluster, root: Path, name: str, read_lease: bool) -> list[Replica]:
    replicas = []
    for i in range(3):
        member = f"r{i}"
        options = ClusterOptions(journal_url=f"{nats.urls[i]}/{name}", name=member,
                                 client_urls=(f"http://{member}:2379",), read_lease=read_lease)
        replicas.append(Replica.open(options, EngineConfig(str(root / name / member))))
    for r in replicas:
        r.start()
    return replicas


def _leader(replicas: list[Replica], timeout: float = 30.0) -> Replica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in replicas:
            if r.engine.is_leader:
                return r
        time.sleep(0.02)
    raise RuntimeError("no leader elected")


def _measure(replica: Replica, readers: int, seconds: float) -> dict:
    """``readers`` threads reading one key linearizably for ``seconds``."""
    engine = replica.engine
    latencies: list[list[float]] = [[] for _ in range(readers)]
    errors = [0]
    stop = time.monotonic() + seconds

    def read(out: list[float]) -> None:
        req = RangeRequest(b"bench/key")
        while True:
            t0 = time.perf_counter()
            if time.monotonic() >= stop:
                return
            try:
                engine.wait_linearizable()
                engine.range(req)
            except Exception:  # noqa: BLE001 - counted, the run goes on
                errors[0] += 1
                continue
            out.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=read, args=(latencies[i],)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(x for lat in latencies for x in lat)
    if not every:
        return {"reads_per_s": 0.0, "errors": errors[0]}
    q = statistics.quantiles(every, n=100) if len(every) > 1 else [every[0]] * 99
    return {"reads_per_s": round(len(every) / seconds, 1), "p50_ms": round(q[49] * 1e3, 3),
            "p99_ms": round(q[98] * 1e3, 3), "errors": errors[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--readers", default="1,16", help="comma-separated reader thread counts")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # replicas closing say so at WARNING
    counts = [int(x) for x in args.readers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="read-barrier-") as tmp, NatsCluster(3, sync_always=True) as nats:
        for read_lease in (True, False):
            name = f"rb{'lease' if read_lease else 'nolease'}{int(time.time()) % 100000}"
            replicas = _open_replicas(nats, Path(tmp), name, read_lease)
            try:
                lead = _leader(replicas)
                lead.engine.put(PutRequest(b"bench/key", b"v"))
                follower = next(r for r in replicas if r is not lead)
                for role, r in (("leader", lead), ("follower", follower)):
                    for n in counts:
                        row = {"read_lease": read_lease, "on": role, "readers": n} | _measure(r, n, args.seconds)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                for r in replicas:
                    r.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
