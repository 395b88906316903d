"""brain._transport's guarantees, checked from the wire: mutual TLS
(handshakes refused and counted, the client's common name delivered, TLS
1.2 and 1.3, cipher suites, certificate, CA bundle and CRL reload under an
open connection, etcd's client certificate narrowing as the transport
reports it, no plaintext on https),
bad input (HTTP/1.1 and garbage on the gRPC port), keepalive on half-open
connections, bounded send queues, and the unix-socket authority of grpc-go
clients.

Raw HTTP/2 clients here are a few frames written by hand (no client
library would leave flow control closed or pings unanswered on purpose).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from brain.api import native_front
from brain.api.native_listeners import TlsFiles
from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.server import ApiServer
from brain.config import ConfigError, ServerConfig
from brain.engine import Engine, EngineConfig
from tests.k8s.pki import Issuer, save_pair
from tests.support.servers import in_ci, unavailable
from tests.support.tls import CLIENT_CN, channel, issue_client, make_test_pki, serial_of, write_crl

if not native_front.available():  # skipped outside CI only: under CI a missing build fails
    unavailable(native_front.unavailable_message(), module=True)

from brain import _transport as T  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def _tls_args(pki, **kw):
    return TlsFiles(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert), True, **kw).args


class _Echo:
    """A raw Transport with one unary and one bidi method, answered by a
    thread that records every event."""

    def __init__(self, tls=None, unix=None, **kw) -> None:
        self.t = T.Transport([("/t.T/Unary", T.KIND_UNARY), ("/t.T/Bidi", T.KIND_BIDI)], **kw)
        if unix:
            self.t.listen_unix(unix, tls)
            self.target = "unix:" + unix
        else:
            self.port = self.t.listen_tcp("127.0.0.1", 0, tls)
            self.target = f"127.0.0.1:{self.port}"
        self.events: list = []
        self.t.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self.t.recv_batch(64)) is not None:
            for ev in batch:
                self.events.append(ev)
                if ev[0] == T.EV_CALL:
                    self.t.respond(ev[1], ev[3])
                elif ev[0] == T.EV_HTTP and ev[3] != "/health":
                    self.t.http_respond(ev[1], 404, [("Content-Type", "text/plain")], b"no\n")

    def wait_for(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in list(self.events):
                if pred(ev):
                    return ev
            time.sleep(0.01)
        raise AssertionError(f"no such event; got {self.events}")

    def close(self) -> None:
        self.t.close()
        self._thread.join(5)


@pytest.fixture
def echo_tls(pki):
    e = _Echo(_tls_args(pki))
    yield e
    e.close()


def _unary(ch: grpc.Channel, payload: bytes = b"hi", timeout=5.0) -> bytes:
    return ch.unary_unary("/t.T/Unary")(payload, timeout=timeout)


# -- mutual TLS ---------------------------------------------------------------


def test_common_name_reaches_python(echo_tls, pki):
    with channel(echo_tls.target, pki) as ch:
        assert _unary(ch) == b"hi"
    ev = echo_tls.wait_for(lambda e: e[0] == T.EV_CALL)
    assert ev[4] == CLIENT_CN


def test_the_common_name_is_the_last_cn_as_go_reads_it(tmp_path, pki):
    """Go's Subject.CommonName is the subject's last CN attribute: etcd's
    allowed CNs and its auth see that one, and so does brain."""
    two = issue_client(pki.ca, tmp_path, "two", ["first-cn", "second-cn"])
    e = _Echo(_tls_args(pki))
    try:
        with grpc.secure_channel(e.target, pki.channel_credentials(two)) as ch:
            assert _unary(ch) == b"hi"
        assert e.wait_for(lambda ev: ev[0] == T.EV_CALL)[4] == "second-cn"
    finally:
        e.close()


def _failures(t) -> dict:
    return t.stats()["tls_handshake_failures"]


def _counted(t, reason: str, at_least: int = 1) -> int:
    """The handshake failure count for ``reason`` once it reaches
    ``at_least`` (it is counted just after the peer is told)."""
    deadline = time.monotonic() + 5
    while _failures(t)[reason] < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return _failures(t)[reason]


def test_client_without_certificate_fails_the_handshake(echo_tls, pki):
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    with grpc.secure_channel(echo_tls.target, creds) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _unary(ch)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _counted(echo_tls.t, "no_client_certificate") >= 1
    assert not [e for e in echo_tls.events if e[0] == T.EV_CALL]


def test_wrong_ca_is_refused_and_counted(echo_tls, pki):
    with grpc.secure_channel(echo_tls.target, pki.channel_credentials(pki.other_client)) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _unary(ch)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _counted(echo_tls.t, "bad_certificate") >= 1
    assert not [e for e in echo_tls.events if e[0] == T.EV_CALL]


def _ssl_client(pki, version_min=None, version_max=None, ciphers=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    ctx.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    if version_min:
        ctx.minimum_version = version_min
    if version_max:
        ctx.maximum_version = version_max
    if ciphers:
        ctx.set_ciphers(ciphers)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _handshake(port: int, ctx: ssl.SSLContext) -> tuple[str, str, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            s.recv(100)
            return s.version(), s.cipher()[0], s.getpeercert()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls12_and_tls13(echo_tls, pki, version):
    got, _, _ = _handshake(echo_tls.port, _ssl_client(pki, version, version))
    assert got == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]


def test_cipher_suites_restrict_tls12(pki):
    cfg = ServerConfig(data_dir="unused", cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"])
    e = _Echo(_tls_args(pki, cipher_suites=cfg.rustls_cipher_suites()))
    try:
        v12 = ssl.TLSVersion.TLSv1_2
        _, cipher, _ = _handshake(e.port, _ssl_client(pki, v12, v12))
        assert cipher == "ECDHE-ECDSA-AES256-GCM-SHA384"
        with pytest.raises(ssl.SSLError):
            _handshake(e.port, _ssl_client(pki, v12, v12, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))
        # TLS 1.3 suites are not configurable (as in Go)
        assert _handshake(e.port, _ssl_client(pki))[0] == "TLSv1.3"
    finally:
        e.close()


def test_cipher_suite_names_are_etcds():
    with pytest.raises(ConfigError, match='unexpected TLS cipher suite "TLS_NOPE"'):
        ServerConfig(data_dir="unused", cipher_suites=["TLS_NOPE"]).validate()
    with pytest.raises(ConfigError, match="not supported"):
        ServerConfig(data_dir="unused", cipher_suites=["TLS_RSA_WITH_AES_128_CBC_SHA"]).validate()
    with pytest.raises(ConfigError, match="only TLS1.3"):
        ServerConfig(data_dir="unused", cipher_suites=["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
                     tls_min_version="TLS1.3").validate()


def _client_ctx(cafile, client) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cafile))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _seen(port: int, ctx: ssl.SSLContext) -> str:
    """What a client sees: "served" (an HTTP answer), the handshake's
    alert, or "closed" (close_notify after the handshake)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = s.recv(12)
        except ssl.SSLZeroReturnError:
            return "closed"
        except ssl.SSLError as e:
            return f"alert {e.reason}"
    return "served" if data.startswith(b"HTTP/1.1 ") else "closed" if data == b"" else repr(data)


