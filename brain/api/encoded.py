"""Responses written straight as wire bytes: the lists, and Txns.

A Range page or a RangeStream chunk is the one response whose size grows
with the data, a KeyValue per key.  Building it as protobuf objects costs
a message per key on the way in and a walk over them on the way out (about
0.6 us a key to fill, more to serialize, on the development machine); here
the native transport encodes the columns of the list in one call
(``brain._transport.encode_key_values``), and the few fields around them
(the header, ``more``, ``count``) are encoded in Python.  The bytes equal
what the protobuf runtime writes for the same message (fields in number
order, zero fields left out): tests/api/test_encoded.py compares them.

A Txn is every write of a Kubernetes cluster (a create, an update, a
node's Lease renewal): its response is written from brain's result
objects by the native ``TxnEncoder`` in one call, instead of being copied
into protobuf messages and serialized on the front's thread.

Both transports take an ``Encoded`` where they take a response message:
they only ever ask it for ``SerializeToString()`` (and RangeStream's
chunk sizing for ``ByteSize()``).  Without the native module (the grpcio
front may run without it) ``available()`` is False and callers build the
protobuf message instead; that front says so once when it starts
(``fallback_notice``), the native front cannot start without the module.
"""

from __future__ import annotations

from brain.mvcc.requests import DeleteRangeResult, EmptyResult, PutResult, RangeColumns, RangeResult, TxnResult

try:
    from brain._transport import TxnEncoder
    from brain._transport import encode_key_values as _encode_key_values
except ImportError as e:  # the grpcio front runs without the native module
    _encode_key_values = _encode_txn = None
    _IMPORT_ERROR = str(e) or type(e).__name__
else:
    _encode_txn = TxnEncoder(TxnResult, RangeResult, PutResult, DeleteRangeResult, EmptyResult).encode
    _IMPORT_ERROR = ""
from brain.protowire import varint

RANGE_RESPONSE_KVS = 2  # RangeResponse: header = 1, kvs = 2, more = 3, count = 4
RANGE_STREAM_RESPONSE_RANGE = 1  # RangeStreamResponse: range_response = 1


class Encoded:
    """A message already serialized."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf message method it stands in for
        return self.data

    def ByteSize(self) -> int:  # noqa: N802
        return len(self.data)


def available() -> bool:
    return _encode_key_values is not None


def fallback_notice() -> str:
    """Why lists are built as protobuf messages, with the import error, for
    the start-up log ("" when the native encoder is there)."""
    if available():
        return ""
    return (f"lists are encoded by protobuf, not by the native encoder: brain's transport module "
            f"brain._transport cannot be imported ({_IMPORT_ERROR})")


def length_delimited(field: int, data: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(data)) + data


def header(cluster_id: int, member_id: int, revision: int, term: int) -> bytes:
    """A ResponseHeader's fields (cluster_id = 1, member_id = 2, revision = 3,
    raft_term = 4, which carries ``term``), zeros left out."""
    out = b""
    for tag, v in ((0x08, cluster_id), (0x10, member_id), (0x18, revision), (0x20, term)):
        if v:
            out += bytes((tag,)) + varint(v)
    return out


def range_response(header_fields: bytes | None, cols: RangeColumns, more: bool, count: int, *,
                   stream_chunk: bool = False) -> tuple[Encoded, int]:
    """A RangeResponse holding the keys of ``cols`` (a header only when
    ``header_fields`` is not None: present, even if empty), or with
    ``stream_chunk`` the RangeStreamResponse wrapping it; and the size of
    its KeyValues alone (RangeStream sizes its chunks by it)."""
    prefix = length_delimited(1, header_fields) if header_fields is not None else b""
    suffix = b""
    if more:
        suffix += b"\x18\x01"
    if count:
        suffix += b"\x20" + varint(count)
    data, kvs_size = _encode_key_values(RANGE_RESPONSE_KVS, cols.keys, cols.create_revisions, cols.mod_revisions,
                                        cols.versions, cols.leases, cols.values, prefix, suffix,
                                        RANGE_STREAM_RESPONSE_RANGE if stream_chunk else 0)
    return Encoded(data), kvs_size


def txn_response(cluster_id: int, member_id: int, term: int, result: TxnResult) -> Encoded:
    """The TxnResponse of ``result`` under the header (cluster_id,
    member_id, the result's revision, term): the bytes
    brain.api.convert.txn_response's message serializes to."""
    return Encoded(_encode_txn(cluster_id, member_id, term, result))
