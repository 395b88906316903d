"""Rebuilding a store's state: from a checkpoint's records in the value
store (load_records, for Store.load_records and Store.load_checkpoint) and
from journal payloads (replay), which recovery, a follower and a mirror
apply after it.

A payload continues the store's revision exactly: its first revision is
the store's next one, or it is refused before anything is applied
(check_continues) or as soon as a revision does not follow (replay).  Replay
makes the same changes through the same two mutations as apply()
(Store.put_at, Store.delete_at), so a replayed store answers every read like
the one that wrote the payload (tests/mvcc/test_store_model.py).
"""

from __future__ import annotations

from typing import Callable, Iterable

from . import auth_apply
from .auth import ROLE_DELETE, ROLE_PUT, STATUS, USER_DELETE, USER_PUT, Permission, Role, User
from .codec import (
    AUTH_ROLE_DELETE,
    AUTH_ROLE_PUT,
    AUTH_STATUS,
    AUTH_TOKEN_ASSIGN,
    AUTH_TOKENS_OF_USER_DROPPED,
    AUTH_USER_DELETE,
    AUTH_USER_PUT,
    PUT,
    decode_batch,
    decode_record_head,
)
from .packed import StoredHead, pack_stored
from .revision import from_bytes, main_of, pack
from .store_core import StoreCore


def replay(store: StoreCore, payload: bytes, *, live: bool = False) -> None:
    """Re-apply one journal payload written by `apply` (or by a leader
    or a mirror: any payload of effects continuing this revision).

    ``live``: the store is serving (a follower applying a replicated
    journal): a compaction record only starts the compaction, whose
    physical steps run between batches as on the leader; in recovery it
    is finished at once."""
    auth_effects: list = []
    token_effects: list = []
    for entry in decode_batch(payload):
        tag = entry[0]
        if tag == "T":
            main, changes = entry[1], entry[2]
            if main != store.revision + 1:
                raise ValueError(f"journal revision {main} does not follow {store.revision}")
            for sub, change in enumerate(changes):
                rev = pack(main, sub)
                if change[0] == PUT:
                    store.put_at(rev, change[1], change[2], change[3])
                else:
                    store.delete_at(rev, change[1])
            store.finish_revision(main)
        elif tag == "C":
            if entry[1] > store.compact_rev:
                store.start_compaction(entry[1])
                while not live and not store.compaction_step(1 << 30):
                    pass
        elif tag == "G":
            store.lessor.grant(entry[1], entry[2])
        elif tag == "R":
            store.lessor.remove(entry[1])
        elif tag == "E":
            store.set_epoch(entry[1], entry[2])
        elif tag == "A":
            auth_entry(entry, auth_effects, token_effects)
    if auth_effects or token_effects:
        store.set_auth(store.auth.changed(auth_effects), token_effects)


def auth_entry(entry: tuple, auth_effects: list, token_effects: list) -> None:
    """A decoded b"A" entry as an auth effect (brain.mvcc.auth) or a token
    effect (brain.mvcc.auth_apply), appended to its list."""
    kind = entry[1]
    if kind == AUTH_USER_PUT:
        auth_effects.append((USER_PUT, User(entry[2], entry[3], entry[5], entry[4])))
    elif kind == AUTH_USER_DELETE:
        auth_effects.append((USER_DELETE, entry[2]))
    elif kind == AUTH_ROLE_PUT:
        auth_effects.append((ROLE_PUT, Role(entry[2], tuple(Permission(*p) for p in entry[3]))))
    elif kind == AUTH_ROLE_DELETE:
        auth_effects.append((ROLE_DELETE, entry[2]))
    elif kind == AUTH_STATUS:
        auth_effects.append((STATUS, entry[2], entry[3]))
    elif kind == AUTH_TOKEN_ASSIGN:
        token_effects.append((auth_apply.TOKEN_ASSIGN, entry[2], entry[3]))
    elif kind == AUTH_TOKENS_OF_USER_DROPPED:
        token_effects.append((auth_apply.TOKENS_OF_USER_DROPPED, entry[2]))
    else:
        token_effects.append((auth_apply.TOKENS_DROPPED,))


def check_continues(store: StoreCore, payload: bytes) -> None:
    """Raise ValueError unless ``payload`` decodes and its revisions
    continue this store's (nothing is applied)."""
    expect = store.revision + 1
    for entry in decode_batch(payload):
        if entry[0] == "T":
            if entry[1] != expect:
                raise ValueError(f"payload revision {entry[1]} does not follow {expect - 1}")
            expect += 1


LoadProgress = Callable[[int, int], None]  # (records scanned, keys packed) so far, over all shards
PROGRESS_STEP = 1 << 14  # records scanned between two calls of a LoadProgress (it is also called per block packed)


def load_records(store: StoreCore, leases: Iterable[tuple[int, int]],
                 progress: LoadProgress | None = None) -> tuple[int, int]:
    """Rebuild every shard's key index from the value store (after a
    checkpoint, the store holds every record not yet compacted) and
    reattach keys to the checkpoint's `leases` ((id, ttl) pairs); returns
    how many keys exist now and the newest main revision stored, which
    Store.load_records takes as its live key count and memtable floor.

    Per shard, the scan (in revision order) keeps each key's record heads
    in a dict, a single head as itself; packed.pack_stored then sorts the
    keys once and packs them straight into blocks, each key with its newest
    put's lease, so no KeyIndex is built for a key with one put.  `progress` is called every PROGRESS_STEP
    records scanned and after each block packed."""
    for lease_id, ttl in leases:
        store.lessor.grant(lease_id, ttl)
    live = newest_main = 0
    floor = 0
    scanned = packed = 0
    for shard in store.shards:
        heads: dict[bytes, StoredHead | list[StoredHead]] = {}
        for rev_bytes, data in store.backend.scan(shard.id):
            rev = from_bytes(rev_bytes)
            key, deleted, created, version, lease = decode_record_head(data)
            head = (rev, deleted, created, version, lease)
            seen = heads.get(key)
            if seen is None:
                heads[key] = head
            elif type(seen) is tuple:
                heads[key] = [seen, head]
            else:
                seen.append(head)
            floor = rev
            scanned += 1
            if progress is not None and not scanned % PROGRESS_STEP:
                progress(scanned, packed)
        # A key exists now when its newest record is a put; that put's
        # lease is the key's.
        for key, seen in heads.items():
            newest = seen if type(seen) is tuple else seen[-1]
            if not newest[1]:
                live += 1
                if newest[4]:
                    store.lessor.set_key(key, newest[4])
        blocks = []
        for block in pack_stored(heads, shard.block_size):
            blocks.append(block)
            packed += len(block)
            if progress is not None:
                progress(scanned, packed)
        del heads
        shard.load(blocks)
        newest_main = max(newest_main, main_of(floor))
    return live, newest_main
