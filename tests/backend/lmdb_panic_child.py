"""Child process for test_lmdb_panic.py: an LmdbBackend whose commit the
test fails from outside (strace), then what it answers.

Prints "ready" once a store holds records and a scan of it is open, waits
for a line (the test armed its fault), writes a batch, prints "written
<outcome>", waits for a line (the fault is gone), then prints one JSON
object of outcomes.  Usage: lmdb_panic_child.py DIRECTORY
"""

import json
import sys

from brain.backend import LmdbBackend, WriteBatch


def outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__


def main() -> None:
    backend = LmdbBackend(sys.argv[1], 1)
    backend.write(WriteBatch(puts=[(0, b"k%03d" % i, b"v" * 100) for i in range(50)]))
    scan = backend.scan(0)
    next(scan)
    print("ready", flush=True)
    sys.stdin.readline()
    written = outcome(lambda: backend.write(WriteBatch(puts=[(0, b"x%03d" % i, b"w" * 3000) for i in range(50)])))
    print(f"written {written}", flush=True)
    sys.stdin.readline()
    out = {
        "recover while a scan is open": backend.recover(),
        "get while a scan is open": outcome(lambda: backend.get(0, b"k001")),
        "write while a scan is open": outcome(lambda: backend.write(WriteBatch(meta={b"m": b"1"}))),
    }
    scan.close()
    out["get"] = outcome(lambda: backend.get(0, b"k001"))  # reopens
    out["recover after"] = backend.recover()
    out["failed batch"] = outcome(lambda: backend.get(0, b"x001"))
    out["write"] = outcome(lambda: backend.write(WriteBatch(puts=[(0, b"y", b"1")])))
    out["read back"] = outcome(lambda: backend.get(0, b"y"))
    out = {k: v.decode() if isinstance(v, bytes) else v for k, v in out.items()}
    print(json.dumps(out), flush=True)
    backend.close()


if __name__ == "__main__":
    main()
