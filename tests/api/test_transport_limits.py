"""brain._transport's bounds on what one client can make the server hold,
checked from the wire: --max-connections, --max-concurrent-streams
(etcd's), and --max-connection-bytes on both sides of a connection."""

from __future__ import annotations

import socket
import struct
import threading
import time

from brain.api import native_front
from tests.support.abuse import PREFACE, RawH2, frame, grpc_headers, grpc_message
from tests.support.servers import unavailable

if not native_front.available():  # skipped outside CI only: under CI a missing build fails
    unavailable(native_front.unavailable_message(), module=True)

from brain import _transport as T  # noqa: E402

SETTINGS, RST_STREAM, REFUSED_STREAM, MAX_CONCURRENT_STREAMS = 0x4, 0x3, 0x7, 0x3


class _Held:
    """A raw Transport whose unary calls are answered only on ``answer()``."""

    def __init__(self, **kw) -> None:
        self.t = T.Transport([("/t.T/Unary", T.KIND_UNARY), ("/t.T/Bidi", T.KIND_BIDI)], **kw)
        self.port = self.t.listen_tcp("127.0.0.1", 0, None)
        self.t.start()
        self.events: list = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self.t.recv_batch(64)) is not None:
            with self.lock:
                self.events.extend(batch)

    def of(self, kind: int) -> list:
        with self.lock:
            return [e for e in self.events if e[0] & 0xFF == kind]

    def wait(self, cond, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def close(self) -> None:
        self.t.close()


def _frames(sock: socket.socket, seconds: float) -> list[tuple[int, int, int, bytes]]:
    sock.settimeout(0.2)
    buf = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
    out = []
    while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
        n = int.from_bytes(buf[:3], "big")
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out


def test_a_connection_beyond_max_connections_is_closed_at_once():
    h = _Held(max_connections=2)
    try:
        kept = [RawH2("127.0.0.1", h.port) for _ in range(2)]
        h.wait(lambda: h.t.stats()["connections_open"] == 2)
        with socket.create_connection(("127.0.0.1", h.port), timeout=5) as s:
            s.settimeout(5)
            assert s.recv(100) == b""  # closed by the server, nothing sent
        assert h.t.stats()["connections_refused"] == 1
        for c in kept:
            c.close()
        h.wait(lambda: h.t.stats()["connections_open"] == 0)
        with socket.create_connection(("127.0.0.1", h.port), timeout=5) as s:  # room again
            s.sendall(PREFACE + frame(SETTINGS, 0, 0))
            assert [f for f in _frames(s, 0.5) if f[0] == SETTINGS]
        assert h.t.stats()["connections_refused"] == 1
    finally:
        h.close()


def test_streams_beyond_max_concurrent_streams_are_refused():
    h = _Held(max_concurrent_streams=2)
    try:
        with socket.create_connection(("127.0.0.1", h.port), timeout=5) as s:
            s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, 0x1, 0))
            settings = [f for f in _frames(s, 0.5) if f[0] == SETTINGS and not f[1] & 0x1][0][3]
            values = {struct.unpack(">H", settings[i:i + 2])[0]: struct.unpack(">I", settings[i + 2:i + 6])[0]
                      for i in range(0, len(settings), 6)}
            assert values[MAX_CONCURRENT_STREAMS] == 2
            for sid in (1, 3, 5):
                s.sendall(frame(0x1, 0x4, sid, grpc_headers(b"/t.T/Bidi")))
            resets = [f for f in _frames(s, 1.0) if f[0] == RST_STREAM]
            assert [(f[2], int.from_bytes(f[3], "big")) for f in resets] == [(5, REFUSED_STREAM)]
        assert len(h.of(T.EV_OPEN)) == 2
        assert h.t.stats()["streams_at_limit"] >= 1
    finally:
        h.close()


def test_requests_a_connection_holds_are_bounded_by_max_connection_bytes():
    """Unary calls not yet answered hold their request's bytes: beyond
    --max-connection-bytes the connection is read no further (h2 grants
    no window), and answering lets the rest in."""
    h = _Held(max_recv_bytes=64 * 1024, max_connection_bytes=160 * 1024)
    try:
        c = RawH2("127.0.0.1", h.port)
        body = b"x" * (60 * 1024)
        for _ in range(8):
            sid = c.open(b"/t.T/Unary")
            c.message(sid, body, end=True)
        # 480 KiB sent, within h2's windows (1 MiB a stream, 8 MiB the connection): the budget stops it
        h.wait(lambda: len(h.of(T.EV_CALL)) >= 2)
        time.sleep(0.5)
        assert len(h.of(T.EV_CALL)) == 2  # 2 x 60 KiB fit in 160 KiB, a third does not
        st = h.t.stats()
        assert st["received_bytes"] <= 160 * 1024 and st["received_full"] >= 1
        answered = set()
        deadline = time.monotonic() + 20
        while len(answered) < 8 and time.monotonic() < deadline:  # answering frees the budget
            for ev in h.of(T.EV_CALL):
                if ev[1] not in answered:
                    answered.add(ev[1])
                    h.t.respond(ev[1], b"ok")
            time.sleep(0.05)
        assert len(answered) == 8
        h.wait(lambda: h.t.stats()["received_bytes"] == 0)
        c.close()
    finally:
        h.close()


def test_responses_queued_on_a_connection_are_bounded_by_max_connection_bytes():
    """Streams of a connection whose client does not read report full once
    the connection holds --max-connection-bytes, below their own limit."""
    h = _Held(send_queue_bytes=4 << 20, max_connection_bytes=256 * 1024)
    try:
        c = RawH2("127.0.0.1", h.port)
        for _ in range(4):
            c.open(b"/t.T/Bidi")
        h.wait(lambda: len(h.of(T.EV_OPEN)) == 4)
        sids = [ev[1] for ev in h.of(T.EV_OPEN)]
        chunk = b"y" * 16384
        sent = 0
        for _ in range(200):
            if not all([h.t.send(sid, [chunk]) for sid in sids]):
                break
            sent += 4 * len(chunk)
        # h2 takes 64 KiB (the client's window); the connection queues its budget; then full
        assert sent <= 64 * 1024 + 256 * 1024 + 4 * len(chunk), sent
        st = h.t.stats()
        assert st["queued_full"] >= 1 and st["queued_bytes"] <= 256 * 1024 + 4 * len(chunk)
        assert max(h.t.room(sid) for sid in sids) < 256 * 1024  # what h2 took since, at most
        c.close()
        h.wait(lambda: h.t.stats()["queued_bytes"] == 0)  # dropped with their streams
    finally:
        h.close()
