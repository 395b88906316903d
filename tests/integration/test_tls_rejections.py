"""A refused TLS handshake is logged as etcd logs it.

A client without a certificate (or with one from another CA) sees only
`context deadline exceeded` on etcdctl, so the server's log is where the
operator learns why.  etcd 3.6 logs (server/embed/config_logging.go) a
warning "rejected connection on client endpoint" with remote-addr,
server-name and error, in Go's words ("tls: client didn't provide a
certificate"), and a peer that just closed (EOF) at debug level only.
brain logs the same line, in its text or JSON format.
"""

from __future__ import annotations

import json
import socket
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.servers import require_brain, shared_pki, start_brain

pytestmark = pytest.mark.timeout(120)

MESSAGE = "rejected connection on client endpoint"


def _rejections(srv, count: int, timeout: float = 15.0) -> list[str]:
    """The log's first ``count`` rejection lines, once there are that many."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [ln for ln in srv.log_path.read_text(errors="replace").splitlines() if MESSAGE in ln]
        if len(lines) >= count or time.monotonic() > deadline:
            assert len(lines) >= count, f"{len(lines)} of {count} rejections logged:\n{srv.log_tail()}"
            return lines[:count]
        time.sleep(0.05)


def _refused(port: int, client=None, server_name: str | None = None) -> None:
    """A Range over TLS that the server's handshake refuses."""
    pki = shared_pki()
    kw = {}
    if client is not None:
        kw = {"private_key": client.key.read_bytes(), "certificate_chain": client.cert.read_bytes()}
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes(), **kw)
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"k"), timeout=5)
    assert ei.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.fixture(scope="module")
def servers():
    require_brain()
    text = start_brain(1, transport="mtls")
    try:
        js = start_brain(1, transport="mtls", extra_args=["--log-format", "json"])
    except BaseException:
        text.cleanup()
        raise
    yield text, js
    text.cleanup()
    js.cleanup()


def test_a_client_without_a_certificate_is_logged_as_a_warning(servers):
    srv, _ = servers
    before = len(_rejections(srv, 0))
    # a peer that connects and closes: etcd logs that EOF at debug level, not as a warning
    socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    _refused(srv.port, server_name="localhost")
    _refused(srv.port, client=shared_pki().other_client)
    # events reach the log in order: once the two refusals are there, the EOF was handled
    lines = _rejections(srv, before + 2)[before:]
    no_cert, other_ca = lines
    assert " WARNING " in no_cert, no_cert
    assert "remote-addr=127.0.0.1:" in no_cert and "server-name=localhost" in no_cert, no_cert
    assert no_cert.endswith('error="tls: client didn\'t provide a certificate"'), no_cert
    assert " WARNING " in other_ca and 'server-name=""' in other_ca, other_ca
    assert other_ca.endswith(
        'error="tls: failed to verify certificate: x509: certificate signed by unknown authority"'), other_ca
    # the server still serves a client with the right certificate
    pki = shared_pki()
    with grpc.secure_channel(f"127.0.0.1:{srv.port}", pki.channel_credentials()) as ch:
        assert rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"k"), timeout=10).header.revision >= 1


def test_the_json_log_has_etcds_fields(servers):
    _, srv = servers
    _refused(srv.port)
    obj = json.loads(_rejections(srv, 1)[0])
    assert obj["level"] == "warn" and obj["msg"] == MESSAGE, obj
    assert obj["remote-addr"].startswith("127.0.0.1:") and obj["server-name"] == ""
    assert obj["error"] == "tls: client didn't provide a certificate"
