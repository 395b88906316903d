"""Throw-away certificates for the transport tests and the benchmarks' mutual
TLS runs, and the client side of each listener kind the servers are tested on.

``make_test_pki(dir)`` writes a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate (CN "brain-test-client"), and a second CA
with its own client certificate (the "wrong CA" a handshake must refuse).

For the client certificate narrowing flags (--client-cert-allowed-cn,
--client-cert-allowed-hostname, --client-crl-file): ``issue_client``
writes a client certificate with any subject common names and SANs,
``issue_intermediate`` a CA below the test CA, and ``write_crl`` a CRL
(DER, as etcd reads it) revoking some of them.

TRANSPORTS names the listener kinds a server suite runs over:

  http   plaintext TCP
  mtls   https with --client-cert-auth and --trusted-ca-file
  unix   a unix socket (grpc clients send the path as :authority)

``BRAIN_TEST_TRANSPORTS`` (comma-separated, default all three) picks the
ones to run.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


# -- certificates for the narrowing flags --------------------------------------


def _load(ca: CertFiles):
    cert = x509.load_pem_x509_certificates(ca.cert.read_bytes())[0]
    return cert, serialization.load_pem_private_key(ca.key.read_bytes(), None)


def _write(directory: Path, stem: str, key, certs) -> CertFiles:
    files = CertFiles(Path(directory) / f"{stem}.crt", Path(directory) / f"{stem}.key")
    files.cert.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    files.key.chmod(0o600)
    return files


def _builder(issuer, subject: x509.Name, key, serial: int | None = None):
    now = _dt.datetime.now(_dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer.subject)
            .public_key(key.public_key()).serial_number(serial or x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=1)))


def issue_client(ca: CertFiles, directory: Path, stem: str, cns: Sequence[str] = (), *, dns: Sequence[str] = (),
                 ips: Sequence[str] = (), serial: int | None = None) -> CertFiles:
    """A client certificate signed by ``ca`` (whose file may hold a chain:
    its first certificate signs, and the rest of the chain is sent along).
    ``cns``: the subject's CN attributes, in order (none, or several: Go's
    CommonName is the last); ``dns``/``ips``: its SANs as written (an IP
    such as ::ffff:10.0.0.1 is encoded in 16 bytes); ``serial``: its serial
    number (default: random)."""
    issuer, issuer_key = _load(ca)
    chain = x509.load_pem_x509_certificates(ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in cns] or
                        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "brain-test")])
    b = (_builder(issuer, subject, key, serial)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                        critical=False))
    sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(issuer_key, hashes.SHA256())
    # a chain's root stays out: the server has it (Go and rustls build the path alike)
    return _write(directory, stem, key, [cert, *chain[:-1]] if len(chain) > 1 else [cert])


def issue_intermediate(ca: CertFiles, directory: Path, stem: str, cn: str) -> CertFiles:
    """A CA below ``ca``; its file holds it and then ``ca``'s certificate."""
    issuer, issuer_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(issuer, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                           critical=False)
            .sign(issuer_key, hashes.SHA256()))
    return _write(directory, stem, key, [cert, issuer])


def serial_of(files: CertFiles) -> int:
    """The serial number of the first certificate in ``files.cert``."""
    return x509.load_pem_x509_certificates(files.cert.read_bytes())[0].serial_number


def write_crl(ca: CertFiles, path: Path, revoked: Sequence[CertFiles] = (), *, pem: bool = False) -> Path:
    """A CRL signed by ``ca`` revoking the first certificate of each of
    ``revoked``: DER (what etcd's --client-crl-file reads), or PEM."""
    issuer, issuer_key = _load(ca)
    now = _dt.datetime.now(_dt.timezone.utc)
    b = (x509.CertificateRevocationListBuilder().issuer_name(issuer.subject).last_update(now)
         .next_update(now + _dt.timedelta(days=1)))
    for files in revoked:
        b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(serial_of(files))
                                      .revocation_date(now).build())
    crl = b.sign(issuer_key, hashes.SHA256())
    path = Path(path)
    path.write_bytes(crl.public_bytes(serialization.Encoding.PEM if pem else serialization.Encoding.DER))
    return path
