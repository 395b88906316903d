"""The Watch service: one bidirectional stream, many watchers.

Requests are read on a thread of their own and turned into calls on the
engine's stream handle; responses are taken from the handle's outbox in
order and written as bytes.  Each event is encoded once (cached on the event,
with and without prev_kv) and spliced into every response that carries it,
so a fan-out to many watchers costs one encoding per event.
"""

from __future__ import annotations

import logging
import threading

import grpc

from brain.api.convert import Header, fill_kv
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.pb.mvccpb import kv_pb2
from brain.api.rpc_table import BIDI_STREAM, Rpc, ServiceTable
from brain.mvcc.requests import EVENT_DELETE
from brain.protowire import varint

log = logging.getLogger("brain.api.watch")

_EVENTS_TAG = b"\x5a"  # WatchResponse.events: field 11, length-delimited
_NOPUT = rpc_pb2.WatchCreateRequest.NOPUT
_NODELETE = rpc_pb2.WatchCreateRequest.NODELETE
GRPC_OVERHEAD_BYTES = 512 * 1024  # etcd's allowance on top of --max-request-bytes


def event_bytes(ev, with_prev: bool) -> bytes:
    """The encoded mvccpb.Event, cached on the event."""
    cache = ev.wire
    if cache is None:
        cache = ev.wire = [None, None]
    i = 1 if with_prev and ev.prev_kv is not None else 0
    data = cache[i]
    if data is None:
        m = kv_pb2.Event()
        if ev.type == EVENT_DELETE:
            m.type = kv_pb2.Event.DELETE
        fill_kv(m.kv, ev.kv)
        if i:
            fill_kv(m.prev_kv, ev.prev_kv)
        data = cache[i] = m.SerializeToString()
    return data


class WatchService:
    def __init__(self, engine, *, max_request_bytes: int = 1572864, gate=None) -> None:
        self.engine = engine
        self.gate = gate  # brain.api.authz.Gate (None: no auth checks)
        self.header = Header.of(engine)
        self.fragment_limit = max_request_bytes + GRPC_OVERHEAD_BYTES

    # -- encoding -------------------------------------------------------

    def _head(self, resp, fragment: bool = False) -> bytes:
        m = rpc_pb2.WatchResponse()
        self.header.fill(m.header, resp.revision)
        m.watch_id = resp.watch_id
        if resp.created:
            m.created = True
        if resp.canceled:
            m.canceled = True
        if resp.compact_revision:
            m.compact_revision = resp.compact_revision
        if resp.cancel_reason:
            m.cancel_reason = resp.cancel_reason
        if fragment:
            m.fragment = True
        return m.SerializeToString()

    def encode(self, resp, with_prev: bool) -> list[bytes]:
        """One or more encoded WatchResponses (several when fragmenting)."""
        if not resp.events:
            return [self._head(resp)]
        parts = []
        for ev in resp.events:
            data = event_bytes(ev, with_prev)
            parts.append(_EVENTS_TAG + varint(len(data)) + data)
        head = self._head(resp)
        total = len(head) + sum(len(p) for p in parts)
        if not resp.fragment or total < self.fragment_limit or len(parts) < 2:
            return [head + b"".join(parts)]
        # etcd's sendFragments: fill each fragment up to the limit (at least
        # one event each); every fragment but the last has fragment=true.
        frag_head = self._head(resp, fragment=True)
        out: list[bytes] = []
        cur: list[bytes] = []
        size = len(frag_head)
        for p in parts:
            if cur and size + len(p) >= self.fragment_limit:
                out.append(frag_head + b"".join(cur))
                cur, size = [], len(frag_head)
            cur.append(p)
            size += len(p)
        out.append(head + b"".join(cur))
        return out

    def open_stream(self, wakeup, who=None) -> "WatchStream":
        """A Watch RPC served event-driven (the native front); ``who``: the
        transport event's caller item."""
        return WatchStream(self, wakeup, who)

    def refusal_for(self, caller):
        """The create check of a stream whose caller ``caller()`` names."""
        gate = self.gate
        if gate is None:
            return None
        return lambda key, range_end: gate.watch_refusal(caller, key, range_end)

    # -- requests ---------------------------------------------------------

    @staticmethod
    def apply(handle, req, refusal=None) -> None:
        """One WatchRequest on the engine's stream handle.  ``refusal(key,
        range_end)``: why the caller may not watch that range ("" if it
        may; brain.api.authz.Gate.watch_refusal), asked before the watch is
        made, on the range as sent ("\0" for an empty key), as etcd 3.7.1
        does."""
        which = req.WhichOneof("request_union")
        if which == "create_request":
            c = req.create_request
            if refusal is not None:
                reason = refusal(c.key or b"\x00", c.range_end)
                if reason:
                    handle.refuse(reason)
                    return
            handle.create(
                c.key, c.range_end, c.start_revision, c.watch_id, c.prev_kv,
                no_put=_NOPUT in c.filters, no_delete=_NODELETE in c.filters,
                progress_notify=c.progress_notify, fragment=c.fragment)
        elif which == "cancel_request":
            handle.cancel(req.cancel_request.watch_id)
        elif which == "progress_request":
            handle.request_progress()

    def encode_all(self, items) -> list[bytes]:
        return [data for resp in items for data in self.encode(resp, resp.prev_kv)]

    def rpc_table(self) -> ServiceTable:
        # Watch yields encoded responses: no serializer
        return ServiceTable("etcdserverpb.Watch", (
            Rpc("Watch", rpc_pb2.WatchRequest, None, self.Watch, shape=BIDI_STREAM, session="watch"),
        ))

    # -- the RPC on grpcio (a thread per stream) ----------------------------

    def Watch(self, request_iterator, context):
        handle = self.engine.watch_stream()
        gate = self.gate
        refusal = self.refusal_for(lambda: gate.caller_of_context(context))

        def read() -> None:
            try:
                for req in request_iterator:
                    self.apply(handle, req, refusal)
            except grpc.RpcError:
                handle.close()
            except Exception:  # noqa: BLE001
                log.exception("watch stream reader failed")
                handle.close()
            # A client that half-closes keeps receiving, as with etcd.

        reader = threading.Thread(target=read, name="watch-reader", daemon=True)
        reader.start()
        context.add_callback(handle.close)
        try:
            while context.is_active():
                items = handle.get(timeout=1.0)
                if items is None:
                    return
                yield from self.encode_all(items)
        finally:
            handle.close()


