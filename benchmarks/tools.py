"""The runner: starting the load tools, timing them, parsing what they print.

Load comes from etcd's own ``benchmark`` tool (put, range), ``brainload``
(benchmarks/go: everything else, one JSON line of results) and ``etcdctl
check perf``, the same binaries for every server.  Each tool's stdout and
stderr go to files under the server's ``tools/`` directory (kept with
``--keep``); brainload marks the edges of its timed phase on stderr
(PHASE_MARK), so the server's CPU can be read exactly there.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from benchmarks.servers import tool_path
from benchmarks.settings import conns_for
from tests.support.tls import TestPKI


class ToolError(RuntimeError):
    """A tool outlived its timeout, its server exited meanwhile, or it is not built."""


PHASE_MARK = "brainload-phase: "  # a tool's stderr line marking a phase edge ("timed begin", "timed end")


def tail(text: str, n: int = 600) -> str:
    """The last ``n`` characters of a tool's or server's output, stripped."""
    text = text.strip()
    return text[-n:] if len(text) > n else text


_BENCH_PCT = re.compile(r"^\s*([\d.]+)% in ([\d.]+) secs", re.M)
_BENCH_FIELD = re.compile(r"^\s*(Total|Slowest|Fastest|Average|Stddev|Requests/sec):\s*([\d.]+)", re.M)
_BENCH_ERR = re.compile(r"^\s*\[(\d+)\]\s+(.*)$", re.M)


def parse_benchmark(text: str) -> dict:
    """etcd's ``benchmark`` text summary -> brainload-shaped result."""
    fields = {k: float(v) for k, v in _BENCH_FIELD.findall(text)}
    pct = {float(p): float(s) * 1000 for p, s in _BENCH_PCT.findall(text)}
    errors = {}
    if "Error distribution:" in text:
        for n, msg in _BENCH_ERR.findall(text.split("Error distribution:", 1)[1]):
            errors[msg.strip()] = int(n)
    rps = fields.get("Requests/sec", 0.0)
    secs = fields.get("Total", 0.0)
    res = {
        "ops": int(round(rps * secs)),
        "errors": sum(errors.values()),
        "seconds": secs,
        "ops_per_s": rps,
        "latency_ms": {
            "p50": pct.get(50.0), "p90": pct.get(90.0), "p99": pct.get(99.0),
            "max": fields["Slowest"] * 1000 if "Slowest" in fields else None,
            "mean": fields["Average"] * 1000 if "Average" in fields else None,
        },
    }
    if errors:
        res["first_error"] = next(iter(errors))
        res["error_kinds"] = errors
    return res


_PERF_LINE = re.compile(r"^(PASS|FAIL)(?::\s*(.*))?$|^(Slowest request took too long|Stddev too high):?\s*(.*)$")


def parse_check_perf(text: str, rc: int) -> dict:
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    checks = []
    for ln in lines:
        m = _PERF_LINE.match(ln)
        if m and (m.group(2) or m.group(4)):
            checks.append(ln)
    verdict = "PASS" if rc == 0 and "PASS" in lines else "FAIL"
    res: dict = {"pass": verdict == "PASS", "checks": checks}
    m = re.search(r"(?:Throughput is|Throughput too low:)\s*(\d+) writes/s", text)
    if m:
        res["writes_per_s"] = int(m.group(1))
    m = re.search(r"Slowest request took(?: too long)?:?\s*([\d.]+)s", text)
    if m:
        res["slowest_s"] = float(m.group(1))
    m = re.search(r"Stddev (?:is|too high:)\s*([\d.]+)s", text)
    if m:
        res["stddev_s"] = float(m.group(1))
    return res


