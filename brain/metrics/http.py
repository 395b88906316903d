"""etcd's HTTP endpoints as one function of (method, path): /health,
/livez, /readyz, /version and /metrics, with etcd's bodies.

Served twice: on --listen-metrics-urls (brain.metrics.server) and, as
etcd's connection multiplexer does, on the client port itself (the native
transport hands plain HTTP requests to ``HttpEndpoints.answer``).  The
answers follow etcd 3.6 (tests/integration/test_http_vs_etcd.py compares
them with a running one): /version is {"etcdserver", "etcdcluster",
"storage"} as application/json; /health is {"health","reason"} (200 or
503); /livez and /readyz are text (see health.py); those take GET only,
answering anything else as Go's http.Error does (405, Allow: GET); /metrics
answers every method, as Prometheus' Go handler does; paths are exact (no
trailing slash), and a HEAD answer has no body.  Where brain differs: it
serves /version on the metrics listener too (etcd only on the client port)
and /readyz has one more check, ``writable``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from prometheus_client import generate_latest

from brain.etcd_version import ETCD_CLUSTER_VERSION, ETCD_VERSION, STORAGE_VERSION

from .health import LIVEZ_CHECKS, READYZ_CHECKS, check_health, run_checks

log = logging.getLogger("brain.metrics")

TEXT = "text/plain; charset=utf-8"
# What etcd 3.6 (promhttp) says, and what generate_latest writes: the 0.0.4
# text format, names escaped with underscores (brain's need no escaping).
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
NOSNIFF = ("X-Content-Type-Options", "nosniff")


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    content_type: str
    body: bytes
    headers: tuple = field(default=())

    def header_list(self) -> list[tuple[str, str]]:
        return [("Content-Type", self.content_type), *self.headers]


def version_body() -> bytes:
    return json.dumps({"etcdserver": ETCD_VERSION, "etcdcluster": ETCD_CLUSTER_VERSION,
                       "storage": STORAGE_VERSION}, separators=(",", ":")).encode()


class HttpEndpoints:
    """Answers for one engine; ``registry`` is a brain.metrics Registry."""

    def __init__(self, engine, registry) -> None:
        self.engine = engine
        self.registry = registry

    def answer(self, method: str, target: str) -> HttpAnswer:
        a = self._answer(method, target)
        if method == "HEAD":  # Go's server never sends a body with HEAD
            a = HttpAnswer(a.status, a.content_type, b"", a.headers)
        return a

    def _answer(self, method: str, target: str) -> HttpAnswer:
        parts = urlsplit(target)
        query = parse_qs(parts.query, keep_blank_values=True)
        path = parts.path
        if path == "/metrics":
            return HttpAnswer(200, METRICS_TYPE, b"" if method == "HEAD" else generate_latest(self.registry.registry))
        root, _, name = path.lstrip("/").partition("/")
        known = path in ("/health", "/version", "/livez", "/readyz") or (root in ("livez", "readyz") and name)
        if not known:
            return HttpAnswer(404, TEXT, b"404 page not found\n", (NOSNIFF,))
        if method != "GET":
            return HttpAnswer(405, TEXT, b"Method Not Allowed\n", (("Allow", "GET"), NOSNIFF))
        if path == "/version":
            return HttpAnswer(200, "application/json", version_body())
        if path == "/health":
            exclude = {v for v in query.get("exclude", []) if v}
            h = check_health(self.engine, exclude)
            body = json.dumps({"health": "true" if h.health else "false", "reason": h.reason},
                              separators=(",", ":")).encode()
            if h.health:
                return HttpAnswer(200, TEXT, body)
            log.warning("/health error: %s", h.reason)
            return HttpAnswer(503, TEXT, body + b"\n", (NOSNIFF,))
        return self._checks(path, query)

    def _checks(self, path: str, query: dict) -> HttpAnswer:
        root, _, name = path.lstrip("/").partition("/")
        checks = LIVEZ_CHECKS if root == "livez" else READYZ_CHECKS
        if name:
            if name not in checks:
                return HttpAnswer(404, TEXT, b"404 page not found\n", (NOSNIFF,))
            names = [name]
        else:
            excluded = {v for v in query.get("exclude", []) if v}
            names = [n for n in checks if n not in excluded]
        ok, detail = run_checks(self.engine, checks, names)
        if not ok:
            # etcd 3.6: http.Error(w, reason, 503), which ends the reason with a newline
            return HttpAnswer(503, TEXT, (detail + "\n").encode(), (NOSNIFF,))
        body = (detail if "verbose" in query else "") + "ok\n"
        return HttpAnswer(200, TEXT, body.encode(), (NOSNIFF,))
