"""What a directory holds, as brain sees it: nothing yet, brain's data,
an etcd data directory, or another program's files; and what brain's value
store records about the directory it is in (identity and layout, below).

brain serves an empty (or missing) directory or its own; it refuses the
other two rather than write into them: an etcd directory would otherwise be
served as an empty keyspace at revision 1 next to etcd's files, and anything
else is not ours to touch.  `lost+found` (the root of a fresh filesystem)
counts as empty.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

# Names brain creates in a data directory; any of them marks it as brain's.
LOCK_FILE = "LOCK"  # flock'ed by the one process using the directory
JOURNAL_DIR = "journal"  # the local journal's segment files
VALUES_DIR = "values"  # the value store
BRAIN_ENTRIES = (LOCK_FILE, JOURNAL_DIR, VALUES_DIR)
IGNORED_ENTRIES = ("lost+found",)
# A restore or import into an existing directory works in hidden entries
# and marks the directory incomplete while it swaps contents (restore.py).
WORK_PREFIXES = (".brain-building-", ".brain-replaced-")
INCOMPLETE_MARKER = ".brain-incomplete"

MISSING, EMPTY, BRAIN, ETCD, FOREIGN, NOT_A_DIR, INCOMPLETE = (
    "missing", "empty", "brain", "etcd", "foreign", "file", "incomplete")


class DataDirError(ValueError):
    """A data directory brain will not use (the message says what to do)."""


@dataclass(frozen=True)
class DirContents:
    path: str
    kind: str  # MISSING, EMPTY, BRAIN, ETCD, FOREIGN, NOT_A_DIR or INCOMPLETE
    entries: tuple[str, ...] = ()


def inspect(path: str) -> DirContents:
    path = os.path.abspath(path)
    try:
        names = sorted(n for n in os.listdir(path)
                       if n not in IGNORED_ENTRIES and not n.startswith(WORK_PREFIXES))
    except FileNotFoundError:
        return DirContents(path, MISSING)
    except NotADirectoryError:
        return DirContents(path, NOT_A_DIR)
    if INCOMPLETE_MARKER in names:
        return DirContents(path, INCOMPLETE, tuple(names))
    if not names:
        return DirContents(path, EMPTY)
    member = os.path.join(path, "member")
    if os.path.isdir(os.path.join(member, "snap")) or os.path.isdir(os.path.join(member, "wal")):
        return DirContents(path, ETCD, tuple(names))
    if any(n in BRAIN_ENTRIES for n in names):
        return DirContents(path, BRAIN, tuple(names))
    return DirContents(path, FOREIGN, tuple(names))


def suggested_brain_dir(etcd_dir: str) -> str:
    """Where to import an etcd directory to: default.etcd -> default.brain."""
    base = etcd_dir.rstrip(os.sep)
    if base.endswith(".etcd"):
        base = base[: -len(".etcd")]
    return base + ".brain"


def etcd_dir_message(path: str) -> str:
    dest = suggested_brain_dir(path)
    return (f"{path} is an etcd data directory (member/snap, member/wal): brain does not serve etcd's files "
            f"and will not write into them. Import it, with etcd stopped, into a new brain data directory: "
            f"`brain import {path} --data-dir {dest}`, then `brain serve --data-dir {dest}`")


def foreign_message(c: DirContents) -> str:
    shown = ", ".join(c.entries[:5]) + (f" and {len(c.entries) - 5} more" if len(c.entries) > 5 else "")
    return (f"{c.path} holds files that are not brain's ({shown}); brain will not write into it. "
            f"Give --data-dir an empty directory or an existing brain data directory")


def check_servable(path: str) -> DirContents:
    """Raise DataDirError unless brain may open `path` as its data directory."""
    c = inspect(path)
    if c.kind == ETCD:
        raise DataDirError(etcd_dir_message(c.path))
    if c.kind == FOREIGN:
        raise DataDirError(foreign_message(c))
    if c.kind == NOT_A_DIR:
        raise DataDirError(f"{c.path} is a file, not a directory")
    if c.kind == INCOMPLETE:
        raise DataDirError(f"an import or restore into {c.path} was interrupted before it finished; "
                           f"run it again with --replace")
    return c


# -- what the value store records about the directory ---------------------------
#
# Two meta entries, written when a directory is created (by serve, restore or
# import) and read each time it opens.  Their one codec is here.

META_IDENTITY = b"brain.identity"  # the cluster and member IDs, the term count
META_LAYOUT = b"brain.layout"  # the shard boundaries the data was written with


@dataclass(frozen=True)
class Identity:
    """Who this data directory is.  ``term`` counts the starts of a single
    node (the term its response headers carry as raft_term); ``name`` and
    ``restored_from`` say where a restored or imported directory came from."""

    cluster_id: int
    member_id: int
    term: int = 0
    name: str | None = None
    restored_from: dict | None = None

    def encode(self) -> bytes:
        out: dict = {"cluster_id": self.cluster_id, "member_id": self.member_id, "term": self.term}
        if self.name is not None:
            out["name"] = self.name
        if self.restored_from:
            out["restored_from"] = self.restored_from
        return json.dumps(out).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Identity":
        d = json.loads(raw)
        return cls(d["cluster_id"], d["member_id"], d.get("term", 0), d.get("name"), d.get("restored_from"))


def encode_layout(boundaries: list[bytes]) -> bytes:
    return json.dumps({"boundaries": [b.hex() for b in boundaries]}).encode()


def decode_layout(raw: bytes) -> list[bytes]:
    return [bytes.fromhex(b) for b in json.loads(raw)["boundaries"]]


def meta_entries(identity: Identity, boundaries: list[bytes]) -> dict[bytes, bytes]:
    """The value store's meta entries for a directory of ``identity`` laid
    out on ``boundaries``."""
    return {META_LAYOUT: encode_layout(boundaries), META_IDENTITY: identity.encode()}
