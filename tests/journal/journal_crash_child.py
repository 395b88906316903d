"""Child process for the kill -9 test: append and sync forever.

After each sync it prints the indexes that sync made durable; the parent
kills it at a random moment and checks that every printed index survived.
Usage: journal_crash_child.py DIRECTORY SEED SEGMENT_BYTES
"""

import random
import sys

from brain.journal import SegmentJournal
from tests.journal.journal_support import crash_payload


def main() -> None:
    directory, seed, segment_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    journal = SegmentJournal.open(directory, segment_bytes=segment_bytes)
    out = sys.stdout
    out.write(f"open {journal.last_index}\n")
    out.flush()
    while True:
        first = journal.last_index + 1
        for _ in range(rng.randint(1, 8)):
            journal.append(crash_payload(journal.last_index + 1))
        journal.sync()
        out.write("".join(f"{index}\n" for index in range(first, journal.last_index + 1)))
        out.flush()


if __name__ == "__main__":
    main()
