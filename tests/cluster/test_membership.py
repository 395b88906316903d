"""The membership bucket's cluster ID when replicas start at once."""

import asyncio
import json
import types

from nats.js.errors import KeyNotFoundError

from brain.cluster.membership import Membership


class RacingBucket:
    """The membership bucket as three replicas starting at once see it: the
    cluster ID is created by another replica between this one's get and its
    create, and nats-py's create, refused, fails to read that entry back."""

    def __init__(self) -> None:
        self.value: bytes | None = None
        self.creates = 0

    async def get(self, key: str):
        if self.value is None:
            raise KeyNotFoundError
        return types.SimpleNamespace(value=self.value)

    async def create(self, key: str, value: bytes) -> int:
        self.creates += 1
        self.value = json.dumps({"cluster_id": "2a"}).encode()  # the other replica's
        raise KeyNotFoundError


class Connection:
    def __init__(self, bucket) -> None:
        async def key_value(name):
            return bucket
        self.js = types.SimpleNamespace(key_value=key_value)

    def run(self, coro, timeout):
        return asyncio.run(coro)


def test_a_cluster_id_created_by_another_replica_at_once_is_read_back():
    bucket = RacingBucket()
    membership = Membership(Connection(bucket), "race")
    membership.open()
    assert membership.cluster_id() == 0x2A
    assert bucket.creates == 1
