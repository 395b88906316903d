"""brain vs etcd 3.6 over plaintext and mutual TLS: the transport's figures.

    python -m benchmarks.transport_compare                 # 3 rounds, 4 s phases
    python -m benchmarks.transport_compare --rounds 1 --modes mtls --workloads put,watch

For each mode (plain: http://; mtls: https:// with --client-cert-auth, the
tool presenting a client certificate), each round starts etcd-3.6, then
brain (alternating; under mutual TLS also etcd-3.6-fast, etcd with the fast
gRPC listener, see benchmarks/servers.py), each on a fresh data dir, and runs every workload
against it with brainload (the same client for both): put, txn-put and
linearizable range with 64 clients over 8 connections and 256 B values;
watch fan-out with 1,000 watchers and 200 puts, one stream per watcher and
shared streams (125 connections).  Server CPU per op is the process
group's utime+stime over the timed phase.  Prints a table of medians and
brain/etcd ratios (under mutual TLS against the faster of etcd's two
configurations, whose CPU and p99 the table then shows); --json writes
every run.

Needs benchmarks/build.sh's etcd-3.6 and brainload (BRAIN_BENCH_CACHE).
Certificates are made for the run in its temp dir (tests.support.tls).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.servers import Brain, Etcd, Server, StartOptions, tool_path
from tests.support.tls import make_test_pki

WORKLOADS = ["put", "txn-put", "range-l", "watch", "watch-shared"]


class BrainGrpcio(Brain):
    """brain on its grpcio fallback (--grpc-front grpcio): the alternative
    the native transport replaced."""

    name = "brain-grpcio"

    def command(self, data_dir, port, peer_port, opts):
        return [*super().command(data_dir, port, peer_port, opts), "--grpc-front", "grpcio"]


def args_for(workload: str, duration: float) -> list[str]:
    unary = ["--clients", "64", "--conns", "8", "--val-size", "256", "--duration", f"{duration}s"]
    watch = ["--watchers", "1000", "--events", "200", "--writers", "4", "--rate", "0", "--val-size", "256",
             "--conns", "125", "--timeout", "40s"]
    return {
        "put": ["put", *unary],
        "txn-put": ["txn-put", *unary, "--keys", "10000"],
        "range-l": ["range", *unary],
        "watch": ["watch", *watch, "--prefix", "/bench/watch/"],
        "watch-shared": ["watch", *watch, "--prefix", "/bench/watch-shared/", "--share-streams"],
    }[workload]


def run_tool(srv: Server, workload: str, duration: float) -> dict:
    exe = tool_path("brainload")
    if exe is None:
        sys.exit("brainload is not built: run benchmarks/build.sh")
    cmd = [str(exe), *args_for(workload, duration), "--endpoints", srv.url]
    if srv.opts.tls:
        cmd += srv.opts.tls.tool_flags()
    cpu0 = srv.cpu_seconds()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    cpu = srv.cpu_seconds() - cpu0
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {p.returncode}: {p.stderr[-400:]}"}
    ops = res.get("events_delivered") if workload.startswith("watch") else res.get("ops")
    res["cpu_us_per_op"] = cpu / ops * 1e6 if ops else None
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--modes", default="plain,mtls")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--with-grpcio", action="store_true", help="also brain on its grpcio fallback")
    ap.add_argument("--tmp-root", default=None, help="parent of the data dirs (use a disk, not tmpfs)")
    a = ap.parse_args(argv)
    workloads = a.workloads.split(",")
    root = Path(tempfile.mkdtemp(prefix="brain-transport-", dir=a.tmp_root))
    tls = make_test_pki(root / "pki")
    def flavors_for(mode: str) -> list:
        etcd = [Etcd("etcd-3.6", "etcd-3.6", from_path=False)]
        if mode == "mtls":
            etcd.append(Etcd("etcd-3.6-fast", "etcd-3.6", from_path=False, fast_grpc=True))
        return etcd + [Brain()] + ([BrainGrpcio()] if a.with_grpcio else [])
    runs: list[dict] = []
    t0 = time.monotonic()
    try:
        for mode in a.modes.split(","):
            opts = StartOptions(tls=tls if mode == "mtls" else None)
            for rnd in range(a.rounds):
                for f in flavors_for(mode):
                    srv = Server(f, root / f"{mode}-{f.name}-{rnd}", opts)
                    srv.start()
                    try:
                        for w in workloads:
                            res = run_tool(srv, w, a.duration)
                            rate = res.get("delivered_per_s") if w.startswith("watch") else res.get("ops_per_s")
                            p99 = (res.get("latency_ms") or {}).get("p99")
                            runs.append({"mode": mode, "server": f.name, "round": rnd, "workload": w,
                                         "rate": rate, "p99_ms": p99, "cpu_us": res.get("cpu_us_per_op"),
                                         "error": res.get("error")})
                            cpu = res.get("cpu_us_per_op")
                            print(f"[{time.monotonic() - t0:5.0f}s] {mode:5} {f.name:13} {w:12} r{rnd}: "
                                  f"{rate or 0:9.0f}/s p99 {p99 or 0:7.1f} ms cpu {cpu or 0:6.1f} us/op"
                                  + (f" ERROR {res['error']}" if res.get("error") else ""), flush=True)
                    finally:
                        srv.stop()
                        shutil.rmtree(srv.data_dir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    extra = " brain-grpcio |" if a.with_grpcio else ""
    print(f"\n| mode | workload | etcd-3.6 | etcd-3.6-fast | brain | brain/etcd (faster etcd) "
          f"| CPU us/op etcd / brain | p99 ms etcd / brain |{extra}")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if a.with_grpcio else ""))

    def med(server, mode, w, key):
        vals = [r[key] for r in runs if (r["server"], r["mode"], r["workload"]) == (server, mode, w)
                and r[key] is not None]
        return statistics.median(vals) if vals else None

    for mode in a.modes.split(","):
        for w in workloads:
            rates = {e: med(e, mode, w, "rate") for e in ("etcd-3.6", "etcd-3.6-fast")}
            best = max((e for e in rates if rates[e]), key=lambda e: rates[e], default="etcd-3.6")
            e, b = rates[best], med("brain", mode, w, "rate")
            ce, cb = med(best, mode, w, "cpu_us"), med("brain", mode, w, "cpu_us")
            pe, pb = med(best, mode, w, "p99_ms"), med("brain", mode, w, "p99_ms")
            ratio = f"{b / e:.2f}" if e and b else "-"
            fast = f"{rates['etcd-3.6-fast']:.0f}/s" if rates["etcd-3.6-fast"] else "-"
            row = (f"| {mode} | {w} | {rates['etcd-3.6'] or 0:.0f}/s | {fast} | {b or 0:.0f}/s | {ratio} "
                   f"| {ce or 0:.0f} / {cb or 0:.0f} | {pe or 0:.1f} / {pb or 0:.1f} |")
            if a.with_grpcio:
                g, cg = med("brain-grpcio", mode, w, "rate"), med("brain-grpcio", mode, w, "cpu_us")
                row += f" {g or 0:.0f}/s, {cg or 0:.0f} us/op |"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
