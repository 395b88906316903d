"""The etcdserverpb.KV service: Range, Put, DeleteRange, Txn, Compact.

Each call converts the protobuf request to the core's request object, hands
it to the engine and converts the result back (brain.api.convert).  The
engine validates requests and raises EtcdError; the error leaves as the gRPC
status etcd would send, with etcd's exact text.  Any other exception is a
bug: it is logged with its traceback and answered with UNKNOWN, and the
server goes on serving.

The one check made here is etcd's request-size limit.  etcd applies it to
what it proposes through raft (writes: Put, DeleteRange, Compact and every
Txn that is not made of Ranges only), measuring the marshalled
InternalRaftRequest, i.e. the client's request plus a small envelope.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

from brain.api import convert
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.mvcc.errors import ErrRequestTooLarge, EtcdError

log = logging.getLogger("brain.api.kv")

DEFAULT_MAX_REQUEST_BYTES = 1572864  # etcd's --max-request-bytes default (1.5 MiB)

# The gRPC status code for each EtcdError.code name.
_STATUS = {c.name: c for c in grpc.StatusCode}


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


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
    header = 1 + _varint_len(request_id)
    return 1 + _varint_len(payload_len) + 2 + 1 + header


def abort_with(context: grpc.ServicerContext, exc: BaseException, method: str) -> NoReturn:
    """End the call with the status for ``exc`` (raises, like context.abort)."""
    if isinstance(exc, EtcdError):
        code = _STATUS.get(exc.code)
        if code is not None:
            context.abort(code, exc.message)
        log.error("%s: EtcdError with unknown status code %r: %s", method, exc.code, exc.message)
        context.abort(grpc.StatusCode.UNKNOWN, exc.message)
    log.error("%s failed unexpectedly", method, exc_info=exc)
    context.abort(grpc.StatusCode.UNKNOWN, f"brain: internal error in {method}: {type(exc).__name__}: {exc}")


class KVService(rpc_pb2_grpc.KVServicer):
    """KV calls on top of an engine (see brain.engine.Engine)."""

    def __init__(self, engine, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.engine = engine
        self.header = convert.Header(engine.cluster_id, engine.member_id, engine.raft_term)
        self.max_request_bytes = max_request_bytes
        # A request whose serialized size is at most this fits in the limit
        # whatever its envelope (varint length included); only larger ones
        # need the exact computation.
        self._surely_fits = max_request_bytes - raft_envelope_bytes(max_request_bytes, engine.member_id)

    def _too_large(self, request) -> bool:
        size = request.ByteSize()
        if size <= self._surely_fits:
            return False
        return size + raft_envelope_bytes(size, self.header.member_id) > self.max_request_bytes

    def Range(self, request, context):
        try:
            res = self.engine.range(convert.range_request(request))
            return convert.range_response(res, self.header)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, "Range")

    def Put(self, request, context):
        try:
            if self._too_large(request):
                raise ErrRequestTooLarge
            res = self.engine.put(convert.put_request(request))
            return convert.put_response(res, self.header)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Put")

    def DeleteRange(self, request, context):
        try:
            if self._too_large(request):
                raise ErrRequestTooLarge
            res = self.engine.delete_range(convert.delete_range_request(request))
            return convert.delete_range_response(res, self.header)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "DeleteRange")

    def Txn(self, request, context):
        try:
            if not convert.txn_is_readonly(request) and self._too_large(request):
                raise ErrRequestTooLarge
            res = self.engine.txn(convert.txn_request(request))
            return convert.txn_response(res, self.header)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Txn")

    def Compact(self, request, context):
        try:
            res = self.engine.compact(convert.compaction_request(request))
            return convert.compaction_response(res, self.header)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Compact")