def _replace(path, data: bytes) -> None:
    """Rotate a file as deployments do: write a new one, rename it over."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _rejected(e: "_Echo", start: str):
    return e.wait_for(lambda ev: ev[0] == T.EV_REJECTED and ev[4][0].startswith(start))


def test_certificates_the_ca_bundle_and_the_crl_rotate_under_an_open_connection(tmp_path, pki):
    """Each file is re-read for the connections that follow its change; a
    connection opened before keeps working through all of them (were it
    dropped, its client could not come back: it trusts the old server
    certificate, its CA leaves the bundle, its certificate is revoked)."""
    live = tmp_path / "live"
    live.mkdir()
    for src, name in ((pki.server.cert, "server.crt"), (pki.server.key, "server.key"), (pki.ca.cert, "ca.crt")):
        shutil.copy(src, live / name)
    crl = write_crl(pki.ca, live / "crl.der")
    e = _Echo(TlsFiles(str(live / "server.crt"), str(live / "server.key"), str(live / "ca.crt"), True,
                       crl_file=str(crl)).args)
    ch = channel(e.target, pki)
    try:
        assert _unary(ch) == b"hi"
        # the server certificate: a renewal from another CA
        renewal = Issuer("brain-test-renewal-ca")
        renewal_ca = renewal.save(tmp_path, "renewal-ca")
        renewed = save_pair(tmp_path, "renewed", renewal.issue("brain-renewed", dns=("localhost",),
                                                               ips=("127.0.0.1",), server=True, client=True))
        _replace(live / "server.key", renewed.key.read_bytes())
        _replace(live / "server.crt", renewed.cert.read_bytes())
        cert = _handshake(e.port, _client_ctx(renewal_ca.cert, pki.client))[2]
        assert dict(x[0] for x in cert["subject"])["commonName"] == "brain-renewed"
        assert _unary(ch) == b"hi"
        # the CA bundle: the other CA's clients only
        _replace(live / "ca.crt", pki.other_ca.cert.read_bytes())
        assert _seen(e.port, _client_ctx(renewal_ca.cert, pki.client)) == "alert TLSV1_ALERT_UNKNOWN_CA"
        assert _seen(e.port, _client_ctx(renewal_ca.cert, pki.other_client)) == "served"
        assert _unary(ch) == b"hi"
        # the CRL: both clients revoked; a revoked one is closed after its handshake
        _replace(crl, write_crl(pki.other_ca, tmp_path / "crl2.der", [pki.client, pki.other_client]).read_bytes())
        assert _seen(e.port, _client_ctx(renewal_ca.cert, pki.other_client)) == "closed"
        ev = _rejected(e, "transport: certificate serial ")
        assert ev[4] == (f"transport: certificate serial {_go_hex(serial_of(pki.other_client))} revoked", [], [])
        assert _counted(e.t, "revoked") == 1
        assert _unary(ch) == b"hi"
        # a CRL that cannot be parsed refuses every client certificate until it can
        _replace(crl, b"not a CRL")
        assert _seen(e.port, _client_ctx(renewal_ca.cert, pki.other_client)) == "closed"
        assert _rejected(e, "x509: ")[4][0] == "x509: malformed crl"
        assert _counted(e.t, "crl_unusable") == 1
        _replace(crl, write_crl(pki.other_ca, tmp_path / "crl3.der").read_bytes())
        assert _seen(e.port, _client_ctx(renewal_ca.cert, pki.other_client)) == "served"
        assert _unary(ch) == b"hi"
    finally:
        ch.close()
        e.close()


def _go_hex(serial: int) -> str:
    """etcd's rendering of a serial: %x of the string of its big-endian bytes
    (big.Int.Bytes()), two digits a byte, so a first byte below 0x10 keeps
    its leading zero."""
    return serial.to_bytes((serial.bit_length() + 7) // 8, "big").hex()


def test_a_revoked_serial_is_logged_as_etcd_prints_it(tmp_path, pki):
    """etcd prints the serial's bytes with %x (a string, not a *big.Int):
    a serial whose first byte is below 0x10 keeps its leading zero."""
    serial = 0x050E17B57BF0DE2E657324621835FCDC8B7B23FF
    revoked = issue_client(pki.ca, tmp_path, "low-serial", ["low-serial"], serial=serial)
    crl = write_crl(pki.ca, tmp_path / "crl.der", [revoked])
    e = _Echo(_tls_args(pki, crl_file=str(crl)))
    try:
        assert _seen(e.port, _client_ctx(pki.ca.cert, revoked)) == "closed"
        ev = _rejected(e, "transport: certificate serial ")
        assert ev[4] == ("transport: certificate serial 050e17b57bf0de2e657324621835fcdc8b7b23ff revoked", [], [])
        assert _go_hex(serial) == "050e17b57bf0de2e657324621835fcdc8b7b23ff"
    finally:
        e.close()


def test_a_refused_certificate_is_logged_with_its_names(tmp_path, pki):
    """The allowed names refuse in the handshake (bad_certificate, as Go);
    the log gets the certificate's DNS names and IP addresses, as etcd's."""
    named = issue_client(pki.ca, tmp_path, "named", ["named"], dns=("a.brain.test",), ips=("::ffff:10.1.2.3",))
    e = _Echo(_tls_args(pki, allowed_cns=["someone-else"]))
    try:
        assert _seen(e.port, _client_ctx(pki.ca.cert, named)) == "alert SSLV3_ALERT_BAD_CERTIFICATE"
        ev = _rejected(e, "client certificate")
        assert ev[4] == ("client certificate authentication failed", ["10.1.2.3"], ["a.brain.test"])
        assert _counted(e.t, "not_allowed") == 1
        # no certificate: refused before the names are looked at, and logged without them
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        assert _seen(e.port, ctx) == "alert TLSV13_ALERT_CERTIFICATE_REQUIRED"
        assert _rejected(e, "tls: client didn't")[4] == ("tls: client didn't provide a certificate", None, None)
    finally:
        e.close()


def test_a_crl_that_cannot_be_used_is_refused_at_start(tmp_path, pki):
    with pytest.raises(ValueError, match=r"--client-crl-file .*crl.pem: x509: malformed crl"):
        T.check_tls(_tls_args(pki, crl_file=str(write_crl(pki.ca, tmp_path / "crl.pem", pem=True))))
    with pytest.raises(ValueError, match=r"--client-crl-file .*nothing.der: open .*nothing.der: no such file"):
        T.check_tls(_tls_args(pki, crl_file=str(tmp_path / "nothing.der")))
    T.check_tls(_tls_args(pki, crl_file=str(write_crl(pki.ca, tmp_path / "crl.der"))))


def test_no_plaintext_on_an_https_listener(echo_tls):
    with grpc.insecure_channel(echo_tls.target) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _unary(ch, timeout=3)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    with socket.create_connection(("127.0.0.1", echo_tls.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = s.recv(4096)
    assert not data.startswith(b"HTTP/")  # a TLS alert or nothing, never an answer
    assert _counted(echo_tls.t, "not_tls", 2) >= 2
    assert not [e for e in echo_tls.events if e[0] in (T.EV_CALL, T.EV_HTTP)]


# -- bad input ------------------------------------------------------------------


def test_garbage_and_plain_http_on_the_grpc_port():
    e = _Echo()
    try:
        for junk in (b"\x16\x03\x01garbage\r\n\r\n", b"NOT HTTP AT ALL\x00\x01\r\n\r\n", b"\xff" * 100):
            with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
                s.sendall(junk)
                data = s.recv(4096)
                assert data.startswith(b"HTTP/1.1 400 Bad Request"), data
                assert s.recv(4096) == b""  # closed
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            ev = e.wait_for(lambda ev: ev[0] == T.EV_HTTP)
            assert (ev[2], ev[3]) == ("GET", "/health")
            e.t.http_respond(ev[1], 200, [("Content-Type", "text/plain")], b"fine")
            assert s.recv(4096).endswith(b"\r\n\r\nfine")
        assert e.t.stats()["bad_requests"] == 3
        with grpc.insecure_channel(e.target) as ch:
            assert _unary(ch, b"still serving") == b"still serving"
    finally:
        e.close()


# -- raw HTTP/2 ------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    # HPACK literal header field without indexing, new name, no Huffman
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _grpc_headers(path: bytes, authority: bytes = b"localhost") -> bytes:
    return b"".join(_literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", authority),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])


def _grpc_message(msg: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def _read_frames(s: socket.socket, until, timeout=5.0) -> list[tuple[int, int, int, bytes]]:
    s.settimeout(timeout)
    buf = b""
    frames = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            f = (buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n])
            buf = buf[9 + n:]
            frames.append(f)
            if until(f):
                return frames
        chunk = s.recv(65536)
        if not chunk:
            frames.append((-1, 0, 0, b""))  # closed
            return frames
        buf += chunk
    return frames


def test_keepalive_closes_a_half_open_connection():
    e = _Echo(keepalive_interval_ms=200, keepalive_timeout_ms=300)
    try:
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(PREFACE + _frame(0x4, 0, 0))  # SETTINGS; pings are never answered
            frames = _read_frames(s, lambda f: f[0] == -1, timeout=5)
        kinds = [f[0] for f in frames]
        assert 0x6 in kinds and kinds[-1] == -1, kinds  # a PING, then the server hung up
        assert e.t.stats()["keepalive_timeouts"] == 1
    finally:
        e.close()


def test_a_stream_that_never_reads_has_a_bounded_send_queue():
    e = _Echo(send_queue_bytes=64 * 1024)
    try:
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(PREFACE + _frame(0x4, 0, 0) + _frame(0x4, 0x1, 0)
                      + _frame(0x1, 0x4, 1, _grpc_headers(b"/t.T/Bidi")))
            ev = e.wait_for(lambda ev: ev[0] == T.EV_OPEN)
            sid = ev[1]
            chunk = b"x" * 16384
            results = [e.t.send(sid, [chunk]) for _ in range(64)]  # 1 MiB for a 64 KiB window
            assert results[0] and not all(results), "send() must report the full queue"
            assert not e.t.send(sid, [chunk])
            full_at = results.index(False)
            # at most the client's window (64 KiB, given to h2 meanwhile) plus the queue's limit
            assert full_at * 16384 <= 2 * 64 * 1024 + 16384
            # the client opens its windows: the queue drains and Python hears of it
            s.sendall(_frame(0x8, 0, 0, struct.pack(">I", 1 << 30)) + _frame(0x8, 0, 1, struct.pack(">I", 1 << 30)))
            got = 0
            s.settimeout(0.1)
            deadline = time.monotonic() + 10
            while not [x for x in e.events if x[0] == T.EV_WRITABLE] and time.monotonic() < deadline:
                try:
                    got += len(s.recv(1 << 20))
                except TimeoutError:
                    pass
            assert [x for x in e.events if x[0] == T.EV_WRITABLE and x[1] == sid]
            deadline = time.monotonic() + 10
            while got < 65 * 16384 and time.monotonic() < deadline:  # nothing given to send() was lost
                try:
                    got += len(s.recv(1 << 20))
                except TimeoutError:
                    pass
            assert got >= 65 * 16384
    finally:
        e.close()


def test_unix_socket_path_authority_is_accepted(tmp_path):
    path = str(tmp_path / "t.sock")
    e = _Echo(unix=path)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(PREFACE + _frame(0x4, 0, 0) + _frame(0x4, 0x1, 0)
                      + _frame(0x1, 0x4, 1, _grpc_headers(b"/t.T/Unary", authority=path.encode()))
                      + _frame(0x0, 0x1, 1, _grpc_message(b"via unix")))
            frames = _read_frames(s, lambda f: f[2] == 1 and f[1] & 0x1)
        assert (0x0, 1, _grpc_message(b"via unix")) in [(f[0], f[2], f[3]) for f in frames]
        assert not [f for f in frames if f[0] == 0x3]  # no RST_STREAM
    finally:
        e.close()


# -- through the whole server ---------------------------------------------------------


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if in_ci():
            pytest.fail(f"{tool} not found")
        pytest.skip(f"{tool} not found")
    return path


@pytest.fixture
def mtls_server(tmp_path, pki):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=1, shard_boundaries=[], watch_queue_events=200))
    srv = ApiServer(eng, ServerConfig(
        data_dir=str(tmp_path / "data"),
        listen_client_urls=["https://127.0.0.1:0", f"unixs://{tmp_path}/s.sock", f"unix://{tmp_path}/p.sock",
                            "http://127.0.0.1:0"],
        cert_file=str(pki.server.cert), key_file=str(pki.server.key), trusted_ca_file=str(pki.ca.cert),
        client_cert_auth=True))
    srv.start()
    yield srv
    srv.stop(1.0)
    eng.close()


def test_http_endpoints_over_https_and_http2_with_a_client_certificate(mtls_server, pki):
    """What kubeadm's ExternalEtcdVersion preflight does: GET /version over
    https with a client certificate (Go negotiates HTTP/2 by ALPN)."""
    curl = _require("curl")
    url = mtls_server.endpoints[0] + "/version"
    base = [curl, "-sS", "--cacert", str(pki.ca.cert), "--cert", str(pki.client.cert), "--key", str(pki.client.key)]
    for proto in ("--http2", "--http1.1"):
        out = subprocess.run([*base, proto, "-w", "\\n%{http_version} %{http_code}", url], capture_output=True,
                             text=True, timeout=20)
        body, _, status = out.stdout.rpartition("\n")
        assert status == ("2 200" if proto == "--http2" else "1.1 200"), out
        assert '"etcdserver":"' in body
    out = subprocess.run([*base[:-4], "-w", "%{http_code}", url], capture_output=True, text=True, timeout=20)
    assert out.returncode != 0  # no client certificate: no answer


def test_grpc_over_unixs(mtls_server, pki):
    with channel("unix:" + mtls_server.endpoints[1].removeprefix("unixs://"), pki) as ch:
        kv = rpc_pb2_grpc.KVStub(ch)
        kv.Put(pb.PutRequest(key=b"s", value=b"1"), timeout=10)
        assert kv.Range(pb.RangeRequest(key=b"s"), timeout=10).kvs[0].value == b"1"


def test_etcdctl_over_a_unix_socket(mtls_server):
    """grpc-go (etcdctl) sends the socket path as :authority."""
    etcdctl = _require("etcdctl")
    sock = mtls_server.endpoints[2]

    def run(*a):
        return subprocess.run([etcdctl, f"--endpoints={sock}", *a], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, ETCDCTL_API="3"))

    assert run("put", "u", "1").stdout.strip() == "OK"
    assert run("get", "u", "--print-value-only").stdout.strip() == "1"


def test_a_watch_that_never_reads_falls_back_to_catch_up(mtls_server, pki):
    """A Watch client that stops reading (it never opens its flow-control
    window): the transport's queue fills, the front stops polling, the hub
    moves the watcher to catch-up reads (--watch-queue-events=200 here), and
    everyone else is served."""
    port = int(mtls_server.endpoints[3].rsplit(":", 1)[1])
    create = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"slow")).SerializeToString()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(PREFACE + _frame(0x4, 0, 0) + _frame(0x4, 0x1, 0)
                  + _frame(0x1, 0x4, 1, _grpc_headers(b"/etcdserverpb.Watch/Watch"))
                  + _frame(0x0, 0x0, 1, _grpc_message(create)))
        _read_frames(s, lambda f: f[0] == 0x0 and f[2] == 1)  # the created response
        with channel(mtls_server.endpoints[0].removeprefix("https://"), pki) as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            with ThreadPoolExecutor(8) as pool:
                # 8 MiB of events: more than the window, the transport's
                # queue (4 MiB) and the hub's limit together
                list(pool.map(lambda i: kv.Put(pb.PutRequest(key=b"slow", value=b"v" * 8192), timeout=30),
                              range(1000)))
            deadline = time.monotonic() + 10
            while mtls_server.engine.watches.statistics()[1] != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            watchers, slow, streams = mtls_server.engine.watches.statistics()
            assert (watchers, slow, streams) == (1, 1, 1)
            assert kv.Range(pb.RangeRequest(key=b"slow"), timeout=10).kvs[0].version == 1000


def test_a_client_pinging_too_often_is_sent_away():
    """--grpc-keepalive-min-time, grpc-go's rule: more than two pings too
    soon after the previous one get GOAWAY ENHANCE_YOUR_CALM."""
    e = _Echo(keepalive_min_time_ms=5000)
    try:
        ping = _frame(0x6, 0, 0, b"12345678")
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(PREFACE + _frame(0x4, 0, 0) + ping * 4)
            frames = _read_frames(s, lambda f: f[0] == -1)
        goaway = [f for f in frames if f[0] == 0x7]
        assert goaway and int.from_bytes(goaway[0][3][4:8], "big") == 0xB  # ENHANCE_YOUR_CALM
        assert e.t.stats()["too_many_pings"] == 1
        # a client pinging while the server answers its calls (BDP pings) is not
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(PREFACE + _frame(0x4, 0, 0))
            frames = []
            for i in range(6):
                sid = 2 * i + 1
                s.sendall(ping + _frame(0x1, 0x4, sid, _grpc_headers(b"/t.T/Unary"))
                          + _frame(0x0, 0x1, sid, _grpc_message(b"x")))
                frames += _read_frames(s, lambda f, sid=sid: f[2] == sid and f[1] & 0x1)
        assert not [f for f in frames if f[0] in (0x7, -1)]
        assert e.t.stats()["too_many_pings"] == 1
    finally:
        e.close()
