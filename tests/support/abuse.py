"""Clients that abuse a server, and one that behaves, for the abuse tests.

* ``RawH2``: a plaintext HTTP/2 connection that speaks just enough gRPC to
  open streams and send request messages, and never reads what the server
  sends (a client that stopped reading: the server's answers pile up on the
  server's side of the connection);
* ``stalled_watchers``: watch streams, each with watchers on the whole
  keyspace, that never read;
* ``churn_streams``: watch streams opened and dropped (reset, or their
  connection closed);
* ``big_requests``: requests at and over --max-request-bytes, in a loop;
* ``lease_flood``: LeaseGrant in a loop, and LeaseGrant calls pipelined on
  raw connections (thousands in flight on one connection);
* ``python -m tests.support.abuse good TARGET SECONDS``: a client that
  writes and reads one key after the other and prints every latency, as
  JSON (run as its own process, so the abusers' threads in the test
  process do not slow it down).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8

WATCH = b"/etcdserverpb.Watch/Watch"
LEASE_GRANT = b"/etcdserverpb.Lease/LeaseGrant"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def grpc_headers(path: bytes, authority: bytes = b"localhost") -> bytes:
    return b"".join(_literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", authority),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])


def grpc_message(msg: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def watch_everything() -> bytes:
    """A WatchRequest creating a watcher on every key."""
    from brain.api.pb.etcdserverpb import rpc_pb2 as pb

    return pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00")).SerializeToString()


class RawH2:
    """One plaintext HTTP/2 connection that never reads (unless ``read``
    is called): it opens streams and sends gRPC messages only.  Its flow
    control windows stay at HTTP/2's 64 KiB, so the server can send it
    that much and has to keep the rest."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.next_id = 1
        self.lock = threading.Lock()
        # SETTINGS (defaults), then the ACK of the server's once it came (an
        # ACK sent before it is a protocol error to h2, whatever the timing)
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        self._await_settings(timeout)
        self.send(frame(SETTINGS, ACK, 0))

    def _await_settings(self, timeout: float) -> None:
        """Read until the server's SETTINGS (the only read before ``read``)."""
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                kind, flags = buf[3], buf[4]
                buf = buf[9 + int.from_bytes(buf[:3], "big"):]
                if kind == SETTINGS and not flags & ACK:
                    return
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection before its SETTINGS")
            buf += chunk
        raise TimeoutError("no SETTINGS from the server")

    def send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def open(self, path: bytes, first: bytes | None = None, end: bool = False) -> int:
        """A new stream for ``path``; ``first``: its first message."""
        with self.lock:
            sid = self.next_id
            self.next_id += 2
            data = frame(HEADERS, END_HEADERS, sid, grpc_headers(path))
            if first is not None:
                data += frame(DATA, END_STREAM if end else 0, sid, grpc_message(first))
            self.sock.sendall(data)
        return sid

    def message(self, sid: int, msg: bytes, end: bool = False) -> None:
        """One gRPC message, in DATA frames of at most 16 KiB (HTTP/2's default)."""
        body = grpc_message(msg)
        out = []
        for i in range(0, len(body), 16384):
            last = i + 16384 >= len(body)
            out.append(frame(DATA, END_STREAM if end and last else 0, sid, body[i:i + 16384]))
        self.send(b"".join(out))

    def reset(self, sid: int) -> None:
        self.send(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))

    def read(self, timeout: float = 5.0) -> list[tuple[int, int, int, bytes]]:
        """The frames the server sent so far (what arrives within ``timeout``)."""
        self.sock.settimeout(timeout)
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(1 << 20)
            except (TimeoutError, socket.timeout):
                break
            if not chunk:
                break
            buf += chunk
        frames = []
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
            buf = buf[9 + n:]
        return frames

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def stalled_watchers(host: str, port: int, *, connections: int, streams: int, watchers: int) -> list[RawH2]:
    """``streams`` watch streams spread over ``connections`` connections,
    with ``watchers`` watchers on every key each; none of them ever reads."""
    conns = [RawH2(host, port) for _ in range(connections)]
    create = watch_everything()
    for i in range(streams):
        c = conns[i % connections]
        sid = c.open(WATCH, create)
        for _ in range(watchers - 1):
            c.message(sid, create)
    return conns


