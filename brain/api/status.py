"""How a call ends when it fails: the gRPC status, made in one place for
both fronts.

Errors keep etcd's codes and texts: the engine and the steps raise
EtcdError, and ``status_of`` turns one into the status etcd would send.
Any other exception is a bug: it is logged with its traceback and answered
with UNKNOWN, and the server goes on serving.  The two failures grpc-go
itself answers before a handler runs (a request it cannot parse, one over
the receive limit) have its texts here.

grpcio's handlers abort their context with a (grpc.StatusCode, message)
pair; the native front hands the transport a ``Status``: the code's
number, its Go name (what the metrics count it under, brain.api.grpc_stats)
and the message.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import grpc

from brain.api.grpc_stats import GO_CODE_NAMES
from brain.mvcc.errors import EtcdError

log = logging.getLogger("brain.api")

# The gRPC status code for each EtcdError.code name.
_STATUS = {c.name: c for c in grpc.StatusCode}


def status_of(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    """The (status, message) a failed call ends with."""
    if isinstance(exc, EtcdError):
        code = _STATUS.get(exc.code)
        if code is not None:
            return code, exc.message
        log.error("%s: EtcdError with unknown status code %r: %s", method, exc.code, exc.message)
        return grpc.StatusCode.UNKNOWN, exc.message
    log.error("%s failed unexpectedly", method, exc_info=exc)
    return grpc.StatusCode.UNKNOWN, f"brain: internal error in {method}: {type(exc).__name__}: {exc}"


def unparsable(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """grpc-go's answer to a request message it cannot parse (a DecodeError)."""
    return grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {exc}"


def too_large(size: int, limit: int) -> tuple[grpc.StatusCode, str]:
    """grpc-go's answer to a request message over the receive limit."""
    return grpc.StatusCode.RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({size} vs. {limit})"


class Status(NamedTuple):
    """A status as the native transport sends it, with its Go name for the metrics."""

    code: int
    name: str
    message: str

    @classmethod
    def of(cls, code: grpc.StatusCode, message: str) -> Status:
        return cls(code.value[0], GO_CODE_NAMES.get(code, "Unknown"), message)

    @classmethod
    def of_error(cls, exc: BaseException, method: str) -> Status:
        """What a call of ``method`` that raised ``exc`` ends with (status_of)."""
        return cls.of(*status_of(exc, method))


OK = Status(0, "OK", "")


def fail_call(transport, stats, cid: int, stats_key: tuple, status: Status) -> None:
    """End call ``cid`` on the native transport with ``status``, counted as
    a call handled with one message received and none sent."""
    stats.on_handled(stats_key, status.name, 1, 0)
    transport.fail(cid, status.code, status.message)


__all__ = ["OK", "Status", "fail_call", "status_of", "too_large", "unparsable"]
