"""Both sides of a scale read, profiled: where the client's and the server's CPU goes.

The scale group's reads recorded the client's CPU as the whole brainload
process's getrusage, which says nothing of what in it was decoding, so "a
list is bounded by the client's decoding" was an assertion.  With
``--profile-scale-reads`` each read of the scale group (the paged lists, the
RangeStream, the keys_only Range) runs once more after its timed run, under
two profilers, and the record of the timed run gets the profiles' summary in
``result["profile"]``; the timed figures are never taken under a profiler.

- The client: brainload writes a Go CPU profile of the read (runtime/pprof,
  ``scale-read --cpu-profile``).  ``go tool pprof -top`` gives its functions
  (kept in the results), ``go tool pprof -traces`` every sampled stack, which
  ``client_split`` sorts into decoding (a stack through a protobuf
  ``Unmarshal``: the decoding and the allocation it does), background garbage
  collection, the gRPC transport and system calls, and the rest.
- The server (brain only, a Python process): py-spy samples every non-idle
  thread while the read runs (``py-spy record --format raw --threads``), and
  ``server_by_function`` counts each function's samples, its own (self) and
  with what it called (total).  etcd is a Go process without a profiling
  endpoint in its default configuration: its side is not profiled.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# How a client stack is classed: the first rule any of its frames matches.
CLIENT_CLASSES = (
    ("decoding", re.compile(r"Unmarshal")),
    ("garbage collection", re.compile(r"^runtime\.(gcBgMarkWorker|bgsweep|bgscavenge)")),
    ("gRPC transport and system calls", re.compile(r"^(google\.golang\.org/grpc|golang\.org/x/net/http2)|[Ss]yscall")),
)
OTHER = "the rest (scheduler, the tool's own code)"
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}
_VALUE = re.compile(r"^\s*([\d.]+)(ns|us|µs|ms|s|mins|hrs)\s+(\S.*)$")


def parse_traces(text: str) -> list[tuple[float, list[str]]]:
    """``go tool pprof -traces`` output as (seconds, frames leaf first) per sampled stack."""
    out: list[tuple[float, list[str]]] = []
    for block in text.split("-----------+")[1:]:
        lines = [ln for ln in block.splitlines()[1:] if ln.strip()]
        if not lines:
            continue
        m = _VALUE.match(lines[0])
        if m is None:
            continue
        frames = [m.group(3)] + [ln.strip() for ln in lines[1:]]
        out.append((float(m.group(1)) * _UNITS[m.group(2)], [f.removesuffix(" (inline)") for f in frames]))
    return out


def client_split(traces: list[tuple[float, list[str]]]) -> dict:
    """The client's CPU seconds by class (CLIENT_CLASSES, then OTHER), each with its share."""
    seconds: Counter = Counter()
    for value, frames in traces:
        cls = next((name for name, rule in CLIENT_CLASSES if any(rule.search(f) for f in frames)), OTHER)
        seconds[cls] += value
    total = sum(seconds.values())
    return {"cpu_s": round(total, 3),
            "classes": [{"class": c, "cpu_s": round(seconds[c], 3),
                         "share": round(seconds[c] / total, 3) if total else 0}
                        for c in [n for n, _ in CLIENT_CLASSES] + [OTHER]]}


_LINE = re.compile(r":\d+\)$")