def churn_streams(host: str, port: int, count: int, per_connection: int = 100) -> None:
    """``count`` watch streams, each with one watcher, opened and dropped:
    half reset by the client, the other half with their connection."""
    create = watch_everything()
    done = 0
    while done < count:
        c = RawH2(host, port)
        n = min(per_connection, count - done)
        sids = [c.open(WATCH, create) for _ in range(n)]
        for sid in sids[: n // 2]:
            c.reset(sid)
        time.sleep(0.05)
        c.close()
        done += n


def big_requests(target: str, stop: threading.Event, max_request_bytes: int, seen: dict) -> None:
    """Txns carrying a value at --max-request-bytes (their compare fails:
    the write path reads and decides them, nothing is stored) and Puts over
    it, in a loop; ``seen`` counts the outcomes by status text."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2 as pb
    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    opts = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=opts) as ch:
        kv = rpc_pb2_grpc.KVStub(ch)
        at_limit = pb.TxnRequest(
            compare=[pb.Compare(key=b"big", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=-1)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=b"big", value=b"v" * (max_request_bytes - 200)))])
        over = pb.PutRequest(key=b"big", value=b"v" * (max_request_bytes + 1024))
        far_over = pb.PutRequest(key=b"big", value=b"v" * (max_request_bytes + (1 << 20)))
        while not stop.is_set():
            for call, req in ((kv.Txn, at_limit), (kv.Put, over), (kv.Put, far_over)):
                try:
                    call(req, timeout=30)
                    key = "OK"
                except grpc.RpcError as e:
                    key = f"{e.code().name}: {e.details()}"
                seen[key] = seen.get(key, 0) + 1


def lease_flood(target: str, stop: threading.Event, seen: dict, ttl: int = 600) -> None:
    """LeaseGrant in a loop, ``seen`` counting outcomes by status text."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2 as pb
    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        lease = rpc_pb2_grpc.LeaseStub(ch)
        while not stop.is_set():
            futures = [lease.LeaseGrant.future(pb.LeaseGrantRequest(TTL=ttl), timeout=30) for _ in range(64)]
            for f in futures:
                try:
                    f.result()
                    key = "OK"
                except grpc.RpcError as e:
                    key = f"{e.code().name}: {e.details()}"
                seen[key] = seen.get(key, 0) + 1


def pipelined_grants(host: str, port: int, calls: int, ttl: int = 600) -> RawH2:
    """``calls`` LeaseGrant calls sent on one connection at once, none of
    whose answers is read (the connection is returned, open)."""
    from brain.api.pb.etcdserverpb import rpc_pb2 as pb

    c = RawH2(host, port)
    req = pb.LeaseGrantRequest(TTL=ttl).SerializeToString()
    batch = []
    for _ in range(calls):
        sid = c.next_id
        c.next_id += 2
        batch.append(frame(HEADERS, END_HEADERS, sid, grpc_headers(LEASE_GRANT))
                     + frame(DATA, END_STREAM, sid, grpc_message(req)))
        if len(batch) == 256:
            c.send(b"".join(batch))
            batch = []
    if batch:
        c.send(b"".join(batch))
    return c


# -- the client that behaves -----------------------------------------------------


def good_client(target: str, seconds: float) -> dict:
    """Put then a linearizable Range of the same key, one after the other,
    for ``seconds``; every call's latency in ms, by kind, and the errors."""
    import grpc

    from brain.api.pb.etcdserverpb import rpc_pb2 as pb
    from brain.api.pb.etcdserverpb import rpc_pb2_grpc

    out: dict = {"put": [], "range": [], "errors": []}
    with grpc.insecure_channel(target) as ch:
        kv = rpc_pb2_grpc.KVStub(ch)
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            key = b"good/%d" % (i % 100)
            value = b"v%d" % i
            for kind, call, req in (("put", kv.Put, pb.PutRequest(key=key, value=value)),
                                    ("range", kv.Range, pb.RangeRequest(key=key))):
                t0 = time.perf_counter()
                try:
                    resp = call(req, timeout=30)
                except grpc.RpcError as e:
                    out["errors"].append(f"{kind}: {e.code().name}: {e.details()}")
                    continue
                out[kind].append((time.perf_counter() - t0) * 1000)
                if kind == "range" and (not resp.kvs or resp.kvs[0].value != value):
                    out["errors"].append(f"range {key!r}: {resp.kvs[:1]!r}, wanted {value!r}")
            i += 1
    return out


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "good":
        json.dump(good_client(sys.argv[2], float(sys.argv[3])), sys.stdout)
    else:
        sys.exit("usage: python -m tests.support.abuse good TARGET SECONDS")
