"""Client certificates narrowed as etcd narrows them, next to etcd 3.6 and 3.7.

The same certificates go to a real etcd and to `brain serve`, each told
to narrow who may connect in the same way:

* allowed hostnames (etcd's --client-cert-allowed-hostname, a list) with
  a CRL (--client-crl-file): the certificates exercise Go's
  VerifyHostname rules (case, a left-most wildcard, the trailing dot, IP
  addresses only against IP SANs in any notation, no common name
  fallback, exact matching of a name that is no valid hostname) and the
  CRL's (a revoked leaf, a revoked intermediate the client sends, the
  name check coming first, a CRL file that turns unreadable or unparsable).  The CRL is signed by the *other* CA: etcd
  looks up serial numbers only, and so does brain;
* allowed common names: etcd takes them only from its config file
  (client-transport-security's allowed-cn; etcd 3.6 and 3.7 have no
  --client-cert-allowed-cn flag), brain from --client-cert-allowed-cn;
  a subject with two CNs counts by its last, as Go reads it;
* both at once: etcd exits naming them mutually exclusive; brain refuses
  the flags before it starts, in the same words.

For each certificate the comparison is what a TLS client sees (the
handshake's alert, the connection closed with close_notify after the
handshake, or HTTP/2 served), the server's "rejected connection on
client endpoint" line (found by the client's port: level, server-name,
ip-addresses, dns-names, error), and for a few, what etcdctl prints (its
timestamps and addresses masked).
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from brain.cli.serve_args import parse_serve
from tests.support.etcd_tools import etcd_tool, require_oracle
from tests.support.harness import brain_env
from tests.support.servers import BrainServer, EtcdServer, require_brain, shared_pki
from tests.support.tls import issue_client, issue_intermediate, write_crl

pytestmark = pytest.mark.timeout(240)

VERSIONS = ("3.6", "3.7")
MESSAGE = "rejected connection on client endpoint"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS

ALLOWED_HOSTNAMES = "Node-1.Pods.Brain.Test,10.1.2.3,[fd00::7],*.lit.brain.test,under_score.other.test."
ALLOWED_CNS = ["brain-test-client", "second-cn"]

OK, BAD_CERT, CLOSED = "served", "alert SSLV3_ALERT_BAD_CERTIFICATE", "closed after the handshake (close_notify)"

# name: (CNs, DNS SANs, IP SANs), what a TLS 1.3 client sees
HOSTNAME_CERTS = {
    "exact": ((), ("node-1.pods.brain.test",), (), OK),
    "upper-case": ((), ("NODE-1.PODS.BRAIN.TEST",), (), OK),
    "wildcard": ((), ("*.pods.brain.test",), (), OK),
    "wildcard-one-level-up": ((), ("*.brain.test",), (), BAD_CERT),
    "partial-wildcard": ((), ("n*.pods.brain.test",), (), BAD_CERT),
    "san-with-trailing-dot": ((), ("node-1.pods.brain.test.",), (), BAD_CERT),
    "ip": ((), (), ("10.1.2.3",), OK),
    "ip-v4-mapped": ((), (), ("::ffff:10.1.2.3",), OK),
    "ip-as-dns-name": ((), ("10.1.2.3",), (), BAD_CERT),
    "ip-v4-mapped-other": ((), ("elsewhere.brain.test",), ("::ffff:10.9.9.9", "fd00::8"), BAD_CERT),
    "ipv6-bracketed": ((), (), ("fd00::7",), OK),
    "common-name-only": (("node-1.pods.brain.test",), (), (), BAD_CERT),
    "literal-wildcard": ((), ("*.lit.brain.test",), (), OK),
    "under-literal-wildcard": ((), ("a.lit.brain.test",), (), BAD_CERT),
    "underscore": ((), ("under_score.other.test",), (), OK),
    "revoked": (("revoked",), ("node-1.pods.brain.test",), (), CLOSED),
    "revoked-and-not-allowed": (("revoked-2",), ("elsewhere.brain.test",), (), BAD_CERT),
}

CN_CERTS = {
    "two-cns-last-allowed": (("first-cn", "second-cn"), (), (), OK),
    "two-cns-first-allowed": (("second-cn", "first-cn"), (), (), BAD_CERT),
    "cn-upper-case": (("BRAIN-TEST-CLIENT",), (), (), BAD_CERT),
    "cn-prefix": (("brain-test-client-2",), (), (), BAD_CERT),
    "no-cn": ((), ("node-1.pods.brain.test",), (), BAD_CERT),
}


# -- the certificates -------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Every client certificate by name, and the CRL."""
    d = tmp_path_factory.mktemp("narrowing")
    pki = shared_pki()
    out = {"plain": pki.client, "none": None}
    for name, (cns, dns, ips, _) in {**HOSTNAME_CERTS, **CN_CERTS}.items():
        out[name] = issue_client(pki.ca, d, name, cns, dns=dns, ips=ips)
    mid = issue_intermediate(pki.ca, d, "mid", "brain-test-intermediate")
    revoked_mid = issue_intermediate(pki.ca, d, "revoked-mid", "brain-test-revoked-intermediate")
    out["via-intermediate"] = issue_client(mid, d, "via-mid", dns=("node-1.pods.brain.test",))
    out["via-revoked-intermediate"] = issue_client(revoked_mid, d, "via-revoked-mid", dns=("node-1.pods.brain.test",))
    # signed by the other CA: etcd checks serial numbers only, not who signed
    out["crl"] = write_crl(pki.other_ca, d / "crl.der", [out["revoked"], out["revoked-and-not-allowed"], revoked_mid])
    return out


