"""KeyIndex: the worked example of key_index.py, step by step."""

from brain.mvcc.key_index import KeyIndex
from brain.mvcc.revision import pack


def example() -> KeyIndex:
    ki = KeyIndex(b"k")
    ki.put(pack(1))
    ki.put(pack(2))
    ki.tombstone(pack(3))
    ki.put(pack(5))
    ki.put(pack(6))
    return ki


def test_get_walks_generations():
    ki = example()
    assert ki.get(1) == (pack(1), pack(1), 1)
    assert ki.get(2) == (pack(2), pack(1), 2)
    assert ki.get(3) is None
    assert ki.get(4) is None
    assert ki.get(5) == (pack(5), pack(5), 1)
    assert ki.get(9) == (pack(6), pack(5), 2)
    assert ki.get(0) is None


def test_sub_revisions_order_within_main():
    ki = KeyIndex(b"k")
    ki.put(pack(4, 2))
    assert ki.get(3) is None
    assert ki.get(4) == (pack(4, 2), pack(4, 0), 1)  # created keeps only the main part, as etcd does


def test_compact_drops_whole_tombstoned_generation():
    ki = example()
    removed: list[int] = []
    ki.compact(4, removed)
    assert removed == [pack(1), pack(2), pack(3)]
    assert ki.get(5) == (pack(5), pack(5), 1)
    assert ki.get(6) == (pack(6), pack(5), 2)


def test_compact_keeps_newest_visible_revision():
    ki = example()
    removed: list[int] = []
    ki.compact(2, removed)
    assert removed == [pack(1)]
    assert ki.get(2) == (pack(2), pack(1), 2)  # a read at the compaction revision still works
    removed.clear()
    ki.compact(6, removed)
    assert removed == [pack(2), pack(3), pack(5)]
    assert ki.get(6) == (pack(6), pack(5), 2)  # the version survives compaction


def test_compact_removes_a_deleted_key_entirely():
    ki = KeyIndex(b"k")
    ki.put(pack(1))
    ki.tombstone(pack(2))
    removed: list[int] = []
    ki.compact(3, removed)
    assert removed == [pack(1), pack(2)]
    assert ki.is_empty()


def test_compact_at_the_tombstone_keeps_only_the_tombstone():
    ki = KeyIndex(b"k")
    ki.put(pack(1))
    ki.tombstone(pack(2))
    removed: list[int] = []
    ki.compact(2, removed)
    assert removed == [pack(1)]
    assert ki.get(2) is None and not ki.is_empty()
    removed.clear()
    ki.compact(3, removed)
    assert removed == [pack(2)] and ki.is_empty()


def test_compact_before_tombstone_keeps_it():
    ki = KeyIndex(b"k")
    ki.put(pack(1))
    ki.put(pack(2))
    ki.tombstone(pack(3))
    removed: list[int] = []
    ki.compact(2, removed)
    assert removed == [pack(1)]
    assert ki.get(2) == (pack(2), pack(1), 2)
    assert ki.get(3) is None
    assert not ki.is_empty()


def test_restore_keeps_stored_version_and_create():
    ki = KeyIndex(b"k")
    ki.restore(pack(7), pack(3), 4)
    assert ki.get(7) == (pack(7), pack(3), 4)
