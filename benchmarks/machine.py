"""Facts about the machine and the binaries of a run, for the report's header:
CPU, memory, kernel, the data dir's filesystem, load averages (other work on
the machine shows there), the modules a Go tool was built from, brain's
checkpoint thresholds; and the disk use of a data dir."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path


def du_kb(path: Path) -> int:
    """Disk use of a directory tree (allocated blocks, as du counts them)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for fn in files:
            try:
                total += os.lstat(os.path.join(dirpath, fn)).st_blocks * 512
            except OSError:
                pass
    return total // 1024


def first_line(cmd: list[str]) -> str | None:
    """The first line a command prints (stdout, else stderr), or None when it prints nothing or fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0].strip() if text else None


def go_module_version(path: Path) -> str:
    """`go version -m`: the main module and version a Go binary was built from."""
    go = shutil.which("go")
    if go:
        try:
            out = subprocess.run([go, "version", "-m", str(path)], capture_output=True, text=True, timeout=20).stdout
            mod = re.search(r"^\s*mod\s+(\S+)\s+(\S+)", out, re.M)
            gov = re.search(r":\s*(go[\d.]+)", out)
            deps = dict(re.findall(r"^\s*dep\s+(go\.etcd\.io/etcd/\S+|github\.com/k3s-io/kine)\s+(\S+)", out, re.M))
            bits = [f"{mod.group(1)} {mod.group(2)}" if mod else path.name]
            for k in ("go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/etcdctl/v3", "github.com/k3s-io/kine"):
                if k in deps:
                    bits.append(f"{k} {deps[k]}")
            if gov:
                bits.append(gov.group(1))
            return ", ".join(bits)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return path.name


def brain_checkpoint_thresholds() -> dict:
    """brain's defaults: a checkpoint starts when any one is reached."""
    from brain.engine.config import EngineConfig

    c = EngineConfig(data_dir="")
    return {"seconds": c.checkpoint_interval_seconds, "journal_bytes": c.checkpoint_journal_bytes,
            "memtable_records": c.checkpoint_memtable_records}


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine shows here."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_facts(tmp_root: Path) -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    fs = first_line(["stat", "-f", "-c", "%T", str(tmp_root)])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1) if mem_kb else None,
        "python": platform.python_version(),
        "data_dir_fs": fs,
        "load_average_start": load_average(),
    }
