"""brain/go_duration.py reads a duration as Go's time.ParseDuration does: the
same nanoseconds, the same refusals, the same messages.  The corner cases of
Go's grammar are checked against Go itself (tests/go_duration/parse_duration.go,
run with `go run`) when Go is installed, and against Go's answers written
down here either way."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from brain import go_duration

PROGRAM = Path(__file__).resolve().parent / "go_duration" / "parse_duration.go"

# What Go 1.26's time.ParseDuration returns for each: nanoseconds, or its error text.
KNOWN = {
    "0": 0, "-0": 0, "+0": 0, "1h": 3_600_000_000_000, "1h30m": 5_400_000_000_000,
    "300ms": 300_000_000, "-1.5h": -5_400_000_000_000, "+2s": 2_000_000_000,
    ".5h": 1_800_000_000_000, "1.h": 3_600_000_000_000, "1us": 1000, "1µs": 1000, "1μs": 1000,
    "1.0000000001s": 1_000_000_000, "0.1ns": 0, "1h1h": 7_200_000_000_000,
    "9223372036854775807ns": 9223372036854775807, "-9223372036854775808ns": -9223372036854775808,
    "9223372036854775808ns9223372036854775808ns": 0,  # Go's uint64 sum wraps
    "": 'time: invalid duration ""', "0s": 0, "00": 'time: missing unit in duration "00"',
    "1": 'time: missing unit in duration "1"', "-": 'time: invalid duration "-"',
    ".s": 'time: invalid duration ".s"', "-.s": 'time: invalid duration "-.s"',
    "1 h": 'time: unknown unit " h" in duration "1 h"', " 1s": 'time: invalid duration " 1s"',
    "1d": 'time: unknown unit "d" in duration "1d"', "μs": 'time: invalid duration "\\xce\\xbcs"',
    "1H": 'time: unknown unit "H" in duration "1H"', "--1s": 'time: invalid duration "--1s"',
    "9223372036854775808ns": 'time: invalid duration "9223372036854775808ns"',
    '1"s': 'time: unknown unit "\\"s" in duration "1\\"s"',
}

CORNERS = list(KNOWN) + [
    "1.5.5s", "1..5s", "5m.5s", "1e3s", "0x10s", "1s ", "1_000s", "+-1s", "1h-1m", "2562047h47m16.854775807s",
    "2562047h47m16.854775808s", "-2562047h47m16.854775808s", "0.000000000000000000000000001h",
    "0.99999999999999999999999999999h", "1.9999999999999999999h", "18446744073709551616ns", "1ms1",
    "1\x00s", "1é", ".", "+", "1.5", "0.0", "-0.0s", "3.000000001h", "1ns1us1µs1μs1ms1s1m1h",
]


def _random_strings(n: int, seed: int) -> list[str]:
    """Strings from the grammar's alphabet and a few strangers, short enough
    to hit its corners."""
    rng = random.Random(seed)
    alphabet = list("0123456789..+-nsumhµμ") + ["ms", "ns", "us", "h", "9" * 19, " ", "x"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 7))) for _ in range(n)]


def _ours(text: str) -> int | str:
    try:
        return go_duration.nanoseconds(text)
    except go_duration.DurationError as e:
        return str(e)


def _gos(inputs: list[str]) -> list[int | str]:
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="", GO111MODULE="on")
    done = subprocess.run(["go", "run", str(PROGRAM)], input=json.dumps(inputs), capture_output=True,
                          text=True, env=env, cwd=PROGRAM.parent, timeout=600, check=True)
    return [o["ns"] if "ns" in o else o["error"] for o in json.loads(done.stdout)]


def test_known_answers() -> None:
    assert {text: _ours(text) for text in KNOWN} == KNOWN


def test_seconds() -> None:
    assert go_duration.seconds("1h30m") == 5400.0
    assert go_duration.seconds("-300ms") == -0.3
    with pytest.raises(ValueError, match="missing unit"):
        go_duration.seconds("5")


@pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed")
def test_same_as_go() -> None:
    inputs = CORNERS + _random_strings(3000, seed=26)
    wrong = {text: (ours, gos) for text, gos in zip(inputs, _gos(inputs)) if (ours := _ours(text)) != gos}
    assert not wrong, f"(ours, Go's) where they differ: {wrong}"
