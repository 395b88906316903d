"""The transport's parsers of client bytes fuzzed (native/wire, brain-wire):
gRPC message framing, the HPACK authority rewriter of unix sockets,
HTTP/1.1 sniffing and request heads, etcd's TxnRequest.

brain-wire's unit tests run first (the regression tests of what the fuzzers
found are among them); then each cargo-fuzz target of native/fuzz replays
its checked-in corpus (tests/fuzz/corpus/<target>) and fuzzes from it for
BRAIN_FUZZ_SECONDS (10 under `make test`, longer under `make test-full`).

cargo-fuzz runs with ``-s none``, libFuzzer's coverage without a sanitizer,
which stable Rust can build: brain-wire has no unsafe code for
AddressSanitizer to watch, and what the targets look for (panics, overflow
with debug assertions on, wrong answers) needs none.  `make deps-fuzz`
installs cargo-fuzz (`cargo install cargo-fuzz`).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.servers import REPO_ROOT, unavailable

TARGETS = ["grpc_frames", "authority", "http1", "txn"]
CORPUS = Path(__file__).resolve().parent / "corpus"
FUZZ_SECONDS = int(os.environ.get("BRAIN_FUZZ_SECONDS", "10"))
# one build cache per checkout, apart from the transport's (other flags)
TARGET_DIR = REPO_ROOT / ".cache" / "cargo-fuzz"
NATIVE = REPO_ROOT / "native"


def _cargo() -> str:
    cargo = shutil.which("cargo")
    if cargo is None:
        unavailable("cargo not found (rustup; `make deps` builds the transport with it)")
    return cargo


def _env() -> dict:
    env = dict(os.environ)
    env.pop("CARGO_TARGET_DIR", None)  # --target-dir says where
    env.pop("RUSTFLAGS", None)
    return env


def test_brain_wire_unit_tests() -> None:
    r = subprocess.run([_cargo(), "test", "--quiet", "--manifest-path", str(NATIVE / "wire" / "Cargo.toml"),
                        "--target-dir", str(TARGET_DIR)], capture_output=True, text=True, env=_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert re.search(r"test result: ok\. [1-9]\d* passed", r.stdout), r.stdout


@pytest.fixture(scope="module")
def fuzz_built() -> str:
    cargo = _cargo()
    v = subprocess.run([cargo, "fuzz", "--version"], capture_output=True, text=True, env=_env())
    if v.returncode != 0:
        unavailable("cargo-fuzz is not installed (`make deps-fuzz`: cargo install cargo-fuzz)")
    r = subprocess.run([cargo, "fuzz", "build", "-s", "none", "--target-dir", str(TARGET_DIR)], cwd=NATIVE,
                       capture_output=True, text=True, env=_env(), timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return cargo


@pytest.mark.fuzz_rust
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(FUZZ_SECONDS + 600)  # past pytest's 300 s under make test-full (300 s a target)
def test_fuzz_target_finds_nothing_new(fuzz_built, target, tmp_path) -> None:
    corpus = CORPUS / target
    assert corpus.is_dir() and any(corpus.iterdir()), f"{corpus}: no corpus checked in"
    new = tmp_path / "new"
    new.mkdir()
    r = subprocess.run([fuzz_built, "fuzz", "run", "-s", "none", "--target-dir", str(TARGET_DIR), target, str(new),
                        str(corpus), "--", f"-max_total_time={FUZZ_SECONDS}", f"-artifact_prefix={tmp_path}/",
                        "-timeout=20", "-rss_limit_mb=2048"],
                       cwd=NATIVE, capture_output=True, text=True, env=_env(), timeout=FUZZ_SECONDS + 600)
    crashes = [p for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-"))]
    found = "\n".join(f"{p.name}: {base64.b64encode(p.read_bytes()).decode()}" for p in crashes)
    assert r.returncode == 0 and not crashes, (
        f"{target}: the fuzzer found an input (base64; keep it in {corpus} as regress-* with a unit test):\n"
        f"{found}\n{r.stderr[-6000:]}")
    done = re.search(r"Done (\d+) runs in (\d+) second", r.stderr)
    assert done, r.stderr[-3000:]
    cov = re.findall(r"cov: (\d+)", r.stderr)
    print(f"{target}: {done.group(1)} runs in {done.group(2)} s, cov {cov[-1] if cov else '?'}, "
          f"{len(list(new.iterdir()))} new inputs")
    assert int(done.group(1)) > 1000
