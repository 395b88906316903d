"""What every unary etcd call shares, whichever gRPC server carries it.

A call is split into a *step* that runs at once and, for writes, a
``Deferred`` part that runs when the engine has made the write durable:

    step(request) -> response message          (reads: answered at once)
    step(request) -> Deferred(write, finish)   (writes: finish(result) once
                                                the journal record is synced)

The split lets the native front (brain.api.native_front) hand a whole batch
of writes to the engine without a thread per call, while grpcio runs the
same steps (``stepped_rpc``'s handler) and simply waits on the write's future.

Errors: the engine and the steps raise EtcdError; brain.api.status turns
one into the gRPC status etcd would send, with etcd's exact text (any other
exception is a bug, answered with UNKNOWN).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, NoReturn

import grpc
from google.protobuf.message import DecodeError

from brain.api.require_leader import requires_leader
from brain.api.rpc_table import LINEARIZABLE, Rpc
from brain.api.status import status_of, too_large, unparsable
from brain.mvcc.errors import ErrNoLeader

# What a call refused during the shutdown grace period ends with (UNAVAILABLE).
SHUTTING_DOWN = "brain: server is shutting down"

class Deferred(NamedTuple):
    """A write the call must wait for: ``finish(result)`` builds the
    response once ``request`` (a core write request) is committed."""

    request: object
    finish: Callable[[object], object]
    # the client's bytes of a TxnRequest (convert.DecodedTxn.payload): a
    # follower forwards them as they are instead of encoding ``request``
    wire: bytes | None = None


def abort_with(context: grpc.ServicerContext, exc: BaseException, method: str) -> NoReturn:
    """End the call with the status for ``exc`` (raises, like context.abort)."""
    context.abort(*status_of(exc, method))


def wait_read_barrier(engine) -> None:
    """Block until linearizable reads may be answered (the engine's read
    barrier), raising the EtcdError it fails with.  grpcio's way; the native
    front asks once per batch instead."""
    engine.wait_linearizable()


def run_step(engine, step, request, context, method: str, linearizable: bool = False, gate=None, guard=None):
    """Run ``step`` to completion on the calling thread (the grpcio way);
    a linearizable read first waits for the engine's read barrier.  With
    auth on, ``gate`` (brain.api.authz.Gate) checks the caller first."""
    try:
        if linearizable:
            wait_read_barrier(engine)
        if gate is not None and gate.enabled:
            out = gate.step(step, guard, request, gate.caller_of_context(context))
        else:
            out = step(request)
        if type(out) is Deferred:
            out = out.finish(engine.submit(out.request).result())
        return out
    except Exception as e:  # noqa: BLE001 - every failure becomes a status
        abort_with(context, e, method)


def stepped_rpc(engine, method: str, request_cls, response_cls, step, read=None, *, gate=None,
                guard=None, decode=None) -> Rpc:
    """The table row of a unary RPC written as a step: the native front runs
    ``step`` itself; grpcio's handler runs it with run_step, behind the read
    barrier when ``read`` (the RPC's read kind) says LINEARIZABLE.  ``engine``
    may be None for a service whose steps neither defer nor read (health).
    ``gate`` and ``guard``: the auth checks (brain.api.rpc_table).
    ``decode``: the native front's reader of the request's bytes (see
    Rpc.decode)."""
    if read is None:
        def call(request, context):
            return run_step(engine, step, request, context, method, gate=gate, guard=guard)
    else:
        def call(request, context):
            return run_step(engine, step, request, context, method, linearizable=read(request) == LINEARIZABLE,
                            gate=gate, guard=guard)
    return Rpc(method, request_cls, response_cls, call, step=step, read=read, guard=guard, decode=decode)


def call_on_bytes(call, request_cls, recv_limit: int, has_leader=None):
    """``call(request, context)`` as a handler of the request's bytes: the
    receive limit applied with grpc-go's wording, then the request parsed
    (a malformed one is grpc-go's INTERNAL "error unmarshalling request").

    ``has_leader`` (grpcio's handlers): a call whose metadata requires a
    leader (brain.api.require_leader) is then refused without one, after
    the parse, where etcd's unary interceptor refuses it."""
    parse = request_cls.FromString

    def handle(raw: bytes, context: grpc.ServicerContext):
        if len(raw) > recv_limit:
            context.abort(*too_large(len(raw), recv_limit))
        try:
            request = parse(raw)
        except DecodeError as e:
            context.abort(*unparsable(e))
        if has_leader is not None and requires_leader(context.invocation_metadata()) and not has_leader():
            abort_with(context, ErrNoLeader, "")
        return call(request, context)

    return handle
