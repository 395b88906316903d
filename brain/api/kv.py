"""The etcdserverpb.KV service: Range, RangeStream, Put, DeleteRange, Txn,
Compact.

Each call converts the protobuf request to the core's request object, hands
it to the engine and converts the result back (brain.api.convert).  Unary
calls are written as steps (brain.api.unary): reads answer at once, writes
return a Deferred that the server completes when the write is durable.
RangeStream is a server stream (brain.api.range_stream).

The one check made here is etcd's request-size limit.  etcd applies it to
what it proposes through raft (writes: Put, DeleteRange, Compact and every
Txn that is not made of Ranges only), measuring the marshalled
InternalRaftRequest, i.e. the client's request plus a small envelope.
"""

from __future__ import annotations

from brain.api import convert
from brain.api.authz import admin, range_guard, txn_guard
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.range_stream import RangeStreamer
from brain.api.rpc_table import LINEARIZABLE, SERIALIZABLE, SERVER_STREAM, Rpc, ServiceTable
from brain.api.unary import Deferred, stepped_rpc
from brain.mvcc.errors import ErrRequestTooLarge
from brain.protowire import varint_size

DEFAULT_MAX_REQUEST_BYTES = 1572864  # etcd's --max-request-bytes default (1.5 MiB)


def raft_envelope_bytes(payload_len: int, member_id: int) -> int:
    """Bytes etcd adds around a request of ``payload_len`` bytes when it
    marshals it into an InternalRaftRequest, before comparing with
    --max-request-bytes.

    The envelope is the request's field key (1 byte, fields 3-7) and length,
    plus ``header`` (field 100: a 2-byte key and a 1-byte length) holding a
    RequestHeader with one varint ID.  etcd's request IDs carry the low 16
    bits of the member ID in their top 16 bits, above a 48-bit
    timestamp/counter, which fixes the ID's varint length.
    """
    request_id = ((member_id & 0xFFFF) << 48) | (1 << 47)
    header = 1 + varint_size(request_id)
    return 1 + varint_size(payload_len) + 2 + 1 + header


class KVService:
    """KV calls on top of an engine (see brain.engine.Engine)."""

    def __init__(self, engine, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, gate=None) -> None:
        self.engine = engine
        self.gate = gate  # brain.api.authz.Gate (None: no auth checks)
        self.header = convert.Header.of(engine)
        self.max_request_bytes = max_request_bytes
        self.range_streamer = RangeStreamer(engine, self.header, max_request_bytes, gate)
        # A request whose serialized size is at most this fits in the limit
        # whatever its envelope (varint length included); only larger ones
        # need the exact computation.
        self._surely_fits = max_request_bytes - raft_envelope_bytes(max_request_bytes, engine.member_id)

    def _too_large(self, request) -> bool:
        size = request.ByteSize()
        if size <= self._surely_fits:
            return False
        return size + raft_envelope_bytes(size, self.header.member_id) > self.max_request_bytes

    # -- steps (brain.api.unary); both transports run them (rpc_table) ----

    def range(self, m):
        return convert.range_columns_response(self.engine.range_columns(convert.range_request(m)), self.header)

    def put(self, m):
        if self._too_large(m):
            raise ErrRequestTooLarge.fresh()
        return Deferred(convert.put_request(m), self._put_done)

    def _put_done(self, res):
        return convert.put_response(res, self.header)

    def delete_range(self, m):
        if self._too_large(m):
            raise ErrRequestTooLarge.fresh()
        return Deferred(convert.delete_range_request(m), self._delete_done)

    def _delete_done(self, res):
        return convert.delete_range_response(res, self.header)

    def txn(self, m):
        # etcd's rule (convert.txn_is_readonly): a Txn of Ranges only is a
        # read, answered here; any other is proposed like a write, even one
        # whose nested Txns hold only Ranges: the size limit applies and it
        # is ordered with the writes (decided by the leader on a replica),
        # which makes it linearizable.  Writing nothing, it adds no record.
        if convert.txn_is_readonly(m):
            return convert.txn_response_wire(self.engine.txn(convert.txn_request(m)), self.header)
        if type(m) is convert.DecodedTxn:  # within the limit: see convert.txn_decoder
            return Deferred(m.request, self._txn_done, m.payload)
        if self._too_large(m):
            raise ErrRequestTooLarge.fresh()
        return Deferred(convert.txn_request(m), self._txn_done)

    def _txn_done(self, res):
        return convert.txn_response_wire(res, self.header)

    def compact(self, m):
        return Deferred(convert.compaction_request(m), self._compact_done)

    def _compact_done(self, res):
        return convert.compaction_response(res, self.header)

    def rpc_table(self) -> ServiceTable:
        # Auth (brain.api.authz): reads are checked here, writes when decided
        # but Compact, which etcd allows root only before proposing it.
        e, g = self.engine, self.gate
        max_ops = getattr(getattr(e, "config", None), "max_txn_ops", 128)
        return ServiceTable("etcdserverpb.KV", (
            stepped_rpc(e, "Range", rpc_pb2.RangeRequest, rpc_pb2.RangeResponse, self.range, read_kind_range,
                        gate=g, guard=range_guard(convert.range_request)),
            Rpc("RangeStream", rpc_pb2.RangeRequest, rpc_pb2.RangeStreamResponse, self.range_streamer.stream,
                shape=SERVER_STREAM),
            stepped_rpc(e, "Put", rpc_pb2.PutRequest, rpc_pb2.PutResponse, self.put, gate=g),
            stepped_rpc(e, "DeleteRange", rpc_pb2.DeleteRangeRequest, rpc_pb2.DeleteRangeResponse,
                        self.delete_range, gate=g),
            stepped_rpc(e, "Txn", rpc_pb2.TxnRequest, rpc_pb2.TxnResponse, self.txn, read_kind_txn, gate=g,
                        guard=txn_guard(convert.txn_request, convert.txn_is_readonly, max_ops),
                        decode=convert.txn_decoder(self._surely_fits)),
            stepped_rpc(e, "Compact", rpc_pb2.CompactionRequest, rpc_pb2.CompactionResponse, self.compact,
                        gate=g, guard=admin),
        ))


def read_kind_range(request) -> int:
    return SERIALIZABLE if request.serializable else LINEARIZABLE


def read_kind_txn(request) -> int | None:
    if not convert.txn_is_readonly(request):
        return None
    return SERIALIZABLE if convert.txn_reads_serializable(request) else LINEARIZABLE
