"""The two-tier key index under the engine: a store filled by writes (not
loaded at start), whose overlay passes the merge floor so merges run
between write batches, with keys rewritten and deleted after their blocks
were built; reads at old and new revisions, counts and keys_only pages
against a model, then the same answers after a restart."""

from __future__ import annotations

import random

from brain.engine import Engine, EngineConfig
from brain.mvcc.requests import DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest
from brain.mvcc.store import MERGE_FLOOR_KEYS

BATCH = 1000
NEW_KEYS = 2 * MERGE_FLOOR_KEYS + 2000  # past the floor in each of the two shards
PREFIXES = (b"a/", b"n/")


class Model:
    """Every key's states by revision: (revision, (value, created, mod, version) | None)."""

    def __init__(self) -> None:
        self.states: dict[bytes, list[tuple[int, tuple | None]]] = {}

    def now(self, key: bytes) -> tuple | None:
        states = self.states.get(key)
        return states[-1][1] if states else None

    def put(self, rev: int, key: bytes, value: bytes) -> None:
        old = self.now(key)
        state = (value, old[1], rev, old[3] + 1) if old else (value, rev, rev, 1)
        self.states.setdefault(key, []).append((rev, state))

    def delete(self, rev: int, key: bytes) -> None:
        self.states[key].append((rev, None))

    def at(self, rev: int, key: bytes, end: bytes) -> list[tuple]:
        out = []
        for k in sorted(self.states):
            if key <= k < end:
                seen = [s for r, s in self.states[k] if r <= rev]
                if seen and seen[-1] is not None:
                    out.append((k, *seen[-1]))
        return out


def listing(engine: Engine, key: bytes, end: bytes, rev: int) -> list[tuple]:
    res = engine.range(RangeRequest(key, end, revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in res.kvs]


def keys_only_pages(engine: Engine, key: bytes, end: bytes, limit: int) -> list[tuple[list[bytes], int, bool]]:
    """A paginated keys_only list as kube-apiserver walks one: each page's
    keys, its count of the rest of the range, and `more`."""
    pages = []
    start = key
    rev = 0
    while True:
        res = engine.range(RangeRequest(start, end, limit=limit, keys_only=True, revision=rev))
        rev = res.revision
        assert all(kv.value == b"" for kv in res.kvs)
        pages.append(([kv.key for kv in res.kvs], res.count, res.more))
        if not res.more:
            return pages
        start = res.kvs[-1].key + b"\x00"


def expected_pages(model: Model, rev: int, key: bytes, end: bytes, limit: int) -> list[tuple[list[bytes], int, bool]]:
    keys = [k for k, *_ in model.at(rev, key, end)]
    pages = []
    for at in range(0, max(len(keys), 1), limit):
        rest = keys[at:]
        pages.append((rest[:limit], len(rest), len(rest) > limit))
    return pages


def test_a_store_filled_by_writes_merges_between_batches_and_reads_like_the_model(tmp_path):
    config = EngineConfig(str(tmp_path / "data"), shards=2, shard_boundaries=[b"n/"], max_txn_ops=BATCH)
    rng = random.Random(17)
    model = Model()
    eng = Engine.open(config)
    written_at: list[int] = []

    def write(ops: list[tuple[bytes, bytes | None]]) -> None:
        """One txn (one revision) of puts (a value) and deletes (None) of distinct keys."""
        res = eng.txn(TxnRequest(success=[PutRequest(k, v) if v is not None else DeleteRangeRequest(k)
                                          for k, v in ops]))
        for k, v in ops:
            if v is not None:
                model.put(res.revision, k, v)
            else:
                model.delete(res.revision, k)

    new = [PREFIXES[i % 2] + b"key-%06d" % i for i in range(NEW_KEYS)]
    rng.shuffle(new)
    for at in range(0, len(new), BATCH):
        write([(k, b"v%d" % rng.randrange(1000)) for k in new[at:at + BATCH]])
        written_at.append(eng.committed_rev)
    merged_while_writing = [len(s.blocks) for s in eng.store.shards]
    for _ in range(6):  # rewrites and deletes of keys that by now sit in blocks
        live = [k for k in model.states if model.now(k) is not None]
        picked = rng.sample(live, BATCH)
        write([(k, b"w%d" % rng.randrange(1000) if rng.random() < 0.85 else None) for k in picked])
        written_at.append(eng.committed_rev)
    for _ in range(200):  # one small batch per merge step, until the overlay is down to its floor
        if not eng.store.merging:
            break
        write([(b"z/tick", b"t")])
    assert not eng.store.merging
    assert all(n > 0 for n in merged_while_writing), merged_while_writing
    for shard in eng.store.shards:
        assert shard.blocks and shard.unmerged() <= eng.store.overlay_floor(shard)

    def answers(engine: Engine) -> None:
        newest = engine.committed_rev
        for rev in (written_at[3], written_at[len(written_at) // 2], written_at[-3], newest):
            for key, end in ((b"a/", b"a0"), (b"n/", b"n0"), (b"a/key-0001", b"n/key-0005"), (b"\x00", b"\x00")):
                real_end = end if end != b"\x00" else b"\xff" * 4
                assert listing(engine, key, end, rev) == model.at(rev, key, real_end), (rev, key, end)
                count = engine.range(RangeRequest(key, end, revision=rev, count_only=True)).count
                assert count == len(model.at(rev, key, real_end))
        for key, end in ((b"a/", b"a0"), (b"n/", b"n0")):
            assert keys_only_pages(engine, key, end, 500) == expected_pages(model, newest, key, end, 500)

    answers(eng)
    eng.close()
    eng = Engine.open(config)
    answers(eng)
    eng.close()
