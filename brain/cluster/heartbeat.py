"""The election's heartbeats on core NATS, as brain.cluster.election sends
and reads them: on ``<name>.heartbeat``, a JSON object naming the key's
holder, the key revision it holds and the sender (the holder, or the
leader that handed the key to it): ``{"member": "<hex>", "rev": n,
"from": "<hex>"}``.  No acknowledgement, nothing stored."""

from __future__ import annotations

import json


def subject(name: str) -> str:
    return f"{name}.heartbeat"


def encode(holder: int, rev: int, sender: int) -> bytes:
    """A heartbeat: ``holder`` holds the key at ``rev``."""
    return json.dumps({"member": f"{holder:x}", "rev": rev, "from": f"{sender:x}"}).encode()


def decode(data: bytes) -> tuple[int, int, int]:
    """(holder, rev, sender) of a heartbeat; ValueError for anything else."""
    try:
        beat = json.loads(data)
        return int(beat["member"], 16), int(beat["rev"]), int(beat["from"], 16)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a heartbeat: {e!r}") from None
