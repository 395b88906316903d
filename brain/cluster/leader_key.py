"""The election's key in its JetStream key-value bucket, as brain.cluster.
election reads and writes it.

The key ``leader`` of bucket ``<name>_leader`` holds the leader's member ID
(``{"member": "<hex>"}``).  It is created only while absent, moved to
another holder only by a compare-and-set on the revision the writer last
saw (``Nats-Expected-Last-Subject-Sequence``), and deleted on the revision
its holder wrote; every write carries a per-message TTL, so the key
disappears even when no replica is left to judge.

Every request about the key waits at most ``request_timeout`` (the
election timeout, at least half a second) for its answer, never nats-py's
default 5 s: an answer lost or late (a JetStream server busy, a leader
change of the bucket's stream) costs one check interval and a new try, not
a failover of several seconds (a run saw the key taken 5 s after both
followers had tried it).
"""

from __future__ import annotations

import json

KEY = "leader"


def bucket_name(name: str) -> str:
    return f"{name}_leader"


class LeaderKey:
    """The key of cluster ``name``'s election: ``open`` (creating the bucket
    with ``replicas`` if absent) before anything else."""

    def __init__(self, conn, name: str, *, ttl: int, request_timeout: float, replicas: int = 1) -> None:
        self.conn = conn
        self.bucket = bucket_name(name)
        self.ttl = ttl  # whole seconds, as JetStream takes them
        self.request_timeout = request_timeout
        self.replicas = replicas
        self.kv = None  # the bucket, opened for these requests with request_timeout

    async def open(self) -> None:
        """The bucket (created if absent, with JetStream's usual patience),
        opened for the election's own requests with ``request_timeout``."""
        from nats.js.errors import BucketNotFoundError

        try:
            await self.conn.js.key_value(self.bucket)
        except BucketNotFoundError:
            await self.conn.js.create_key_value(
                bucket=self.bucket, history=1, replicas=self.replicas, limit_marker_ttl=1)
        self.kv = await self.conn.nc.jetstream(timeout=self.request_timeout).key_value(self.bucket)

    async def read(self) -> tuple[int, int]:
        """(holder, revision) of the key: (0, 0) when it is absent and no
        message of it is left; holder 0 at the revision of the marker
        JetStream leaves for a second where it expired.  Raises when NATS
        cannot say."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.kv.get(KEY)
        except KeyNotFoundError:
            return 0, 0
        return _holder(entry.value), entry.revision

    async def now(self) -> tuple[int, int]:
        """``read``, or (0, -1) when NATS cannot say."""
        try:
            return await self.read()
        except Exception:  # noqa: BLE001 - unknown: treat the key as lost
            return 0, -1

    async def create(self, holder: int) -> int:
        """Make the key name ``holder`` if it is absent; the new revision."""
        return await self.kv.create(KEY, _value(holder), msg_ttl=self.ttl)

    async def move(self, holder: int, last_rev: int) -> int:
        """Make the key name ``holder`` if its revision is still ``last_rev``;
        the new revision."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last_rev), "Nats-TTL": f"{self.ttl}s"}
        ack = await self.conn.js.publish(f"$KV.{self.bucket}.{KEY}", _value(holder), headers=headers,
                                         timeout=self.request_timeout)
        return ack.seq

    async def delete(self, last_rev: int) -> None:
        """Delete the key if its revision is still ``last_rev``."""
        await self.kv.delete(KEY, last=last_rev)


def _value(member_id: int) -> bytes:
    return json.dumps({"member": f"{member_id:x}"}).encode()


def _holder(value: bytes | None) -> int:
    """The member ID a value of the key names (0: none, or not a value of it)."""
    if not value:
        return 0
    try:
        return int(json.loads(value)["member"], 16)
    except (ValueError, KeyError, TypeError):
        return 0
