"""etcd's HTTP endpoints (/health, /livez, /readyz, /version, /metrics):
brain's answers next to a real etcd 3.6.16's, on the client port and on the
--listen-metrics-urls listener: status codes, content types, the headers a
client can act on (Allow, CORS, nosniff) and body shapes, healthy and with
an alarm raised through the Maintenance API.

Where brain knowingly differs, the comparison says so and the test checks
the difference itself:

* /readyz runs one more check, ``writable`` (a journal failure stops writes
  until a restart: brain.metrics.health); etcd prints its checks in map
  order, which varies between requests, so check lines are compared as sets;
* /version: the same keys, cluster and storage versions (3.6.0: brain
  reports itself as an etcd 3.7.3 member of a cluster still at 3.6,
  brain.etcd_version); the server version is brain's 3.7.3 where etcd's is
  3.6.16; and brain serves /version on the metrics listener too, where
  etcd answers 404;
* /metrics: brain exports a subset of etcd's families (same TYPE and HELP,
  same label names) plus its own brain_*, Python's runtime families instead
  of Go's, and the *_created series prometheus_client adds to histograms;
* the grpcio front serves no HTTP on the client port (only the metrics
  listener), and no grpc-gateway (/v3/...) is served anywhere.
"""

from __future__ import annotations

import http.client
import json
import re

import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.etcd_version import ETCD_VERSION
from tests.support.servers import BrainServer, free_port, require_brain, require_etcd, start_etcd

# Headers a client acts on; Date, Content-Length and Transfer-Encoding are
# the HTTP server's business (Go streams /metrics chunked).
COMPARED_HEADERS = ("Content-Type", "Allow", "X-Content-Type-Options", "Access-Control-Allow-Methods",
                    "Access-Control-Allow-Origin", "Access-Control-Allow-Headers", "Server")

REQUESTS = [
    ("GET", "/health"), ("GET", "/health?exclude=NOSPACE"), ("GET", "/health?serializable=true"),
    ("GET", "/livez"), ("GET", "/livez?verbose"), ("GET", "/livez?verbose=false"),
    ("GET", "/livez/serializable_read"), ("GET", "/livez/nope"), ("GET", "/livez/"),
    ("GET", "/readyz"), ("GET", "/readyz?verbose"), ("GET", "/readyz?exclude=linearizable_read&verbose"),
    ("GET", "/readyz?exclude=nope"), ("GET", "/readyz/serializable_read"), ("GET", "/readyz/data_corruption"),
    ("GET", "/readyz/nope"), ("GET", "/readyz/"),
    ("GET", "/version"), ("GET", "/version/"), ("GET", "/metrics/"), ("GET", "/nope"), ("GET", "/"),
    ("GET", "/health/"),
    ("POST", "/health"), ("HEAD", "/health"), ("PUT", "/livez"), ("DELETE", "/readyz"), ("HEAD", "/readyz"),
    ("POST", "/version"), ("HEAD", "/metrics"), ("OPTIONS", "/health"),
]


class _Servers:
    def __init__(self, etcd, brain, etcd_metrics: int, brain_metrics: int) -> None:
        self.etcd, self.brain = etcd, brain
        self.etcd_metrics, self.brain_metrics = etcd_metrics, brain_metrics


@pytest.fixture(scope="module", params=["native", "grpcio"])
def servers(request):
    require_etcd("3.6")
    require_brain()
    em, bm = free_port(), free_port()
    etcd = start_etcd(version="3.6", extra_args=["--listen-metrics-urls", f"http://127.0.0.1:{em}"])
    brain = BrainServer(shards=1, extra_args=["--listen-metrics-urls", f"http://127.0.0.1:{bm}",
                                              "--grpc-front", request.param])
    brain.front = request.param
    try:
        brain.start()
        yield _Servers(etcd, brain, em, bm)
    finally:
        brain.cleanup()
        etcd.cleanup()


def _get(port: int, method: str, path: str) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, {k: r.getheader(k) for k in COMPARED_HEADERS if r.getheader(k) is not None}, r.read()
    finally:
        conn.close()


def _shape(method: str, path: str, answer: tuple, *, brain: bool) -> tuple:
    """An answer with what may vary between servers made comparable."""
    status, headers, body = answer
    if path.startswith(("/readyz", "/livez")) and status in (200, 503) and method == "GET":
        lines = body.decode().splitlines(keepends=True)
        if brain:  # brain's extra check (see the module docstring)
            lines = [line for line in lines if not line.startswith(("[+]writable ", "[-]writable "))]
        body = frozenset(lines)
    elif path == "/version" and status == 200:
        v = json.loads(body)
        assert set(v) == {"etcdserver", "etcdcluster", "storage"}, v
        if brain:
            assert v["etcdserver"] == ETCD_VERSION, v
        else:
            assert re.fullmatch(r"3\.6\.\d+", v["etcdserver"]), v
        body = ("server version", v["etcdcluster"], v["storage"])
    return status, headers, body


