"""Coverage-guided fuzzing of the front's Python side with atheris.

    python -m tests.fuzz.atheris_api NEW_CORPUS_DIR tests/fuzz/corpus/api -max_total_time=60

runs libFuzzer (inside atheris) over tests.fuzz.api_target.FrontTarget.run,
with brain's modules instrumented for coverage.  The arguments are
libFuzzer's: corpus directories (new inputs are written to the first) and
its options (-max_total_time, -runs, -seed, -artifact_prefix, ...).  A
Defect (or any other exception) is a crash: libFuzzer writes the input to
``<artifact_prefix>crash-<sha1>`` and exits with status 1.
tests/fuzz/test_api_fuzz.py runs it for a few seconds under `make test` and
longer under `make test-full`.
"""

from __future__ import annotations

import atexit
import os
import sys

import atheris

with atheris.instrument_imports(include=["brain"]):
    from tests.fuzz.api_target import ROOT_ENV, FrontTarget


def main() -> None:
    # The caller's directory when it names one (ROOT_ENV): libFuzzer ends the
    # process with exit(), which runs no Python atexit hook, so a directory
    # of our own would be left behind (128 MiB of preallocated journal).
    target = FrontTarget(os.environ.get(ROOT_ENV) or None)
    atexit.register(target.close)  # when Python does finish: Fuzz() does not return
    atheris.Setup(sys.argv, target.run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
