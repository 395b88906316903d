"""A new replica starts from a peer's snapshot when the journal no longer
holds the whole history.

The journal keeps only what some live replica has not checkpointed yet, so
a replica that starts with an empty data directory (or one whose
checkpoint is older than the journal's first record) cannot replay from
revision 1.  It asks a peer instead:

    new replica  --request <name>.snapshot-->  one live replica (queue group)
                                               writes a snapshot of its state
                                               (revision R, journal index I),
                                               uploads it to the object store
                                               bucket <name>_snapshots
                 <--reply {object, revision, journal_index}--
    downloads it, restores its data directory at I (keeping the cluster
    ID), opens its engine and tails the journal from I.

The snapshot's state and journal index are read together on the peer's
committer, so replaying from I continues exactly at R.  Objects expire
after an hour (the bucket's TTL); a snapshot is made per request.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time

from ..migrate import snapshot as snapshots

log = logging.getLogger("brain.cluster.bootstrap")

SNAPSHOT_TTL = 3600.0
REQUEST_TIMEOUT = 900.0  # a large snapshot takes a while to write and upload


def bucket_name(name: str) -> str:
    return f"{name}_snapshots"


def subject_of(name: str) -> str:
    return f"{name}.snapshot"


class SnapshotServer:
    """Every replica answers snapshot requests (one of them per request)."""

    def __init__(self, conn, name: str, engine, replicas: int = 1) -> None:
        self.conn = conn
        self.name = name
        self.engine = engine
        self.replicas = replicas
        self._sub = None
        self.served = 0

    def start(self) -> None:
        self._sub = self.conn.subscribe(subject_of(self.name), self._on_request, queue="snapshot")

    def stop(self) -> None:
        sub, self._sub = self._sub, None
        self.conn.unsubscribe(sub)

    async def _on_request(self, msg) -> None:
        if msg.reply:
            threading.Thread(target=self._serve, args=(msg,), name="brain-snapshot-serve", daemon=True).start()

    def _serve(self, msg) -> None:
        started = time.monotonic()
        try:
            reply = self._upload()
        except Exception as e:  # noqa: BLE001 - the requester is told
            log.exception("serving a snapshot to a new replica failed")
            reply = {"error": f"{type(e).__name__}: {e}"}
        else:
            self.served += 1
            log.info("served a snapshot at revision %d (journal index %d, %d bytes) in %.1fs",
                     reply["revision"], reply["journal_index"], reply["size"], time.monotonic() - started)
        data = json.dumps(reply).encode()
        self.conn.run(msg.respond(data), 30)

    def _upload(self) -> dict:
        tmp = tempfile.mkdtemp(prefix="brain-snap-")
        try:
            path = os.path.join(tmp, "snapshot")
            info = snapshots.save_snapshot(self.engine, path)
            obj = f"m{self.engine.member_id:x}-i{info.journal_index}-{int(time.time())}"

            async def put():
                store = await _object_store(self.conn, self.name, self.replicas)
                with open(path, "rb") as f:
                    await store.put(obj, f)

            self.conn.run(put(), REQUEST_TIMEOUT)
            return {"object": obj, "revision": info.revision, "journal_index": info.journal_index,
                    "size": os.path.getsize(path), "member": f"{self.engine.member_id:x}"}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


async def _object_store(conn, name: str, replicas: int):
    from nats.js.api import ObjectStoreConfig
    from nats.js.errors import BucketNotFoundError

    try:
        return await conn.js.object_store(bucket_name(name))
    except BucketNotFoundError:
        return await conn.js.create_object_store(
            bucket_name(name), config=ObjectStoreConfig(bucket=bucket_name(name), ttl=SNAPSHOT_TTL,
                                                        replicas=replicas))


def copy_from_peer(conn, name: str, data_dir: str, *, cluster_id: int, member_name: str,
                   shards: int, boundaries: list[bytes], timeout: float = REQUEST_TIMEOUT) -> dict:
    """Fill the empty ``data_dir`` with a live peer's snapshot; returns the
    peer's answer (revision, journal index, size)."""
    started = time.monotonic()
    log.info("the journal does not hold this replica's history: asking a peer for a snapshot")

    async def ask():
        return await conn.nc.request(subject_of(name), b"{}", timeout=timeout)

    try:
        msg = conn.run(ask(), timeout + 5)
    except Exception as e:  # noqa: BLE001 - no peer answered
        raise RuntimeError(f"no replica of cluster {name} answered a snapshot request ({e!r}); "
                           "a new replica needs a live peer when the journal has been purged") from None
    answer = json.loads(msg.data)
    if "error" in answer:
        raise RuntimeError(f"the peer could not make a snapshot: {answer['error']}")
    tmp = tempfile.mkdtemp(prefix="brain-snap-", dir=os.path.dirname(os.path.abspath(data_dir)) or None)
    try:
        path = os.path.join(tmp, "snapshot")

        async def get():
            store = await _object_store(conn, name, 1)
            with open(path, "wb") as f:
                await store.get(answer["object"], writeinto=f)

        conn.run(get(), timeout)
        if os.path.isdir(data_dir) and not os.listdir(data_dir):
            os.rmdir(data_dir)
        snapshots.restore(path, data_dir, name=member_name, shards=shards, boundaries=boundaries,
                          replica_of=cluster_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("copied member %s's snapshot at revision %d (journal index %d, %d bytes) in %.1fs",
             answer.get("member"), answer["revision"], answer["journal_index"], answer["size"],
             time.monotonic() - started)
    return answer