def parse_raw(text: str) -> list[tuple[int, str, list[str]]]:
    """py-spy's raw (collapsed) stacks with --threads as (samples, thread, frames root first)."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames.pop(0) if frames and frames[0].startswith(("thread ", "process ")) else ""
        # One function at any line: "f (file.py:12)" -> "f (file.py)".
        out.append((int(count), thread, [_LINE.sub(")", f) for f in frames]))
    return out


def server_by_function(stacks: list[tuple[int, str, list[str]]], top: int = 15) -> dict:
    """The server's samples by function: its own samples (the frame running) and its total (it or what it
    called), the largest ``top`` of each with their shares, and the samples by thread."""
    total = sum(n for n, _, _ in stacks)
    own: Counter = Counter()
    incl: Counter = Counter()
    threads: Counter = Counter()
    for n, thread, frames in stacks:
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            if "(threading.py)" not in f:  # every thread's bootstrap: in every sample of it, says nothing
                incl[f] += n
        threads[re.sub(r"^thread \(\w+\):?\s*", "", thread) or "?"] += n

    def rows(counter: Counter) -> list[dict]:
        return [{"function": f, "samples": n, "share": round(n / total, 3) if total else 0}
                for f, n in counter.most_common(top)]
    return {"samples": total, "self": rows(own), "total": rows(incl),
            "threads": [{"thread": t, "samples": n, "share": round(n / total, 3) if total else 0}
                        for t, n in threads.most_common()]}


def go_tool() -> str | None:
    return shutil.which("go")


def pprof(profile: Path, *args: str) -> str:
    """``go tool pprof ARGS PROFILE``'s output (the profile holds its symbols: no binary needed)."""
    go = go_tool()
    if go is None:
        raise RuntimeError("go is not on PATH: cannot read the client's CPU profile")
    r = subprocess.run([go, "tool", "pprof", *args, str(profile)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"go tool pprof {' '.join(args)}: {r.stderr.strip()[-500:]}")
    return r.stdout


def client_profile(profile: Path, nodecount: int = 25) -> dict:
    """The client's CPU profile summarised: the split by class and ``go tool pprof -top``'s lines."""
    top = pprof(profile, "-top", f"-nodecount={nodecount}")
    return {**client_split(parse_traces(pprof(profile, "-traces"))),
            "top": [ln for ln in top.splitlines() if ln.strip()][:nodecount + 8]}


def py_spy() -> str | None:
    """py-spy beside this Python (the bench extra installs it) or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.is_file() else shutil.which("py-spy")


class ServerSampler:
    """py-spy recording ``pid`` (every non-idle thread, ``rate`` samples/s) into ``out`` from ``__enter__``
    to ``__exit__`` (SIGINT: py-spy writes its file and exits)."""

    def __init__(self, pid: int, out: Path, rate: int = 100):
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy is not installed (pip install -e '.[bench]')")
        self.out = out
        self.cmd = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--threads",
                    "--nonblocking", "--output", str(out)]
        self.proc: subprocess.Popen | None = None
        self.stderr = ""

    def __enter__(self) -> "ServerSampler":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)  # attached before the read starts
        if self.proc.poll() is not None:
            raise RuntimeError(f"py-spy exited at once: {self.proc.stderr.read()[-500:]}")
        return self

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, self.stderr = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()

    def summary(self, top: int = 15) -> dict:
        if not self.out.is_file():
            raise RuntimeError(f"py-spy wrote no profile: {self.stderr.strip()[-500:]}")
        return {"profiler": "py-spy record --format raw --threads --nonblocking (non-idle threads)",
                **server_by_function(parse_raw(self.out.read_text()), top)}


def one_line(profile: dict) -> str:
    """A profiled read in a line: the client's split, the server's CPU and its busiest function."""
    if profile.get("error"):
        return "ERROR " + profile["error"][:300]
    bits = []
    client = profile.get("client") or {}
    if client:
        bits.append(f"client {client['cpu_s']:.2f} s of CPU sampled: " + ", ".join(
            f"{c['class']} {c['share']:.0%}" for c in client["classes"]))
    if profile.get("server_cpu_s") is not None:
        bits.append(f"server {profile['server_cpu_s']:.2f} s of CPU")
    server = profile.get("server")
    if isinstance(server, dict) and server.get("self"):
        first = server["self"][0]
        bits.append(f"busiest function {first['function']} {first['share']:.0%} of {server['samples']} samples")
    elif isinstance(server, str):
        bits.append(server)
    return "; ".join(bits)
