"""brain.cluster.codec: what followers and the leader exchange round-trips
exactly, and bytes that are not a value are refused, never half-built."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brain.cluster import codec
from brain.engine.leases import LeaseLeasesResult, LeaseTimeToLiveResult
from brain.mvcc import errors
from brain.mvcc import requests as r

keys = st.binary(max_size=24)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
kv = st.builds(r.KeyValue, keys, i64, i64, i64, st.binary(max_size=64), i64)
range_req = st.builds(r.RangeRequest, keys, keys, i64, i64, st.integers(0, 2), st.integers(0, 4), st.booleans(),
                      st.booleans(), st.booleans(), i64, i64, i64, i64)
put_req = st.builds(r.PutRequest, keys, st.binary(max_size=64), i64, st.booleans(), st.booleans(), st.booleans())
delete_req = st.builds(r.DeleteRangeRequest, keys, keys, st.booleans())
compare = st.builds(r.Compare, st.integers(0, 3), st.integers(0, 4), keys, keys,
                    st.sampled_from([None, "version", "value", "lease"]), st.one_of(i64, st.binary(max_size=8)))
op = st.one_of(st.none(), range_req, put_req, delete_req)
txn_req = st.recursive(
    st.builds(r.TxnRequest, st.lists(compare, max_size=3), st.lists(op, max_size=3), st.lists(op, max_size=3)),
    lambda inner: st.builds(r.TxnRequest, st.lists(compare, max_size=2), st.lists(st.one_of(op, inner), max_size=2),
                            st.lists(st.one_of(op, inner), max_size=2)),
    max_leaves=4)
write = st.one_of(put_req, delete_req, txn_req, st.builds(r.CompactRequest, i64, st.booleans()),
                  st.builds(r.LeaseGrantRequest, i64, i64), st.builds(r.LeaseRevokeRequest, i64))
result = st.one_of(
    st.builds(r.PutResult, i64, st.one_of(st.none(), kv)),
    st.builds(r.DeleteRangeResult, i64, i64, st.lists(kv, max_size=3)),
    st.builds(r.RangeResult, i64, st.lists(kv, max_size=3), st.booleans(), i64),
    st.builds(r.TxnResult, i64, st.booleans(), st.lists(st.builds(r.PutResult, i64), max_size=2)),
    st.builds(r.CompactResult, i64), st.builds(r.LeaseGrantResult, i64, i64, i64), st.builds(r.LeaseRevokeResult, i64),
    st.builds(LeaseTimeToLiveResult, i64, i64, i64, i64, st.lists(keys, max_size=3)),
    st.builds(LeaseLeasesResult, i64, st.lists(i64, max_size=3)),
    st.sampled_from([errors.ErrCompacted, errors.ErrNotLeader, errors.ErrLeaseNotFound]),
)


@settings(max_examples=300)
@given(st.lists(write, max_size=6))
def test_requests_round_trip(requests):
    assert codec.decode(codec.encode(["w", requests])) == ["w", requests]


@settings(max_examples=300)
@given(st.lists(result, max_size=6))
def test_results_round_trip(results):
    assert codec.decode(codec.encode(["ok", results])) == ["ok", results]


def test_an_error_keeps_code_and_text():
    back = codec.decode(codec.encode(["err", errors.ErrTimeoutDueToLeaderFail]))
    assert back[1] == errors.ErrTimeoutDueToLeaderFail
    assert back[1].code == "UNAVAILABLE"


@settings(max_examples=300)
@given(st.lists(write, min_size=1, max_size=3), st.data())
def test_truncated_or_corrupted_bytes_are_refused(requests, data):
    raw = codec.encode(requests)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(codec.CodecError):
        codec.decode(raw[:cut])
    flipped = bytearray(raw)
    at = data.draw(st.integers(0, len(raw) - 1))
    flipped[at] ^= data.draw(st.integers(1, 255))
    try:
        codec.decode(bytes(flipped))  # may still decode to another valid value
    except codec.CodecError:
        pass


def test_unknown_types_and_tags_are_refused():
    with pytest.raises(TypeError):
        codec.encode(object())
    with pytest.raises(codec.CodecError):
        codec.decode(b"D\xff")
    with pytest.raises(codec.CodecError):
        codec.decode(b"Z")
    with pytest.raises(codec.CodecError):
        codec.decode(b"L\xff\xff\xff\x7f")  # a list longer than its bytes
    with pytest.raises(codec.CodecError):
        codec.decode(b"N" + b"N")  # bytes left over
    deep = b"L\x01\x00\x00\x00" * 100 + b"N"
    with pytest.raises(codec.CodecError):
        codec.decode(deep)


# The bytes the first release of this encoding wrote for a value with every
# tag in it: replicas of different releases exchange these during a rolling
# upgrade, so a faster encoder or decoder must keep them exactly.
GOLDEN = bytes.fromhex(
    "4c030000005301000000774c0200000044054c0100000044044900000000000000004902000000000000004202000000"
    "2f6b4200000000530c0000006d6f645f7265766973696f6e4907000000000000004c01000000440242020000002f6b42"
    "01000000764900000000000000004654464c02000000440142020000002f6b4200000000490000000000000000490000"
    "000000000000490000000000000000490000000000000000464646490000000000000000490000000000000000490000"
    "0000000000004900000000000000004e4407493c0000000000000049ffffffffffffffff4c0200000053020000006f6b"
    "45530c0000004f55545f4f465f52414e47455336000000657463647365727665723a206d7663633a2072657175697265"
    "64207265766973696f6e20686173206265656e20636f6d706163746564"
)


def test_the_encoding_is_the_one_every_release_speaks():
    value = ["w", [r.TxnRequest([r.Compare(0, 2, b"/k", b"", "mod_revision", 7)],
                                [r.PutRequest(b"/k", b"v", 0, False, True, False)], [r.RangeRequest(b"/k"), None]),
                   r.LeaseGrantRequest(60, -1)], ("ok", errors.ErrCompacted)]
    assert codec.encode(value) == GOLDEN
    back = codec.decode(GOLDEN)
    assert back[:2] == value[:2] and back[2] == ["ok", errors.ErrCompacted]


@pytest.mark.parametrize("cut", range(1, 40))
def test_a_value_cut_inside_a_field_is_refused(cut):
    """Cut at every byte of a dataclass's fields (ints, bytes, strings and
    booleans are read in the loop over them)."""
    raw = codec.encode(r.Compare(0, 2, b"/key", b"", "mod_revision", 7))
    if cut < len(raw):
        with pytest.raises(codec.CodecError):
            codec.decode(raw[:cut])


def test_a_string_that_is_not_utf8_is_refused_inside_a_dataclass():
    raw = bytearray(codec.encode(r.Compare(0, 2, b"k", b"", "mod_revision", 7)))
    at = raw.index(b"mod_revision")
    raw[at] = 0xff
    with pytest.raises(codec.CodecError):
        codec.decode(bytes(raw))


def test_a_member_entry_says_what_its_brain_reads_and_an_old_one_reads_nothing_new():
    from brain.cluster.membership import FEATURES, PIPELINE_FEATURE, Member

    m = Member(0xAB, "b1", ["http://b1:2379"], [], 3, 4, 1.5, list(FEATURES))
    assert Member.from_json(m.to_json()) == m and PIPELINE_FEATURE in m.features
    old = b'{"id": "ab", "name": "b1", "client_urls": [], "peer_urls": [], "checkpoint_index": 0, "applied_index": 0}'
    assert Member.from_json(old).features == []


def test_appends_are_pipelined_only_while_every_member_reads_a_stale_run():
    """A brain that reads only older epochs' messages as stale would stop
    applying at a fenced new leader's pipelined record (journal-stale-runs:
    jetstream_reading.Epochs), so a leader keeps one append in flight
    until every member lists both features (a rolling upgrade)."""
    from types import SimpleNamespace

    from brain.cluster.membership import FEATURES, Member
    from brain.cluster.replica import ClusterOptions, EngineSide

    members = [Member(0xA, "b1", [], [], 0, 0, 0.0, list(FEATURES)),
               Member(0xB, "b2", [], [], 0, 0, 0.0, ["journal-epochs"])]
    side = EngineSide(ClusterOptions("nats://127.0.0.1:4222/x"))
    healthy_engine = SimpleNamespace(statistics=lambda: SimpleNamespace(failed=None))
    side.bind(SimpleNamespace(membership=SimpleNamespace(members=lambda: members), engine=healthy_engine))
    allowed = side.hooks().pipeline_allowed
    assert not allowed()
    members[1] = Member(0xB, "b2", [], [], 0, 0, 0.0, list(FEATURES))
    assert allowed()
