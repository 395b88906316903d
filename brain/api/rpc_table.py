"""One table per service: every RPC listed once, with what each transport
needs to serve it.

Each service (KV, Watch, Lease, Cluster, Maintenance, Health) describes its
RPCs as ``Rpc`` rows in a ``ServiceTable`` (its ``rpc_table()``);
brain.api.server builds grpcio's handlers from the tables and
brain.api.native_front its methods, so an RPC is added in one place and
both transports serve it.

What a row's fields mean, by shape:

* unary with a ``step`` (brain.api.unary): the native front runs the step on
  its dispatch thread (a linearizable read, as ``read`` classifies it, behind
  one read barrier per batch; a write in one commit batch); ``call``, the
  grpcio handler, runs the same step (brain.api.unary.run_step, the row made
  by brain.api.unary.stepped_rpc);
* unary without a step: ``call(request, context)``, a servicer method; the
  native front runs it in its pool;
* server stream: ``call(request, context)`` yields responses (the native
  front drives it in its pool), unless ``subscribe(request, send)`` is given,
  which the native front uses instead: the service sends each message,
  ``encode``d, from whichever thread has news;
* bidirectional stream: ``call(request_iterator, context)`` for grpcio;
  ``session`` names the native front's session kind ("watch", "keepalive").

``raw_request``: ``call`` takes the request's bytes and parses them itself
(to answer a malformed one with grpc-go's text).  ``response`` None: the
handler yields encoded bytes already.

``guard`` (a step's, while auth is on: brain.api.authz): what etcd checks
before it serves the call, given (auth state, caller, request); None
checks only that the caller's credential is valid; authz.PUBLIC names no
caller at all.  Pool calls and streams check in their own code.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from brain.api.grpc_stats import BIDI_STREAM, SERVER_STREAM, UNARY

# What a unary read needs before it may be answered (an Rpc's ``read``
# returns one of these, or None for a write).
SERIALIZABLE, LINEARIZABLE = 1, 2


def read_kind_always(_request) -> int:
    return LINEARIZABLE


class Rpc(NamedTuple):
    name: str
    request: type
    response: type | None
    call: Callable
    shape: str = UNARY
    step: Callable | None = None
    read: Callable | None = None
    session: str | None = None
    subscribe: Callable | None = None
    encode: Callable | None = None
    raw_request: bool = False
    guard: Callable | None = None
    # decode(payload) -> request or None: the native front reads a step's
    # request from its bytes with this first (None: with the protobuf
    # class); step, read and guard take what it returns.
    decode: Callable | None = None


class ServiceTable(NamedTuple):
    service: str  # the gRPC service name, e.g. "etcdserverpb.KV"
    rpcs: tuple[Rpc, ...]


__all__ = ["BIDI_STREAM", "LINEARIZABLE", "Rpc", "SERIALIZABLE", "SERVER_STREAM", "ServiceTable", "UNARY",
           "read_kind_always"]
