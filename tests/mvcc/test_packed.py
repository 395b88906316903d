"""Packed blocks (brain.mvcc.packed) against KeyIndex: random histories
(recreated keys, tombstones kept at the compaction revision, compacted
generations), every read revision, compaction at every revision."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brain.mvcc.key_index import Generation, KeyIndex
from brain.mvcc.packed import Block, BlockBuilder, PackedKey
from brain.mvcc.revision import pack

KEYS = [b"", b"a", b"ab", b"b", b"k\x00", b"k\xff", b"zz"]

# A history program: at each main revision one of the keys is put or
# deleted (a delete of a key that does not exist is skipped), or the
# histories are compacted at that revision.
steps = st.lists(st.tuples(st.sampled_from(["put", "put", "del", "compact"]), st.integers(0, len(KEYS) - 1),
                           st.integers(0, 2)), max_size=40)


def histories(program) -> tuple[dict[bytes, KeyIndex], int]:
    index: dict[bytes, KeyIndex] = {}
    main = 1
    for kind, k, subs in program:
        main += 1
        key = KEYS[k]
        ki = index.get(key)
        if kind == "put":
            ki = index.setdefault(key, KeyIndex(key))
            for sub in range(subs + 1):  # several puts of one Txn
                ki.put(pack(main, sub))
        elif kind == "del" and ki is not None and ki.is_live():
            ki.tombstone(pack(main, 0))
        elif kind == "compact":
            for key, ki in list(index.items()):
                ki.compact(main, [])
                if ki.is_empty():
                    del index[key]
    return index, main


def copied(ki) -> KeyIndex:
    """A KeyIndex with its own copy of the generations of `ki` (a KeyIndex
    or a block's PackedKey)."""
    out = KeyIndex(ki.key)
    out.generations = []
    for g in ki.generations:
        c = Generation()
        c.created, c.version, c.revs = g.created, g.version, list(g.revs)
        out.generations.append(c)
    return out


def shape(gens) -> list[tuple[int, int, list[int]]]:
    return [(g.created, g.version, list(g.revs)) for g in gens]


@settings(max_examples=300, deadline=None)
@given(program=steps, lease_choices=st.lists(st.integers(0, 3), min_size=len(KEYS), max_size=len(KEYS)))
def test_a_block_reads_like_its_key_indexes(program, lease_choices):
    index, newest = histories(program)
    kis = [index[k] for k in sorted(index)]
    leases = [lease_choices[KEYS.index(ki.key)] for ki in kis]
    block = Block(kis, leases)
    assert len(block) == len(kis)
    live = 0
    for i, ki in enumerate(kis):
        assert block.key(i) == ki.key
        assert block.is_live(i) == ki.is_live()
        assert block.lease(i) == (leases[i] if ki.is_live() else 0)  # a key that does not exist has no lease
        assert block.live_before(i) == live
        live += ki.is_live()
        assert shape(block.generations(i)) == shape(ki.generations)
        view = PackedKey(block, i, ki.key)
        for at in range(0, newest + 2):
            assert block.get(i, at) == ki.get(at) == view.get(at), (ki, at)
    assert block.live == live
    for probe in KEYS + [b"aa", b"k", b"\xff"]:
        assert block.bisect_left(probe) == sum(1 for ki in kis if ki.key < probe)
    if kis:
        assert (block.first, block.last) == (kis[0].key, kis[-1].key)
        revs = [r for ki in kis for g in ki.generations for r in g.revs]
        assert block.maxrev == max(revs)
        with_history = [ki for ki in kis if len(ki.generations) > 1 or len(ki.generations[0].revs) > 1]
        assert block.minhist == min((ki.generations[0].revs[0] for ki in with_history), default=block.minhist)


@settings(max_examples=200, deadline=None)
@given(program=steps, extra=st.integers(0, 3))
def test_compacting_a_keys_copy_drops_what_the_original_drops(program, extra):
    index, newest = histories(program)
    kis = [index[k] for k in sorted(index)]
    block = Block(kis, [0] * len(kis))
    for at in range(1, newest + extra):
        for i, ki in enumerate(kis):
            original, copy = copied(ki), block.key_index(i)
            dropped_original: list[int] = []
            dropped_copy: list[int] = []
            original.compact(at, dropped_original)
            copy.compact(at, dropped_copy)
            assert dropped_copy == dropped_original
            assert shape(copy.generations) == shape(original.generations)
            if at < block.minhist >> 32:
                assert dropped_copy == []  # below minhist compaction has nothing to do


def test_the_worked_example():
    a, b, c = KeyIndex(b"a"), KeyIndex(b"b"), KeyIndex(b"c")
    b.put(pack(2, 0))
    b.tombstone(pack(3, 0))
    a.put(pack(4, 0))
    c.put(pack(5, 0))
    c.put(pack(6, 0))
    block = Block([a, b, c], [0, 0, 7])
    assert block.keys == b"abc" and list(block.ends) == [1, 2, 3]
    assert list(block.mods) == [pack(4, 0), 0, pack(6, 0)]
    assert list(block.versions) == [1, 0, 2] and list(block.live_rank) == [0, 1, 1, 2]
    assert list(block.hist_pos) == [1, 2]
    assert list(block.hist) == [pack(2, 0), 1, 2, pack(2, 0), pack(3, 0), 0, 0, 0,
                                pack(5, 0), 2, 2, pack(5, 0), pack(6, 0)]
    assert list(block.lease_pos) == [2] and list(block.leases) == [7]


FIELDS = ("keys", "ends", "mods", "created", "versions", "live_rank", "hist_pos", "hist_off", "hist", "lease_pos",
          "leases", "maxrev", "minhist")


@settings(max_examples=300, deadline=None)
@given(program=steps, lease_choices=st.lists(st.integers(0, 3), min_size=len(KEYS), max_size=len(KEYS)),
       cuts=st.lists(st.integers(0, len(KEYS)), max_size=4), rebuilt=st.sets(st.integers(0, len(KEYS) - 1)))
def test_runs_copied_from_a_block_are_the_block(program, lease_choices, cuts, rebuilt):
    """A merge copies runs of a block's entries (BlockBuilder.add_run) and
    rebuilds the others from their histories: whatever the split, the new
    block is field for field the one built from every key's history."""
    index, _ = histories(program)
    kis = [index[k] for k in sorted(index)]
    leases = [lease_choices[KEYS.index(ki.key)] for ki in kis]
    block = Block(kis, leases)
    n = len(block)
    builder = BlockBuilder()
    bounds = sorted({0, n, *(min(c, n) for c in cuts)})
    for a, b in zip(bounds, bounds[1:]):
        i = a
        while i < b:  # entries in `rebuilt` one by one from their history, the rest in runs
            if i in rebuilt:
                builder.add_generations(kis[i].key, kis[i].generations, leases[i] if kis[i].is_live() else 0)
                i += 1
                continue
            j = i
            while j < b and j not in rebuilt:
                j += 1
            builder.add_run(block, i, j)
            i = j
    copy = builder.build()
    for name in FIELDS:
        assert getattr(copy, name) == getattr(block, name), name