class WatchStream:
    """One Watch RPC on the native transport: event-driven, no thread.

    The transport hands in request messages (``on_message``); the hub calls
    ``wakeup`` when responses are ready, and the front then calls ``poll``
    on its dispatch thread, which takes from the outbox, without waiting,
    what the transport's queue for the stream has room for, and returns the
    encoded responses.  While that queue is full (the client does not read,
    or its connection holds --max-connection-bytes already) the front stops
    polling and pauses the stream in the hub: its watchers are routed
    nothing and catch up from history once it drains, so memory stays
    bounded.
    """

    __slots__ = ("service", "handle", "refusal")

    def __init__(self, service: WatchService, wakeup, who=None) -> None:
        self.service = service
        self.handle = service.engine.watch_stream(wakeup)
        gate = service.gate
        self.refusal = service.refusal_for(lambda: gate.caller_of(who))

    def on_message(self, payload: bytes) -> None:
        self.service.apply(self.handle, rpc_pb2.WatchRequest.FromString(payload), self.refusal)

    def poll(self, max_bytes: int | None = None) -> list[bytes] | None:
        """Encoded responses ready now ([] if none), about ``max_bytes`` of
        them at most (at least one); None once the stream was closed by the
        server (shutdown)."""
        items = self.handle.get(0, max_bytes)
        if items is None:
            return None
        return self.service.encode_all(items) if items else []

    def pending(self) -> bool:
        """Responses are left to poll."""
        return self.handle.pending()

    def pause(self, paused: bool) -> None:
        """The transport cannot take more for this stream (its client does
        not read), or can again: its watchers are routed nothing meanwhile
        and catch up from history afterwards (brain.mvcc.watch)."""
        self.handle.pause(paused)

    def close(self) -> None:
        self.handle.close()