class ToolRunner:
    """Runs the load tools at ``target``, the server (or cluster) under test: a tool whose
    target exits meanwhile is stopped at once, and the error names the target's state."""

    def __init__(self) -> None:
        self.target = None  # benchmarks.servers.Server or benchmarks.cluster.ClusterTarget

    def run(self, cmd: list[str], timeout: float, log_dir: Path, tag: str, on_mark=None) -> tuple[int, str, str]:
        """Run a load tool; stdout/stderr go to files in ``log_dir`` and are returned.

        ``on_mark(name)`` is called as soon as the tool prints a PHASE_MARK line
        (the stderr file is read every 20 ms then, instead of every 0.5 s).
        Raises ToolError when it outlives ``timeout`` or when the target exits meanwhile."""
        log_dir.mkdir(parents=True, exist_ok=True)
        out_path, err_path = log_dir / f"{tag}.out", log_dir / f"{tag}.err"
        why = None
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(err_path, "rb") as err_reader:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout
            pending = b""

            def scan_marks(final: bool = False) -> None:
                nonlocal pending
                if on_mark is None:
                    return
                pending += err_reader.read()
                *lines, pending = pending.split(b"\n")
                if final:
                    lines.append(pending)
                for line in lines:
                    text = line.decode(errors="replace")
                    if text.startswith(PHASE_MARK):
                        on_mark(text[len(PHASE_MARK):].strip())

            try:
                while True:
                    try:
                        rc = proc.wait(timeout=0.5 if on_mark is None else 0.02)
                        # A tool that exits within a poll of its last mark: the marks
                        # not seen yet are read now (a little late, the server idle).
                        scan_marks(final=True)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    scan_marks()
                    if time.monotonic() > deadline:
                        why = f"timed out after {timeout:.0f}s"
                    elif self.target is not None and not self.target.alive():
                        srv = self.target
                        state = (srv.describe() if hasattr(srv, "describe")
                                 else f"code {srv.proc.returncode if srv.proc else None}")
                        why = (f"stopped: the server exited ({state}); "
                               f"server log tail: {tail(srv.log_tail(1000), 500)}")
                    if why:
                        break
            finally:
                if proc.poll() is None:  # timeout, dead server, or an interrupt of the harness
                    proc.kill()
                    proc.wait()
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
        if why:
            raise ToolError(f"{tag}: {Path(cmd[0]).name} {why}; its stderr tail: {tail(stderr, 300)}")
        return rc, stdout, stderr

    def brainload(self, sub: str, endpoint: str, args: list, timeout: float, log_dir: Path, tag: str,
                  tls: TestPKI | None = None, on_mark=None) -> dict:
        exe = tool_path("brainload")
        if exe is None:
            raise ToolError("brainload not built (run benchmarks/build.sh)")
        cmd = [str(exe), sub, "--endpoints", endpoint, *map(str, args), *(tls.tool_flags() if tls else [])]
        rc, stdout, stderr = self.run(cmd, timeout, log_dir, tag, on_mark=on_mark)
        result = None
        for line in reversed(stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                    break
                except ValueError:
                    continue
        if result is None:
            raise ToolError(f"brainload {sub} exit {rc}, no JSON result; stderr tail: {tail(stderr)}")
        result["_cmd"] = " ".join(cmd[1:])
        # "failure" is brainload's error text (txn-put's numeric "failed" counts else-branches).
        if result.get("failure") or isinstance(result.get("failed"), str):
            result["_error"] = result.get("failure") or result["failed"]
        elif rc != 0:
            result["_error"] = f"exit code {rc}: {tail(stderr, 300)}"
        return result

    def etcd_benchmark(self, endpoint: str, clients: int, sub: list, total: int, timeout: float, log_dir: Path,
                       tag: str, tls: TestPKI | None = None) -> dict:
        exe = tool_path("benchmark")
        if exe is None:
            raise ToolError("benchmark not built")
        cmd = [str(exe), "--endpoints", endpoint, "--clients", str(clients), "--conns", str(conns_for(clients)),
               *(tls.tool_flags() if tls else []), *sub, "--total", str(total)]
        rc, stdout, stderr = self.run(cmd, timeout, log_dir, tag)
        res = parse_benchmark(stdout)
        res["_cmd"] = " ".join(cmd[1:])
        res["clients"] = clients
        if rc != 0:
            res["_error"] = f"exit code {rc}: {tail(stderr, 300)}"
        elif res["ops"] == 0:
            res["_error"] = res.get("first_error") or f"no successful requests; stderr tail: {tail(stderr, 300)}"
        return res
