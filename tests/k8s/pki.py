"""Throw-away PKI for the e2e control plane, generated at run time.

Two CAs: one for the Kubernetes side (the apiserver's serving certificate,
trusted by kubectl, kube-controller-manager, kube-scheduler and kwok through
their kubeconfigs), made here as kubeadm would, and one for brain's side
(brain's serving certificate and the apiserver's client certificate, used by
the mutual-TLS run), made by `deploy/brain-node.sh pki`, the step
docs/kubernetes.md tells operators to run, so that a broken step fails the
e2e. The service-account signing key is a separate RSA key. Nothing here is
written outside the run's work directory.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import ipaddress
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPKI:
    k8s_ca: CertFiles
    apiserver: CertFiles
    etcd_ca: CertFiles
    etcd_server: CertFiles
    etcd_client: CertFiles
    sa_key: Path  # RSA private key: signs and verifies service-account tokens


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Issuer:
    def __init__(self, cn: str):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = _dt.datetime.now(_dt.timezone.utc)
        self.name = _name(cn)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def issue(self, cn: str, *, org: str | None = None, dns=(), ips=(), server: bool, client: bool):
        key = ec.generate_private_key(ec.SECP256R1())
        now = _dt.datetime.now(_dt.timezone.utc)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_encipherment=False, key_cert_sign=False,
                    crl_sign=False, content_commitment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(self.key, hashes.SHA256())

    def save(self, directory: Path, stem: str) -> CertFiles:
        files = CertFiles(directory / f"{stem}.crt", directory / f"{stem}.key")
        _write_cert(files.cert, self.cert)
        _write_key(files.key, self.key)
        return files


def save_pair(directory: Path, stem: str, pair) -> CertFiles:
    key, cert = pair
    files = CertFiles(directory / f"{stem}.crt", directory / f"{stem}.key")
    _write_cert(files.cert, cert)
    _write_key(files.key, key)
    return files


REPO = Path(__file__).resolve().parents[2]
NODE_SCRIPT = REPO / "deploy" / "brain-node.sh"


def brain_node_pki(directory: Path) -> tuple[CertFiles, CertFiles, CertFiles]:
    """Run the deploy script's pki step with its paths moved under
    ``directory``; returns (CA, brain's serving pair, apiserver client pair)."""
    brain_dir, kube_dir = directory / "brain-pki", directory / "kube-pki"
    env = dict(os.environ, BRAIN_PKI_DIR=str(brain_dir), KUBE_PKI_DIR=str(kube_dir),
               BRAIN_CA_KEY=str(directory / "brain-ca" / "ca.key"), BRAIN_USER=getpass.getuser())
    p = subprocess.run(["bash", str(NODE_SCRIPT), "pki"], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"deploy/brain-node.sh pki failed ({p.returncode}): {p.stderr.strip()}")
    return (CertFiles(brain_dir / "ca.crt", directory / "brain-ca" / "ca.key"),
            CertFiles(brain_dir / "server.crt", brain_dir / "server.key"),
            CertFiles(kube_dir / "apiserver-brain-client.crt", kube_dir / "apiserver-brain-client.key"))


def make_cluster_pki(directory: Path, service_ip: str) -> ClusterPKI:
    """Write every certificate and key the e2e run needs into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    k8s = Issuer("brain-e2e-kubernetes-ca")
    apiserver = k8s.issue(
        "kube-apiserver",
        dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"),
        ips=("127.0.0.1", service_ip),
        server=True, client=False,
    )
    etcd_ca, etcd_server, etcd_client = brain_node_pki(directory)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_path = directory / "sa.key"
    _write_key(sa_path, sa)
    return ClusterPKI(
        k8s_ca=k8s.save(directory, "k8s-ca"),
        apiserver=save_pair(directory, "apiserver", apiserver),
        etcd_ca=etcd_ca,
        etcd_server=etcd_server,
        etcd_client=etcd_client,
        sa_key=sa_path,
    )
