"""How far `brain mirror` trails an etcd under write load.

    python -m benchmarks.mirror_lag [--rates 1000,2000,4000,0] [--seconds 20]

Starts etcd 3.6 (benchmarks/build.sh's) on loopback, preloads keys, starts
`brain mirror --from` it, then for each rate (puts/s; 0 = as fast as etcd
takes them) runs etcd's `benchmark put` (32 clients, 256 B values) for the
given seconds while sampling the mirror's metrics four times a second:
brain_mirror_lag_revisions and brain_mirror_lag_seconds.  Reports, per rate,
what etcd achieved, the lag's p50/p99/max and how long the mirror took to
catch up once the load stopped.  Everything runs on this machine, so the
mirror and etcd share its cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.support.harness import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


def bin_dir() -> Path:
    explicit = os.environ.get("BRAIN_BENCH_BIN")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("BRAIN_BENCH_CACHE", REPO_ROOT / ".cache" / "bench")) / "bin"


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(brain_mirror_\w+) (\S+)$", body, re.M)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,2000,4000,0", help="puts/s per phase; 0 = unthrottled")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--preload", type=int, default=20000)
    args = ap.parse_args(argv)
    b = bin_dir()
    for tool in ("etcd-3.6", "benchmark"):
        if not (b / tool).is_file():
            print(f"{b / tool} missing: run benchmarks/build.sh", file=sys.stderr)
            return 2
    root = Path(tempfile.mkdtemp(prefix="brain-mirror-lag-"))
    port, peer, mport = free_port(), free_port(), free_port()
    ep = f"127.0.0.1:{port}"
    etcd = subprocess.Popen([str(b / "etcd-3.6"), "--name", "e", "--data-dir", str(root / "etcd"),
                             "--listen-client-urls", f"http://{ep}", "--advertise-client-urls", f"http://{ep}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
                             f"http://127.0.0.1:{peer}", "--initial-cluster", f"e=http://127.0.0.1:{peer}",
                             "--quota-backend-bytes", str(8 << 30)],
                            stdout=open(root / "etcd.log", "wb"), stderr=subprocess.STDOUT)
    mirror = None
    try:
        time.sleep(2)
        bench = [str(b / "benchmark"), "--endpoints", ep, "--clients", "32", "--conns", "4", "put",
                 "--key-size", "32", "--val-size", "256", "--key-space-size", "50000"]
        subprocess.run([*bench, "--total", str(args.preload)], capture_output=True, check=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        mirror = subprocess.Popen([sys.executable, "-m", "brain", "mirror", "--from", f"http://{ep}",
                                   "--data-dir", str(root / "brain"), "--listen-metrics-urls",
                                   f"http://127.0.0.1:{mport}", "--progress-interval", "10s"],
                                  stdout=open(root / "mirror.log", "wb"), stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                  env=env)
        deadline = time.time() + 120
        while True:
            try:
                if metrics(mport).get("brain_mirror_following") == 1:
                    break
            except OSError:
                pass
            if time.time() > deadline or mirror.poll() is not None:
                print((root / "mirror.log").read_text()[-2000:], file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"{'rate':>8} {'etcd puts/s':>12} {'lag rev p50':>12} {'p99':>8} {'max':>8} "
              f"{'lag s p50':>10} {'p99':>8} {'max':>8} {'catch-up s':>11}")
        for rate in [int(x) for x in args.rates.split(",")]:
            total = int((rate or 8000) * args.seconds)
            cmd = [*bench, "--total", str(total)] + (["--rate", str(rate)] if rate else [])
            samples: list[tuple[float, float]] = []
            stop = threading.Event()

            def sample():
                while not stop.wait(0.25):
                    try:
                        m = metrics(mport)
                        samples.append((m["brain_mirror_lag_revisions"], m["brain_mirror_lag_seconds"]))
                    except OSError:
                        pass

            t = threading.Thread(target=sample, daemon=True)
            t.start()
            r = subprocess.run(cmd, capture_output=True, text=True)
            achieved = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
            t0 = time.monotonic()
            while metrics(mport)["brain_mirror_lag_revisions"] > 0 and time.monotonic() - t0 < 300:
                time.sleep(0.05)
            catch_up = time.monotonic() - t0
            stop.set()
            t.join()
            revs = [s[0] for s in samples]
            secs = [s[1] for s in samples]
            print(f"{rate or 'max':>8} {float(achieved.group(1)) if achieved else 0:12.0f} {pct(revs, .5):12.0f} "
                  f"{pct(revs, .99):8.0f} {max(revs, default=0):8.0f} {pct(secs, .5):10.3f} {pct(secs, .99):8.3f} "
                  f"{max(secs, default=0):8.3f} {catch_up:11.2f}", flush=True)
        mirror.send_signal(signal.SIGTERM)
        mirror.wait(120)
        print(f"mirror exit {mirror.returncode}; {[x for x in (root / 'mirror.log').read_text().splitlines() if 'stopped at' in x]}")
        return 0
    finally:
        if mirror is not None and mirror.poll() is None:
            mirror.kill()
        etcd.terminate()
        etcd.wait(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