HOSTNAME_EXPECTED = {
    **{name: want for name, (*_, want) in HOSTNAME_CERTS.items()},
    "plain": BAD_CERT,
    "via-intermediate": OK,
    "via-revoked-intermediate": CLOSED,
    "none": "alert TLSV13_ALERT_CERTIFICATE_REQUIRED",
}
CN_EXPECTED = {**{name: want for name, (*_, want) in CN_CERTS.items()}, "plain": OK}


# -- what a client sees, what the server logs -----------------------------------------


def attempt(port: int, client, version=ssl.TLSVersion.TLSv1_3) -> tuple[str, int]:
    """A TLS connection with ``client``'s certificate (or none) that sends
    HTTP/2's preface: what it saw, and its local port."""
    pki = shared_pki()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(pki.ca.cert))
    ctx.minimum_version = ctx.maximum_version = version
    ctx.set_alpn_protocols(["h2"])
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        local = raw.getsockname()[1]
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(PREFACE)
                data = s.recv(9)
        except ssl.SSLZeroReturnError:
            return CLOSED, local
        except ssl.SSLEOFError:
            return "closed without close_notify", local
        except ssl.SSLError as e:
            return f"alert {e.reason}", local
        except OSError as e:
            return f"{type(e).__name__}", local
    if data == b"":
        return CLOSED, local
    return (OK if len(data) == 9 and data[3] == 4 else f"unexpected {data!r}"), local


def rejection(log: Path, local_port: int, timeout: float = 10.0) -> dict:
    """The server's rejection line for the connection from ``local_port``,
    with the fields etcd and brain share."""
    deadline = time.monotonic() + timeout
    addr = f"127.0.0.1:{local_port}"
    while True:
        for line in log.read_text(errors="replace").splitlines():
            if MESSAGE in line and addr in line and line.startswith("{"):
                obj = json.loads(line)
                if obj.get("remote-addr") == addr:
                    keep = ("level", "msg", "server-name", "ip-addresses", "dns-names", "error")
                    return {k: obj[k] for k in keep if k in obj}
        if time.monotonic() > deadline:
            raise AssertionError(f"no rejection logged for {addr} in {log}")
        time.sleep(0.05)


def observe(srv, certs: dict, names) -> dict:
    """Per certificate: what a client sees, and the line logged for it when refused."""
    out = {}
    for name in names:
        seen, local = attempt(srv.port, certs[name])
        out[name] = (seen, rejection(srv.log_path, local) if seen != OK else None)
    return out


_MASKS = [(re.compile(r"127\.0\.0\.1:\d+"), "ADDR"), (re.compile(r"0x[0-9a-f]+"), "PTR")]
_BALANCER = re.compile(r'latest balancer error: (?:connection error: desc = "(.*)"|(.*))$')


def _why(detail: str) -> str:
    """grpc-go's last connection error, in kind: the TLS alert it read, or
    a closed connection (a refusal races the client's first write, so
    either server gives "broken pipe" or a reset at times, not the alert)."""
    m = re.search(r"remote error: tls: (.*)", detail)
    if m:
        return f"alert {m.group(1)}"
    if re.search(r"(: EOF|broken pipe|connection reset by peer)$", detail):
        return "closed"
    return detail


def etcdctl(version: str, port: int, client) -> tuple[int, str, list, list]:
    """What etcdctl prints for a get: exit code, stdout, stderr's lines (a
    JSON line without its timestamp, target and the detail of grpc-go's
    last connection error; addresses masked), and those details' kinds."""
    pki = shared_pki()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCDCTL", "ETCD_"))}
    r = subprocess.run([etcd_tool(f"etcdctl-{version}"), "--endpoints", f"127.0.0.1:{port}",
                        "--cacert", str(pki.ca.cert), "--cert", str(client.cert), "--key", str(client.key),
                        "--command-timeout", "2s", "get", "narrowing-probe"],
                       capture_output=True, text=True, timeout=30, env=env)
    lines, why = [], []
    for line in r.stderr.splitlines():
        for pattern, mask in _MASKS:
            line = pattern.sub(mask, line)
        if line.startswith("{"):
            obj = json.loads(line)
            obj.pop("ts", None)
            obj.pop("target", None)
            m = _BALANCER.search(obj.get("error", ""))
            if m:
                why.append(_why(m.group(1) or m.group(2)))
                obj["error"] = obj["error"][:m.start()] + "latest balancer error: ..."
            line = obj
        lines.append(line)
    return r.returncode, r.stdout, lines, why


