"""The front's Python side fuzzed: request bytes of every method brain
serves (KV, Watch, Lease, Maintenance, Cluster, grpc.health.v1) through
parse, convert, validate and the engine, on the real native front with a
stand-in transport (tests.fuzz.api_target).  Every call must end in a
response or etcd's error, never another exception, a hang or a session
left open.

The checked-in corpus (tests/fuzz/corpus/api: seeds from tests.fuzz.seeds,
the fuzzer's finds, regress-* inputs that found a bug) is replayed in
process; then atheris fuzzes from it for BRAIN_FUZZ_SECONDS (10 under
`make test`, longer under `make test-full`), writing what it finds to a
temporary directory.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import seeds
from tests.fuzz.api_target import ROOT_ENV, FrontTarget, make_root
from tests.support.servers import REPO_ROOT, unavailable

CORPUS = Path(__file__).resolve().parent / "corpus" / "api"
FUZZ_SECONDS = int(os.environ.get("BRAIN_FUZZ_SECONDS", "10"))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    with FrontTarget() as t:
        yield t


def test_seeds_name_the_methods_in_the_targets_order(target) -> None:
    assert [path for path, _, _ in target.methods] == seeds.PATHS


def test_every_method_has_a_seed() -> None:
    assert sorted(seeds.seeds()) == seeds.PATHS
    for name, data in seeds.inputs().items():
        assert (CORPUS / name).read_bytes() == data, f"{name}: run python -m tests.fuzz.seeds"


def test_the_corpus_replays(target) -> None:
    files = sorted(CORPUS.iterdir())
    assert len(files) >= len(seeds.PATHS)
    for f in files:
        target.run(f.read_bytes())


@pytest.mark.timeout(FUZZ_SECONDS + 600)  # past pytest's 300 s under make test-full (300 s a target)
def test_atheris_finds_nothing_new(tmp_path) -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        unavailable("atheris is not installed (pip install -e '.[test]' installs it)")
    new = tmp_path / "new"
    new.mkdir()
    cmd = [sys.executable, "-m", "tests.fuzz.atheris_api", str(new), str(CORPUS),
           f"-max_total_time={FUZZ_SECONDS}", f"-artifact_prefix={tmp_path}/", "-timeout=60", "-rss_limit_mb=4096",
           "-max_len=4096"]
    root = make_root()  # the fuzzing process ends by exit() and cannot remove it
    try:
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=FUZZ_SECONDS + 300,
                           env=os.environ | {ROOT_ENV: root})
        used = os.path.isdir(os.path.join(root, "data"))  # its engine was here, so nothing is left behind
    finally:
        shutil.rmtree(root, ignore_errors=True)
    crashes = [p for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-"))]
    found = "\n".join(f"{p.name}: {base64.b64encode(p.read_bytes()).decode()}" for p in crashes)
    assert r.returncode == 0 and not crashes, (
        f"atheris found an input the front mishandles (base64; keep it in {CORPUS} as regress-*):\n{found}\n"
        f"{r.stderr[:2000]}\n[...]\n{r.stderr[-6000:]}")
    assert used, f"the fuzzing process did not keep its engine in {ROOT_ENV}"
    done = re.search(r"Done (\d+) runs in (\d+) second", r.stderr)
    assert done, r.stderr[-3000:]
    cov = re.findall(r"cov: (\d+)", r.stderr)
    print(f"atheris: {done.group(1)} runs in {done.group(2)} s, cov {cov[-1] if cov else '?'}, "
          f"{len(list(new.iterdir()))} new inputs")
    assert int(done.group(1)) > 100