def _compare(servers: _Servers, requests=REQUESTS) -> None:
    ports = [("metrics", servers.etcd_metrics, servers.brain_metrics)]
    if servers.brain.front == "native":  # grpcio: no HTTP on the client port
        ports.insert(0, ("client", servers.etcd.port, servers.brain.port))
    for where, etcd_port, brain_port in ports:
        for method, path in requests:
            if where == "metrics" and path.startswith("/version"):
                continue  # differs on purpose: test_version_on_the_metrics_listener
            want = _shape(method, path, _get(etcd_port, method, path), brain=False)
            got = _shape(method, path, _get(brain_port, method, path), brain=True)
            assert got == want, f"{method} {path} on the {where} listener: brain {got} etcd {want}"


def test_http_answers_match_etcd(servers):
    _compare(servers)


def test_version_on_the_metrics_listener(servers):
    """The one endpoint brain adds there: etcd 3.6 serves /version on the
    client port only."""
    assert _get(servers.etcd_metrics, "GET", "/version")[0] == 404
    status, headers, body = _get(servers.brain_metrics, "GET", "/version")
    assert (status, headers["Content-Type"]) == (200, "application/json")
    assert set(json.loads(body)) == {"etcdserver", "etcdcluster", "storage"}


def _families(port: int, method: str = "GET") -> tuple[dict, dict, dict]:
    """(TYPE, HELP, label names) by family, from a /metrics scrape."""
    status, headers, body = _get(port, method, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
    text = body.decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    labels: dict[str, set] = {}
    for name, labelstr in re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", text, re.M):
        family = re.sub(r"_(bucket|sum|count|total)$", "", name)
        keys = {k for k in re.findall(r'(\w+)="', labelstr) if k not in ("le", "quantile")}
        labels.setdefault(family, set()).update(keys)
    return types, helps, labels


def test_metrics_families_are_etcds(servers):
    e_types, e_helps, e_labels = _families(servers.etcd_metrics)
    b_types, b_helps, b_labels = _families(servers.brain_metrics, method="POST")  # any method, as promhttp
    own = {f for f in b_types if f.startswith(("brain_", "python_")) or f.endswith("_created")}
    # an alarm family with no alarm raised prints nothing on etcd (a Go vector with no children)
    shared = set(b_types) - own - {"etcd_debugging_server_alarms"}
    assert shared - set(e_types) == set(), "families brain exports that etcd 3.6 does not"
    assert {f: b_types[f] for f in shared} == {f: e_types[f] for f in shared}
    assert {f: b_helps[f] for f in shared} == {f: e_helps[f] for f in shared}
    for family, keys in b_labels.items():
        if family in e_labels and family in shared | {f.removesuffix("_total") for f in shared}:
            assert keys <= e_labels[family], f"{family}: labels {keys} not all etcd's {e_labels[family]}"
    assert len(shared) >= 25, sorted(shared)  # the comparison covers something


def _alarm(server, action: int, alarm: int) -> None:
    from tests.support.servers import kv_stub

    with kv_stub(server.endpoint) as s:
        member = s.maintenance.Status(pb.StatusRequest(), timeout=10).header.member_id
        s.maintenance.Alarm(pb.AlarmRequest(action=action, memberID=member, alarm=alarm), timeout=10)


def test_alarmed_answers_match_etcd(servers):
    """503s and their bodies: NOSPACE (unhealthy, still ready), CORRUPT
    (not ready either), then both, raised on both servers through the
    Maintenance API."""
    requests = [("GET", p) for p in ("/health", "/health?exclude=NOSPACE", "/health?exclude=CORRUPT", "/livez",
                                     "/livez?verbose", "/readyz", "/readyz?verbose", "/readyz/data_corruption",
                                     "/readyz?exclude=data_corruption")]
    both = (servers.etcd, servers.brain)
    try:
        for s in both:
            _alarm(s, pb.AlarmRequest.ACTIVATE, pb.NOSPACE)
        status, _, body = _get(servers.etcd_metrics, "GET", "/health")
        assert (status, json.loads(body)) == (503, {"health": "false", "reason": "ALARM NOSPACE"})
        _compare(servers, requests)
        for s in both:
            _alarm(s, pb.AlarmRequest.ACTIVATE, pb.CORRUPT)
            _alarm(s, pb.AlarmRequest.DEACTIVATE, pb.NOSPACE)
        assert _get(servers.etcd_metrics, "GET", "/readyz")[0] == 503
        _compare(servers, requests)
        # Both raised: etcd names whichever alarm its map iteration gives
        # first (v3alarm's AlarmStore.Get ranges over a Go map), so the
        # reason may be either; the status codes are fixed.
        for s in both:
            _alarm(s, pb.AlarmRequest.ACTIVATE, pb.NOSPACE)
        for path in ("/health", "/livez", "/readyz"):
            for port in (servers.etcd_metrics, servers.brain_metrics):
                status, _, body = _get(port, "GET", path)
                if path == "/health":
                    assert (status, json.loads(body)["health"]) == (503, "false"), (port, body)
                    assert json.loads(body)["reason"] in ("ALARM NOSPACE", "ALARM CORRUPT"), (port, body)
            assert _get(servers.etcd_metrics, "GET", path)[0] == _get(servers.brain_metrics, "GET", path)[0], path
    finally:
        for s in both:
            for alarm in (pb.CORRUPT, pb.NOSPACE):
                _alarm(s, pb.AlarmRequest.DEACTIVATE, alarm)