# -- the servers -------------------------------------------------------------------------


class _Probed:
    """A server whose readiness is one certificate it accepts being served."""

    probe_cert = None

    @property
    def client_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _probe(self, remaining: float) -> str | None:
        try:
            seen, _ = attempt(self.port, self.probe_cert)
        except OSError as e:
            return str(e)
        return None if seen == OK else seen


class NarrowedEtcd(_Probed, EtcdServer):
    """etcd over mutual TLS; ``security`` (client-transport-security's keys)
    puts everything in a config file, as etcd's allowed CNs need."""

    def __init__(self, *, probe_cert, security: dict | None = None, **kw):
        self.probe_cert = probe_cert
        self.security = security
        super().__init__(**kw)

    def _command(self) -> list[str]:
        pki = shared_pki()
        if self.security is None:
            return [*super()._command(), *pki.server_flags()]
        peer = f"http://127.0.0.1:{self.peer_port}"
        sec = {"cert-file": str(pki.server.cert), "key-file": str(pki.server.key),
               "trusted-ca-file": str(pki.ca.cert), "client-cert-auth": True, **self.security}
        cfg = {"name": "t", "data-dir": str(self.data_dir), "listen-client-urls": self.client_url,
               "advertise-client-urls": self.client_url, "listen-peer-urls": peer,
               "initial-advertise-peer-urls": peer, "initial-cluster": f"t={peer}",
               "client-transport-security": sec}
        path = self.root / "etcd.conf.yml"
        path.write_text(json.dumps(cfg))  # YAML reads JSON
        return [self.binary, "--config-file", str(path)]


class NarrowedBrain(_Probed, BrainServer):
    def __init__(self, *, probe_cert, **kw):
        self.probe_cert = probe_cert
        super().__init__(transport="mtls", **kw)


def _started(srv):
    try:
        return srv.start()
    except BaseException:
        srv.cleanup()
        raise


@pytest.fixture(scope="module")
def hostname_servers(certs):
    """etcd 3.6, etcd 3.7 and brain, each with the allowed hostnames and the CRL."""
    flags = ["--client-cert-allowed-hostname", ALLOWED_HOSTNAMES, "--client-crl-file", str(certs["crl"])]
    yield from _servers(lambda v: NarrowedEtcd(version=v, probe_cert=certs["exact"], extra_args=flags),
                        lambda: NarrowedBrain(probe_cert=certs["exact"], extra_args=[*flags, "--log-format", "json"]))


@pytest.fixture(scope="module")
def cn_servers(certs):
    """The same three with the allowed common names."""
    yield from _servers(
        lambda v: NarrowedEtcd(version=v, probe_cert=certs["plain"], security={"allowed-cn": ALLOWED_CNS}),
        lambda: NarrowedBrain(probe_cert=certs["plain"], extra_args=[
            "--client-cert-allowed-cn", ",".join(ALLOWED_CNS), "--log-format", "json"]))


def _servers(make_etcd, make_brain):
    require_brain()
    started = {}
    try:
        for v in VERSIONS:
            require_oracle(v)
            started[v] = _started(make_etcd(v))
        started["brain"] = _started(make_brain())
        yield started
    finally:
        for srv in started.values():
            srv.cleanup()


# -- the tests ------------------------------------------------------------------------------


def test_allowed_hostnames_and_the_crl_as_etcd(hostname_servers, certs):
    names = list(HOSTNAME_EXPECTED)
    etcd = {v: observe(hostname_servers[v], certs, names) for v in VERSIONS}
    # what etcd does, so that a change of it shows here
    assert {n: seen for n, (seen, _) in etcd["3.6"].items()} == HOSTNAME_EXPECTED
    assert etcd["3.6"]["revoked"][1]["error"].startswith("transport: certificate serial ")
    assert etcd["3.6"]["ip-v4-mapped-other"][1]["ip-addresses"] == ["10.9.9.9", "fd00::8"]
    assert etcd["3.7"] == etcd["3.6"]
    brain = observe(hostname_servers["brain"], certs, names)
    for name in names:
        assert brain[name] == etcd["3.6"][name], f"{name}: brain differs from etcd 3.6"


