"""KV.RangeStream (etcd 3.7): a range answered as a stream of chunks.

Served as etcd 3.7.3 serves it (etcdserver/v3_server.go ``rangeStream``):

* the request is checked like a unary Range, then refused with
  Unimplemented for a custom sort order or a min/max revision filter;
* one linearizable read barrier before the first chunk, none when
  serializable;
* the first chunk reads at most 10 keys; its header revision (the newest
  revision then) is the final header's, and a request without a revision
  is pinned to it, so writes made while the stream runs never show;
* each chunk is one range without its total count, continuing after the
  previous chunk's last key (key + ``\\0``) at the pinned revision, so it
  costs O(chunk) however long the range is; no snapshot is held between
  chunks, so a compaction above the pinned revision fails a later chunk
  with the compacted error, as in etcd;
* after each chunk the next one's limit doubles, halves or stays (``next_limit``)
  to bring a chunk's size toward --max-request-bytes;
* every message but the last carries kvs only (clientv3 merges the messages
  with proto.Merge, so anything set early would leak into its result); the
  last adds the header, ``more`` (true only when ``limit`` cut the range) and
  ``count``, the total number of keys in the range at the revision;
* count_only answers one message {header, count}.

A keys_only chunk carries neither values nor leases unless it is sorted by
value, as a unary Range's answer (brain.mvcc.reads.index_only, etcd 3.7's
FastKeysOnly).  The generator is lazy: the transport asks for the next chunk only when the
client can take it (the native front waits while its send queue is full),
and stops asking once the client has gone.
"""

from __future__ import annotations

from typing import Iterator

from brain.api import convert, encoded
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.unary import abort_with, wait_read_barrier
from brain.mvcc import validation
from brain.mvcc.errors import EtcdError
from brain.mvcc.requests import SORT_ASCEND, SORT_NONE, TARGET_KEY, RangeRequest
from brain.protowire import varint_size

FIRST_CHUNK_LIMIT = 10  # etcd's initialStreamChunkLimit
UNBOUNDED = 2**63 - 1  # a limit of 0: etcd's math.MaxInt64

ErrCustomSort = EtcdError("UNIMPLEMENTED", "RangeStream does not support custom sort orders")
ErrRevisionFilters = EtcdError("UNIMPLEMENTED", "RangeStream does not support revision filters")


def check_request(r: RangeRequest) -> None:
    """etcd's checkRangeStreamRequest: the unary checks first (an empty key
    wins over everything), then the two refusals, sort before filters."""
    validation.check_range(r)
    if not (r.sort_order == SORT_NONE or (r.sort_target == TARGET_KEY and r.sort_order == SORT_ASCEND)):
        raise ErrCustomSort.fresh()
    if r.min_mod_revision or r.max_mod_revision or r.min_create_revision or r.max_create_revision:
        raise ErrRevisionFilters.fresh()


def first_limit(total_limit: int) -> int:
    """The first chunk's limit.  A negative request limit stays negative,
    which a range reads as no limit: the whole range in one message."""
    return min(FIRST_CHUNK_LIMIT, total_limit)


def next_limit(limit: int, size: int, target: int) -> int:
    """etcd's adjustChunkLimit: double below half the target size, halve
    above twice the target, never below 1."""
    if size < target // 2:
        limit *= 2
    elif size > target * 2:
        limit //= 2
    return max(limit, 1)


def measured_size(kvs_bytes: int, revision: int, more: bool, count: int) -> int:
    """proto.Size of the RangeResponse etcd's range code built for a chunk,
    which is what etcd's sizing rule measures: a header holding only the
    revision, the chunk's kvs (``kvs_bytes``, their fields encoded), more
    and count."""
    header = 1 + varint_size(revision) if revision else 0
    size = 1 + varint_size(header) + header + kvs_bytes
    if more:
        size += 2
    if count:
        size += 1 + varint_size(count)
    return size


def _chunk_request(r: RangeRequest, key: bytes, limit: int, revision: int) -> RangeRequest:
    return RangeRequest(key, r.range_end, limit, revision, r.sort_order, r.sort_target,
                        keys_only=r.keys_only)


class RangeStreamer:
    """Serves RangeStream for KVService: ``stream(request, context)`` is the
    RPC's handler on both transports."""

    def __init__(self, engine, header: convert.Header, target_bytes: int, gate=None) -> None:
        self.engine = engine
        self.header = header
        self.target_bytes = target_bytes  # --max-request-bytes, as etcd sizes chunks
        self.gate = gate  # brain.api.authz.Gate: read permission on the range, while auth is on

    def stream(self, m: rpc_pb2.RangeRequest, context) -> Iterator[rpc_pb2.RangeStreamResponse]:
        try:
            r = convert.range_request(m)
            check_request(r)
            if not r.serializable:
                wait_read_barrier(self.engine)
            gate = self.gate
            if gate is not None and gate.enabled:
                # etcd's doSerialize around its rangeStream: checked once, before the first chunk
                self.engine.auth.check_read(gate.caller_of_context(context), r.key, r.range_end)
            if r.count_only:
                yield self._count_only(r)
                return
            yield from self._chunks(r, context)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, "RangeStream")

    def _count_only(self, r: RangeRequest) -> rpc_pb2.RangeStreamResponse:
        res = self.engine.range(r)
        out = rpc_pb2.RangeStreamResponse()
        self.header.fill(out.range_response.header, res.revision)
        if res.count:
            out.range_response.count = res.count
        return out

    def _chunks(self, r: RangeRequest, context) -> Iterator[rpc_pb2.RangeStreamResponse]:
        total_limit = r.limit or UNBOUNDED
        limit = first_limit(total_limit)
        revision = r.revision
        key = r.key
        header_rev = 0
        sent = 0
        while context.is_active():
            res = self.engine.range_chunk(_chunk_request(r, key, limit, revision))
            if not header_rev:
                header_rev = res.revision
                if revision == 0:
                    revision = header_rev  # pinned; a negative revision is not (as in etcd)
            sent += len(res.keys)
            if res.more:
                key = res.keys[-1] + b"\x00"
            last = not res.more or sent == total_limit
            count = 0
            if last:
                count = sent
                if res.more:
                    count += self.engine.range(RangeRequest(key, r.range_end, revision=revision,
                                                            count_only=True)).count
            out, kvs_size = self._message(res, header_rev if last else None, last and res.more, count)
            yield out
            if last:
                return
            size = measured_size(kvs_size, res.revision, res.more, res.count)
            limit = min(next_limit(limit, size, self.target_bytes), total_limit - sent)

    def _message(self, cols, header_rev: int | None, more: bool, count: int):
        """One chunk's message (a header only on the last), and the size
        of its KeyValues."""
        if encoded.available():
            hdr = self.header.wire(header_rev) if header_rev is not None else None
            return encoded.range_response(hdr, cols, more, count, stream_chunk=True)
        out = rpc_pb2.RangeStreamResponse()
        chunk = out.range_response
        convert.fill_columns(chunk, cols)
        kvs_size = chunk.ByteSize()
        if header_rev is not None:
            self.header.fill(chunk.header, header_rev)
        if more:
            chunk.more = True
        if count:
            chunk.count = count
        return out, kvs_size
