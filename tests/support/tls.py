"""Throw-away certificates for the transport tests and the benchmarks' mutual
TLS runs, and the client side of each listener kind the servers are tested on.

``make_test_pki(dir)`` writes a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate (CN "brain-test-client"), and a second CA
with its own client certificate (the "wrong CA" a handshake must refuse).

TRANSPORTS names the listener kinds a server suite runs over:

  http   plaintext TCP
  mtls   https with --client-cert-auth and --trusted-ca-file
  unix   a unix socket (grpc clients send the path as :authority)

``BRAIN_TEST_TRANSPORTS`` (comma-separated, default all three) picks the
ones to run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.k8s.pki import CertFiles, Issuer, save_pair

ALL_TRANSPORTS = ("http", "mtls", "unix")
CLIENT_CN = "brain-test-client"


def transports_from_env() -> list[str]:
    raw = os.environ.get("BRAIN_TEST_TRANSPORTS", ",".join(ALL_TRANSPORTS))
    out = [t.strip() for t in raw.split(",") if t.strip()]
    bad = [t for t in out if t not in ALL_TRANSPORTS]
    if bad:
        raise ValueError(f"BRAIN_TEST_TRANSPORTS: unknown {bad} (use {', '.join(ALL_TRANSPORTS)})")
    return out


@dataclass(frozen=True)
class TestPKI:
    ca: CertFiles
    server: CertFiles
    client: CertFiles
    other_ca: CertFiles
    other_client: CertFiles

    def server_flags(self) -> list[str]:
        return ["--cert-file", str(self.server.cert), "--key-file", str(self.server.key),
                "--trusted-ca-file", str(self.ca.cert), "--client-cert-auth"]

    def tool_flags(self) -> list[str]:
        """The client side's flags, as etcdctl, etcd's benchmark and brainload all name them."""
        return ["--cacert", str(self.ca.cert), "--cert", str(self.client.cert), "--key", str(self.client.key)]

    def kine_flags(self) -> list[str]:
        """kine's names for the server side (a --trusted-ca-file makes it require a client certificate)."""
        return ["--server-cert-file", str(self.server.cert), "--server-key-file", str(self.server.key),
                "--trusted-ca-file", str(self.ca.cert)]

    def channel_credentials(self, client: CertFiles | None = None) -> grpc.ChannelCredentials:
        client = client or self.client
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.cert.read_bytes(),
            private_key=client.key.read_bytes(),
            certificate_chain=client.cert.read_bytes())


def make_test_pki(directory: Path) -> TestPKI:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca = Issuer("brain-test-ca")
    other = Issuer("brain-test-other-ca")
    server = ca.issue("brain", dns=("localhost",), ips=("127.0.0.1",), server=True, client=True)
    client = ca.issue(CLIENT_CN, server=False, client=True)
    other_client = other.issue(CLIENT_CN, server=False, client=True)
    return TestPKI(
        ca=ca.save(directory, "ca"),
        server=save_pair(directory, "server", server),
        client=save_pair(directory, "client", client),
        other_ca=other.save(directory, "other-ca"),
        other_client=save_pair(directory, "other-client", other_client),
    )


def channel(target: str, pki: TestPKI | None = None, options=()) -> grpc.Channel:
    """A channel to ``target`` (host:port or unix:path); secure with the
    test client certificate when ``pki`` is given."""
    opts = list(options)
    if pki is None:
        return grpc.insecure_channel(target, options=opts)
    if target.startswith("unix:"):
        opts.append(("grpc.ssl_target_name_override", "localhost"))
    return grpc.secure_channel(target, pki.channel_credentials(), options=opts)
