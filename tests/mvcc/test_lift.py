"""The write side of the two-tier key index (brain.mvcc.index, in a Shard): a shard
whose keys start in packed blocks, written, deleted, compacted, merged
(with floors, so rewritten keys get their second chance) and re-packed,
against a shard that only ever had the overlay, fed the same program.
After every step both must hold the same keys, answer every read at every
revision since the compaction the same way, and count the same live keys
in every range."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brain.mvcc import index
from brain.mvcc.packed import Block
from brain.mvcc.revision import pack
from brain.mvcc.shard import Shard
from tests.mvcc.test_packed import copied

KEYS = [b"a", b"ab", b"b", b"c", b"d", b"k", b"ka", b"m", b"t", b"z"]
BOUNDS = [b"", b"a", b"b", b"c\x00", b"k", b"n", b"zz", None]

steps = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS)),
    st.tuples(st.just("put"), st.sampled_from(KEYS)),
    st.tuples(st.just("del"), st.sampled_from(KEYS)),
    st.tuples(st.just("compact"), st.integers(0, 6)),  # this many revisions back from the newest
    st.tuples(st.just("merge"), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("repack")),
), max_size=50)


def repacked(shard: Shard) -> None:
    """What a restart does: the whole index packed again, overlay empty."""
    index = sorted((copied(ki) for ki in shard.entries(None, False, None)), key=lambda ki: ki.key)
    size = shard.block_size
    shard.load(Block(index[i:i + size], [0] * len(index[i:i + size]))  # no leases here
               for i in range(0, len(index), size))


def compact_all(shard: Shard, rev: int) -> None:
    cursor = None
    while True:
        cursor, _ = shard.compact(rev, cursor, 3)
        if cursor is None:
            return


def assert_same(packed: Shard, plain: Shard, compact_rev: int, newest: int) -> None:
    keys = [ki.key for ki in plain.entries(None, False, None)]
    assert [ki.key for ki in packed.entries(None, False, None)] == keys
    assert packed.keys() == plain.keys() == len(keys)
    assert packed.dead == plain.dead
    for key in KEYS:
        a, b = packed.get(key), plain.get(key)
        assert (a is None) == (b is None), key
        if a is not None:
            assert [a.get(at) for at in range(compact_rev, newest + 1)] == \
                   [b.get(at) for at in range(compact_rev, newest + 1)], key
    for i, lo in enumerate(BOUNDS[:-1]):
        for hi in BOUNDS[i + 1:]:
            assert packed.live_count(lo, hi) == plain.live_count(lo, hi), (lo, hi)


@settings(max_examples=400, deadline=None)
@given(first=st.lists(st.sampled_from(KEYS), min_size=1, max_size=12), program=steps,
       block_size=st.sampled_from([1, 2, 3, 128]))
def test_writes_over_blocks_read_like_the_overlay_alone(first, program, block_size):
    packed, plain = Shard(0, None, block_size=block_size), Shard(0, None)
    main = 1
    for key in first:
        main += 1
        for shard in (packed, plain):
            shard.put(pack(main, 0), key, b"", 0)
    repacked(packed)
    compact_rev = 0
    for op in program:
        kind = op[0]
        if kind in ("put", "del"):
            key = op[1]
            live = plain.get(key) is not None and plain.get(key).is_live()
            if kind == "del" and not live:
                continue
            main += 1
            if kind == "put":
                assert packed.put(pack(main, 0), key, b"", 0) == plain.put(pack(main, 0), key, b"", 0)
            else:
                for shard in (packed, plain):
                    shard.delete(pack(main, 0), key)
        elif kind == "compact":
            compact_rev = max(compact_rev, main - op[1])
            for shard in (packed, plain):
                compact_all(shard, compact_rev)
        elif kind == "merge":
            before, due = packed.unmerged(), packed.merge_due(op[2])
            assert packed.merge(op[1], op[2]) >= (1 if due else 0)
            assert packed.unmerged() < before or not due
            assert not packed.merge_due(op[2]) or packed.unmerged() > op[2]
        else:
            repacked(packed)
        assert_same(packed, plain, compact_rev, main)


def packed_shard(keys: list[bytes], block_size: int) -> Shard:
    shard = Shard(0, None, block_size=block_size)
    for main, key in enumerate(keys, start=2):
        shard.put(pack(main, 0), key, b"", 0)
    repacked(shard)
    return shard


def test_a_hot_key_stays_lifted_while_it_is_written_within_the_window():
    """A key written twice close together (a lease renewed) is hot: merges
    leave it lifted, and its writes append to its KeyIndex instead of
    lifting it from a rebuilt block each time.  Keys written long after
    their last write are not hot and fold; so does a hot key that has not
    been written for the window, once its block is rebuilt."""
    keys = [b"k%d" % i for i in range(8)]
    shard = packed_shard(keys, 4)  # written at main revisions 2..9
    rev = index.HOT_WINDOW_MIN + 100
    for key in [b"k1", b"k2", b"k3", b"k0", b"k0"]:  # k0 written again while lifted: a lease renewed
        rev += 1
        shard.put(pack(rev, 0), key, b"", 0)
    assert shard.rewritten == {b"k0"} and shard.merge_due(2) and shard.unmerged() == 4
    shard.merge(1000, 2)
    assert list(shard.lifted) == [b"k0"] and shard.rewritten == {b"k0"}
    assert shard.get(b"k0").get(rev) == (pack(rev, 0), pack(2, 0), 3)
    assert shard.get(b"k1").get(rev - 2) == (pack(rev - 4, 0), pack(3, 0), 2)
    assert shard.live_count(b"", None) == 8 and shard.keys() == 8
    rev += index.HOT_WINDOW_MIN + 1  # k0 not written for longer than the window
    for key in [b"k1", b"k2", b"k5"]:
        rev += 1
        shard.put(pack(rev, 0), key, b"", 0)
    assert shard.rewritten == {b"k0"} and shard.merge_due(1)
    shard.merge(1000, 1)  # rebuilds k0's block for k1 and k2, and k0, cold now, folds with them
    assert b"k0" not in shard.lifted and not shard.rewritten
    assert shard.get(b"k0").get(rev) == (pack(rev - 3 - index.HOT_WINDOW_MIN - 1, 0), pack(2, 0), 3)
    shard.merge(1000, 0)  # a floor of 0: nothing stays
    assert not shard.lifted and shard.live_count(b"", None) == 8


def test_a_lifted_key_compaction_removed_is_gone_until_put_again():
    shard = packed_shard([b"a", b"b"], 128)
    shard.delete(pack(10, 0), b"a")
    compact_all(shard, 11)  # the block has no history to drop: only the lifted key is compacted
    assert len(shard.blocks) == 1 and b"a" in shard.lifted
    assert shard.get(b"a") is None and shard.keys() == 1 and shard.live_count(b"", None) == 1
    assert shard.dead == [] and [ki.key for ki in shard.entries(None, False, None)] == [b"b"]
    assert shard.put(pack(12, 0), b"a", b"", 0) == (pack(12, 0), 1)
    assert shard.keys() == 2 and shard.live_count(b"", None) == 2
    shard.delete(pack(13, 0), b"a")
    compact_all(shard, 14)
    assert shard.keys() == 1 and shard.live_count(b"a", b"b") == 0
    shard.merge(1000, 0)  # the rebuild forgets the removed key
    assert not shard.lifted and shard.block_keys == 1 and shard.keys() == 1
