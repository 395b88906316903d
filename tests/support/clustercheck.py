"""Drive the clustercheck tool (tests/cluster/go) from pytest.

clustercheck is built and cached by ``tests/cluster/build.sh``; one mode per
check, each printing one JSON object as its last stdout line:

  lin     put/get/CAS/delete on a few keys, checked by porcupine
  mutex   concurrency.Mutex around a read-modify-write counter
  write   unique-key writer: acknowledged writes with revisions, write pauses
  verify  every acknowledged write of a write --record file still there
  watch   watch continuity against a write --record file

Keyword arguments become flags (``op_timeout="2s"`` -> ``--op-timeout 2s``,
``spread=True`` -> ``--spread``, ``exclusive=False`` -> ``--exclusive=false``).
``start()`` runs the tool in the background (the test injects faults
meanwhile) and ``CheckRun.result()`` waits for it, bounded by ``--duration``
plus a margin, and kills it past that.

    run = clustercheck.start("write", cluster.endpoints, duration="20s",
                             record=tmp_path / "acked.json")
    ... kill the leader ...
    res = run.result()                      # dict, res["violations"] == 0
    clustercheck.run("verify", cluster.endpoints, record=tmp_path / "acked.json")

A run that could not be done (bad flags, no cluster: exit code 2) raises
``ClustercheckError`` with the tool's stderr; a run that found violations
(exit code 1) returns its result, for the test to assert on and print.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.binaries import clustercheck_binary


class ClustercheckError(RuntimeError):
    """clustercheck could not do the run (exit code 2 or no JSON result)."""


def _seconds(value) -> float:
    """A Go duration ("20s", "1m30s", "500ms") or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    total = 0.0
    for num, unit in re.findall(r"([\d.]+)(ms|us|µs|ns|h|m|s)", str(value)):
        total += float(num) * units[unit]
    return total


def _flags(options: dict) -> list[str]:
    args = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            args.append(flag)
        elif value is False:
            args.append(flag + "=false")
        else:
            if isinstance(value, (int, float)) and name in ("duration", "op_timeout", "settle",
                                                             "check_timeout", "lock_timeout", "retry",
                                                             "pause_threshold", "dial_timeout"):
                value = f"{value}s"
            args += [flag, str(value)]
    return args


class CheckRun:
    """One clustercheck process; ``result()`` waits for its JSON."""

    def __init__(self, mode: str, endpoints: str, options: dict, binary: str | None = None,
                 margin: float = 120.0):
        self.mode = mode
        self.binary = binary or clustercheck_binary()
        self.args = [self.binary, mode, "--endpoints", endpoints, *_flags(options)]
        # The tool stops by itself after --duration (+ --settle for watch, +
        # --check-timeout for lin); past this bound it is killed.
        self.bound = _seconds(options.get("duration", 10)) + _seconds(options.get("settle", 0)) + margin
        if mode == "lin":
            self.bound += _seconds(options.get("check_timeout", 300))
        self._stderr = tempfile.TemporaryFile()
        self.started = time.time()
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, text=True)
        self._result: dict | None = None

    def stderr(self, nbytes: int = 8000) -> str:
        self._stderr.seek(0)
        data = self._stderr.read()
        return data[-nbytes:].decode("utf-8", "replace")

    def result(self) -> dict:
        """Wait for the run (bounded) and return its JSON result."""
        if self._result is not None:
            return self._result
        remaining = max(1.0, self.started + self.bound - time.time())
        try:
            out, _ = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ClustercheckError(f"clustercheck {self.mode} still running after {self.bound:.0f} s, "
                                    f"killed\n{' '.join(self.args)}\n--- stderr ---\n{self.stderr()}")
        lines = [ln for ln in out.splitlines() if ln.strip()]
        res = None
        if lines:
            try:
                res = json.loads(lines[-1])
            except ValueError:
                res = None
        if res is None or self.proc.returncode not in (0, 1):
            raise ClustercheckError(f"clustercheck {self.mode} exited {self.proc.returncode}: "
                                    f"{(res or {}).get('failure', 'no JSON result')}\n{' '.join(self.args)}\n"
                                    f"--- stderr ---\n{self.stderr()}")
        res["stderr_tail"] = self.stderr(2000)
        self._result = res
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> "CheckRun":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        self._stderr.close()


def start(mode: str, endpoints: str, *, binary: str | None = None, **options) -> CheckRun:
    """Start ``clustercheck MODE --endpoints ENDPOINTS --<option> <value>...`` in the background."""
    return CheckRun(mode, endpoints, {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()},
                    binary=binary)


def run(mode: str, endpoints: str, **options) -> dict:
    """Run clustercheck to the end and return its JSON result."""
    with start(mode, endpoints, **options) as r:
        return r.result()


def pause_after(result: dict, t_unix: float, window: float = 10.0) -> float:
    """The write (or watch) pause caused by an event at ``t_unix`` (a kill).

    The longest gap between acknowledged writes (received events, for watch)
    that ends after ``t_unix`` and begins before ``t_unix + window``: a gap
    may begin a little after the kill (requests already committed are still
    answered) but not long after. Only gaps above the run's
    ``--pause-threshold`` are listed by the tool, so 0.0 means "none above
    it". Times in a result are relative to its ``start_unix``.
    """
    t = t_unix - result["start_unix"]
    best = 0.0
    for start_t, end_t, gap in result.get("pauses", []):
        if end_t >= t and start_t <= t + window:
            best = max(best, gap)
    return best