def test_tls12_clients_see_the_same(hostname_servers, certs):
    # (without a certificate at all, TLS 1.2 clients see handshake_failure from
    # Go and certificate_required from rustls: a difference older than these flags)
    names = ["exact", "wildcard-one-level-up", "revoked"]
    for name in names:
        seen = {k: attempt(srv.port, certs[name], ssl.TLSVersion.TLSv1_2)[0] for k, srv in hostname_servers.items()}
        assert seen["brain"] == seen["3.6"] == seen["3.7"], (name, seen)
    assert attempt(hostname_servers["brain"].port, certs["revoked"], ssl.TLSVersion.TLSv1_2)[0] == CLOSED


def test_a_crl_that_becomes_unusable_refuses_every_certificate(hostname_servers, certs):
    """etcd reads the CRL per connection and refuses every client
    certificate while it cannot; brain re-reads it when it changes, to
    the same effect (brain refuses to start with one: etcd starts)."""
    crl = certs["crl"]
    good = crl.read_bytes()
    try:
        for broken in (b"not a CRL", None):
            if broken is None:
                crl.unlink()
            else:
                crl.write_bytes(broken)
            seen = {k: observe(srv, certs, ["exact"])["exact"] for k, srv in hostname_servers.items()}
            assert seen["3.6"][0] == CLOSED, seen
            assert seen["brain"] == seen["3.6"] == seen["3.7"], seen
    finally:
        crl.write_bytes(good)
    assert {k: attempt(srv.port, certs["exact"])[0] for k, srv in hostname_servers.items()} == dict.fromkeys(
        hostname_servers, OK)


def test_allowed_common_names_as_etcds_config_file_sets_them(cn_servers, certs):
    names = list(CN_EXPECTED)
    etcd = {v: observe(cn_servers[v], certs, names) for v in VERSIONS}
    assert {n: seen for n, (seen, _) in etcd["3.6"].items()} == CN_EXPECTED
    assert etcd["3.7"] == etcd["3.6"]
    assert observe(cn_servers["brain"], certs, names) == etcd["3.6"]


def test_etcdctl_prints_the_same(hostname_servers, cn_servers, certs):
    cases = {"exact": (hostname_servers, set()),
             "wildcard-one-level-up": (hostname_servers, {"alert bad certificate", "closed"}),
             "revoked": (hostname_servers, {"closed"}),
             "two-cns-first-allowed": (cn_servers, {"alert bad certificate", "closed"})}
    jobs = [(name, v) for name in cases for v in VERSIONS]
    with ThreadPoolExecutor(len(jobs) * 2) as pool:
        etcd = [pool.submit(etcdctl, v, cases[name][0][v].port, certs[name]) for name, v in jobs]
        brain = [pool.submit(etcdctl, v, cases[name][0]["brain"].port, certs[name]) for name, v in jobs]
        for (name, v), e, b in zip(jobs, etcd, brain):
            want, got = e.result(), b.result()
            assert got[:3] == want[:3], f"etcdctl {v} on {name}: brain prints other lines than etcd"
            kinds = cases[name][1]
            assert set(want[3]) <= kinds and set(got[3]) <= kinds, (name, v, want[3], got[3])
            if name == "exact":
                assert want == (0, "", [], [])
            else:
                assert want[0] == 1 and want[2][-1] == "Error: context deadline exceeded", want


def test_both_allowed_lists_refuse_to_start(tmp_path, capsys):
    pki = shared_pki()
    errors = {}
    for v in VERSIONS:
        require_oracle(v)
        srv = NarrowedEtcd(version=v, probe_cert=pki.client,
                           security={"allowed-cn": ["a-cn"], "allowed-hostname": ["a.brain.test"]})
        try:
            srv.spawn()
            srv.proc.wait(timeout=30)
            assert srv.proc.returncode == 1
            line = next(ln for ln in srv.log_path.read_text().splitlines() if '"listener failed"' in ln)
            errors[v] = json.loads(line)["error"]
        finally:
            srv.cleanup()
    assert errors["3.6"] == errors["3.7"] == \
        'AllowedCNs and AllowedHostnames are mutually exclusive (cns=["a-cn"], hostnames=["a.brain.test"])'
    with pytest.raises(SystemExit) as ei:
        parse_serve(["--client-cert-allowed-cn", "a-cn", "--client-cert-allowed-hostname", "a.brain.test"],
                    environ={})
    assert ei.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "are mutually exclusive (cns=[\"a-cn\"], hostnames=[\"a.brain.test\"])")


def test_brain_serve_refuses_them_on_grpcio():
    """grpcio does its own TLS: brain refuses these flags there rather
    than serve without them."""
    r = subprocess.run([sys.executable, "-m", "brain", "serve", "--grpc-front", "grpcio",
                        "--client-crl-file", "/nonexistent.crl"],
                       capture_output=True, text=True, timeout=60, env=brain_env(dict(os.environ)))
    assert r.returncode == 2, r.stderr
    assert "--client-crl-file needs --grpc-front native" in r.stderr
