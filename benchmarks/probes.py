"""The harness's own gRPC calls to a server under benchmark (not load: the
load tools make that): readiness, the key the range workloads read, the head
revision and the count of a prefix.  Every read is linearizable, so what it
sees is what the server acknowledged."""

from __future__ import annotations

from tests.support.tls import TestPKI

# The limit on answers the harness's channels have always had (grpc's default is 4 MiB).
_BIG_MESSAGES = [("grpc.max_receive_message_length", 64 << 20)]


def kv_channel(endpoint: str, tls: TestPKI | None = None, options=()):
    """(channel, KV stub) to ``endpoint``: mutual TLS with the run's client certificate when ``tls`` is given."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    if tls is None:
        ch = grpc.insecure_channel(endpoint, options=list(options))
    else:
        ch = grpc.secure_channel(endpoint, tls.channel_credentials(), options=list(options))
    return ch, rpc_pb2_grpc.KVStub(ch)


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


# The key the readiness probe reads unless a group names another (absent: the answer is what counts).
READY_KEY = b"/bench-readiness"


def ready_get(endpoint: str, key: bytes, timeout: float, tls: TestPKI | None = None) -> bool:
    """The readiness probe, the same for every server: a linearizable Get of one key, which costs a
    server the same at 10M keys as at none (a count over the data set cost etcd 3.27 s at 10M keys
    and brain 0.26 ms, so timing a restart by it measured the count).  Returns whether the key was
    found; a failed call raises."""
    from brain.api.pb.etcdserverpb import rpc_pb2

    ch, kv = kv_channel(endpoint, tls)
    try:
        return bool(kv.Range(rpc_pb2.RangeRequest(key=key), timeout=timeout).kvs)
    finally:
        ch.close()


def put_key(endpoint: str, key: bytes, value: bytes, tls: TestPKI | None = None) -> None:
    from brain.api.pb.etcdserverpb import rpc_pb2

    ch, kv = kv_channel(endpoint, tls, _BIG_MESSAGES)
    try:
        kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=30)
    finally:
        ch.close()


def head_revision(endpoint: str) -> int | None:
    """The header revision of a linearizable read: the newest acknowledged write."""
    from brain.api.pb.etcdserverpb import rpc_pb2

    ch, kv = kv_channel(endpoint, options=_BIG_MESSAGES)
    try:
        return int(kv.Range(rpc_pb2.RangeRequest(key=b"/bench-head"), timeout=60).header.revision)
    except Exception:
        return None
    finally:
        ch.close()


def count_prefix(endpoint: str, prefix: bytes, timeout: float = 120) -> int | None:
    """The keys under ``prefix`` (a linearizable count_only Range), or None when the server does not answer."""
    from brain.api.pb.etcdserverpb import rpc_pb2

    ch, kv = kv_channel(endpoint, options=_BIG_MESSAGES)
    try:
        return int(kv.Range(rpc_pb2.RangeRequest(key=prefix, range_end=_prefix_end(prefix), count_only=True),
                            timeout=timeout).count)
    except Exception:
        return None
    finally:
        ch.close()
