"""Who is in the cluster, where clients reach them, and how far each got.

A JetStream key-value bucket ``<name>_members`` holds

    cluster          {"cluster_id": "<hex>"}      created once, by the first replica
    m.<member hex>   {"id", "name", "client_urls", "checkpoint_index",
                      "applied_index", "updated"}  one per replica

Each replica writes its own entry when it starts and refreshes it every
``heartbeat`` seconds with a compare-and-set on the entry's revision: if
the entry is gone (``etcdctl member remove``), the replica learns it was
removed and stops, as an etcd member does.  MemberList answers from a copy
refreshed in the background, so a client's call costs no round trip.

Retention: ``checkpoint_index`` is the journal index the replica's last
checkpoint covers; the leader purges the journal below the lowest one of
the replicas seen in the last ``stale_after`` seconds.  A replica away for
longer than that may find its records purged and starts again from a
peer's snapshot (brain.cluster.bootstrap).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..engine.ids import new_id
from ..journal.natsio import STARTUP_WAIT, when_answering

log = logging.getLogger("brain.cluster.membership")

HEARTBEAT_SECONDS = 2.0
STALE_AFTER_SECONDS = 600.0


def bucket_name(name: str) -> str:
    return f"{name}_members"


# What this brain reads that older ones do not, as its member entry lists it:
# "journal-epochs": journal messages of an epoch older than the newest seen
# are read as empty records (brain.journal.jetstream); "journal-stale-runs":
# so is a message of the newest epoch right after such a message (a new
# leader's pipeline, fenced there: jetstream_reading.Epochs).  Together
# they let a leader keep several appends in flight (brain.engine.pipeline);
# a brain that lists only the first would stop applying at the second
# case, so pipelining waits for every member to list both.  "txn-bytes": a
# forwarded Txn may come as the TxnRequest bytes its client sent
# (brain.cluster.forwarding, op "wb"); listed only by a replica that was
# given a reader for them.
FEATURES = ["journal-epochs", "journal-stale-runs"]
PIPELINE_FEATURE = "journal-stale-runs"
TXN_BYTES_FEATURE = "txn-bytes"


@dataclass
class Member:
    id: int
    name: str
    client_urls: list[str] = field(default_factory=list)
    peer_urls: list[str] = field(default_factory=list)
    checkpoint_index: int = 0
    applied_index: int = 0
    updated: float = 0.0  # wall clock of the last heartbeat; 0 for a member added but never started
    # what its brain reads that an older one does not (FEATURES): a leader
    # writes what needs a feature only while every member has it
    features: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps({"id": f"{self.id:x}", "name": self.name, "client_urls": self.client_urls,
                           "peer_urls": self.peer_urls, "checkpoint_index": self.checkpoint_index,
                           "applied_index": self.applied_index, "updated": self.updated,
                           "features": self.features}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Member":
        d = json.loads(raw)
        return cls(int(d["id"], 16), d.get("name", ""), list(d.get("client_urls", [])), list(d.get("peer_urls", [])),
                   int(d.get("checkpoint_index", 0)), int(d.get("applied_index", 0)), float(d.get("updated", 0)),
                   list(d.get("features", [])))



class Membership:
    def __init__(self, conn, name: str, *, replicas: int = 1, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.conn = conn
        self.bucket = bucket_name(name)
        self.replicas = replicas
        self.heartbeat = heartbeat
        self._kv = None
        self._me: Member | None = None
        self._rev = 0
        self._members: list[Member] = []
        self._stop = threading.Event()
        self._task = None
        self.on_removed: Callable[[], None] | None = None
        self.removed = False

    def open(self) -> None:
        self._kv = self.conn.run(when_answering(self._open_bucket, "membership bucket"), STARTUP_WAIT + 20)

    async def _open_bucket(self):
        from nats.js.errors import BucketNotFoundError

        try:
            return await self.conn.js.key_value(self.bucket)
        except BucketNotFoundError:
            return await self.conn.js.create_key_value(bucket=self.bucket, history=1, replicas=self.replicas)

    def cluster_id(self) -> int:
        """The cluster's ID, created by the first replica to ask."""
        return self.conn.run(when_answering(self._cluster_id, "cluster ID"), STARTUP_WAIT + 20)

    async def _cluster_id(self) -> int:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        for attempt in range(5):
            try:
                entry = await self._kv.get("cluster")
                return int(json.loads(entry.value)["cluster_id"], 16)
            except KeyNotFoundError:
                pass
            try:
                await self._kv.create("cluster", json.dumps({"cluster_id": f"{new_id():x}"}).encode())
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                # Another replica created it first.  (nats-py's create, refused,
                # reads the key to see whether it was deleted, and that read
                # can miss an entry just written: KeyNotFoundError, seen when
                # three replicas start at once.)  Read it again shortly.
                await asyncio.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"cannot read or create the cluster ID in bucket {self.bucket}")

    # -- this replica -----------------------------------------------------------

    def register(self, member: Member) -> None:
        """Write this replica's entry and start heartbeating."""
        member.updated = time.time()
        self._me = member
        self._rev = self.conn.run(when_answering(lambda: self._kv.put(f"m.{member.id:x}", member.to_json()),
                                                 "member entry"), STARTUP_WAIT + 10)
        self.refresh()
        self._task = self.conn.submit(self._loop())

    def set_checkpoint(self, index: int) -> None:
        if self._me is not None:
            self._me.checkpoint_index = max(self._me.checkpoint_index, index)

    def set_applied(self, index: int) -> None:
        if self._me is not None:
            self._me.applied_index = index

    async def _loop(self) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        while not self._stop.is_set():
            await asyncio.sleep(self.heartbeat)
            me = self._me
            if me is None or self._stop.is_set():
                continue
            me.updated = time.time()
            try:
                self._rev = await self._kv.update(f"m.{me.id:x}", me.to_json(), last=self._rev)
            except KeyWrongLastSequenceError:
                log.info("member entry moved past revision %d; checking membership", self._rev)
                if not await self._still_member(me):
                    self._removed()
                    return
            except Exception as e:  # noqa: BLE001 - NATS away: try again next beat
                log.debug("membership heartbeat: %r", e)
            try:
                await self._refresh()
            except Exception as e:  # noqa: BLE001
                log.debug("membership refresh: %r", e)

    async def _still_member(self, me: Member) -> bool:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self._kv.get(f"m.{me.id:x}")
        except KeyNotFoundError:
            return False
        self._rev = entry.revision  # someone updated it (member update): keep going
        return True

    def _removed(self) -> None:
        log.error("this member (%x) has been removed from the cluster", self._me.id if self._me else 0)
        self.removed = True
        if self.on_removed is not None:
            threading.Thread(target=self.on_removed, name="brain-removed", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()

    # -- the cluster ------------------------------------------------------------------

    def refresh(self) -> None:
        self.conn.run(self._refresh(), 10)

    async def _keys(self) -> list[str]:
        """The bucket's keys, from its stream's subject list (no consumer:
        nats-py's kv.keys() starts a watcher per call)."""
        prefix = f"$KV.{self.bucket}."
        info = await self.conn.js.stream_info(f"KV_{self.bucket}", subjects_filter=prefix + ">")
        subjects = info.state.subjects or {}
        return [subject[len(prefix):] for subject in subjects]

    async def _refresh(self) -> None:
        from nats.js.errors import KeyNotFoundError

        members = []
        for key in await self._keys():
            if not key.startswith("m."):
                continue
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                try:
                    members.append(Member.from_json(entry.value))
                except (ValueError, KeyError) as e:
                    log.warning("bad member entry %s: %s", key, e)
        members.sort(key=lambda m: m.id)
        self._members = members

    def members(self) -> list[Member]:
        """The cluster's members as of the last refresh (this one's own
        entry is always current)."""
        me = self._me
        out = [m for m in self._members if me is None or m.id != me.id]
        if me is not None:
            out.append(me)
        return sorted(out, key=lambda m: m.id)

    def add(self, name: str, peer_urls: list[str]) -> Member:
        """A member announced before it starts (etcdctl member add)."""
        m = Member(new_id(), name, [], list(peer_urls))
        self.conn.run(self._kv.create(f"m.{m.id:x}", m.to_json()), 10)
        self.refresh()
        return m

    def remove(self, member_id: int) -> bool:
        """Drop a member's entry (etcdctl member remove); False if unknown."""
        from nats.js.errors import KeyNotFoundError

        async def drop() -> bool:
            try:
                await self._kv.get(f"m.{member_id:x}")
            except KeyNotFoundError:
                return False
            await self._kv.purge(f"m.{member_id:x}")
            return True

        found = self.conn.run(drop(), 10)
        self.refresh()
        return found

    def retention_floor(self, now: float | None = None, stale_after: float = STALE_AFTER_SECONDS) -> int | None:
        """The lowest checkpoint index among members heard from recently;
        None if there is none (nothing may be purged)."""
        now = time.time() if now is None else now
        fresh = [m.checkpoint_index for m in self.members() if m.updated and now - m.updated <= stale_after]
        return min(fresh) if fresh else None
