"""The one check of a shard layout (brain.mvcc.shard_map.layout_problem)."""

import pytest

from brain.cli.flags import layout
from brain.mvcc.shard_map import ShardMap, layout_problem


def test_a_usable_layout_has_no_problem():
    assert layout_problem(None, []) is None
    assert layout_problem(3, [b"b", b"t"]) is None


def test_each_problem_is_named_in_the_flags_words():
    assert layout_problem(None, [b"a", b""]) == "--shard-boundaries: a boundary key must not be empty"
    assert layout_problem(None, [b"t", b"b"]) == "--shard-boundaries: keys must be strictly increasing (bytewise)"
    assert layout_problem(None, [b"b", b"b"]) == "--shard-boundaries: keys must be strictly increasing (bytewise)"
    assert layout_problem(3, [b"b"]) == "--shards 3 needs 2 boundary keys, --shard-boundaries gives 1"


def test_the_store_and_the_data_directory_commands_refuse_the_same_layouts():
    with pytest.raises(ValueError, match="strictly increasing"):
        ShardMap([b"t", b"b"])
    with pytest.raises(ValueError, match="strictly increasing"):
        layout(None, [b"t", b"b"])
    with pytest.raises(ValueError, match="needs 2 boundary keys"):
        layout(3, [b"b"])
