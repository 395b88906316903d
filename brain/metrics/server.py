"""HTTP listeners for --listen-metrics-urls: /metrics, /health, /livez, /readyz, /version.

Each URL (http://host:port or https://host:port; https uses --cert-file and
--key-file, like etcd's client TLS) gets a small threaded HTTP/1.1 server.
The answers are brain.metrics.http's, the same as on the client port.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from brain.config import ConfigError, parse_listen_url

from .collector import build_registry
from .http import HttpEndpoints

log = logging.getLogger("brain.metrics")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: "MetricsServer"  # set on the per-server subclass

    def log_message(self, fmt, *args) -> None:  # route through logging, quietly
        log.debug("%s %s", self.address_string(), fmt % args)

    def send_response(self, code: int, message=None) -> None:
        """As http.server's, without its Server header (etcd sends none)."""
        self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def _send(self, code: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        a = self.owner.endpoints_http.answer(self.command, self.path)
        try:
            self._send(a.status, a.body, a.content_type, dict(a.headers))
        except BrokenPipeError:
            pass

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """Serves one engine's metrics and health on every given URL."""

    def __init__(self, engine, urls, *, grpc_stats=None, transport_stats=None, cert_file: str = "",
                 key_file: str = "") -> None:
        self.engine = engine
        self.urls = list(urls)
        self.cert_file = cert_file
        self.key_file = key_file
        self.registry = build_registry(engine, grpc_stats, transport_stats)
        self.endpoints_http = HttpEndpoints(engine, self.registry)
        self.endpoints: list[str] = []
        self._servers: list[tuple[_HTTPServer, threading.Thread]] = []

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"owner": self})
        try:
            for url in self.urls:
                lu = parse_listen_url(url)
                if lu.is_unix:
                    raise ConfigError(f"--listen-metrics-urls: unix sockets are not supported: {url}")
                host, _, port = lu.address.rpartition(":")
                host = host.strip("[]")
                cls = _HTTPServer6 if ":" in host else _HTTPServer
                try:
                    srv = cls((host, int(port)), handler)
                except OSError as e:
                    raise ConfigError(f"listen tcp {lu.address}: bind: {(e.strerror or str(e)).lower()}") from None
                if lu.secure:
                    if not (self.cert_file and self.key_file):
                        srv.server_close()
                        raise ConfigError(f"--listen-metrics-urls {url}: https needs --cert-file and --key-file")
                    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                    ctx.load_cert_chain(self.cert_file, self.key_file)
                    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
                t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2},
                                     name=f"brain-metrics-{srv.server_address[1]}", daemon=True)
                t.start()
                self._servers.append((srv, t))
                shown = f"[{host}]" if ":" in host else host
                self.endpoints.append(f"{lu.scheme}://{shown}:{srv.server_address[1]}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        servers, self._servers = self._servers, []
        for srv, t in servers:
            srv.shutdown()
            srv.server_close()
            t.join(timeout=5)
        self.registry.detach()
