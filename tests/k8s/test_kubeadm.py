"""kubeadm's preflight with brain as its external etcd, over mutual TLS.

``kubeadm init phase preflight --config deploy/kubeadm-external-brain.yaml``,
with kubeadm built from the same Kubernetes module as the e2e (build.sh) and
the deploy file as written except for two things this run cannot share with
a real node: the endpoint's port (a free one, not 2379) and the directories
the certificates live in (``deploy/brain-node.sh pki`` writes them under the
work directory instead of /etc/brain/pki and /etc/kubernetes/pki).

kubeadm's ExternalEtcdVersion check GETs ``https://<endpoint>/version`` with
the configured CA and client certificate, decodes etcd's JSON body and
compares ``etcdserver`` with its minimum external etcd version (3.5.24 for
v1.37). brain answers on its client port, as etcd's connection multiplexer
does: Go's client offers no ALPN there, so the native transport sniffs an
HTTP/1.1 request after the handshake.

Every other check runs as on a real control-plane node; the few that cannot
pass on a machine without a container runtime or a kubelet are ignored by
name (IGNORED_CHECKS, each with its reason). A second run presents a client
certificate from a CA brain does not trust: ExternalEtcdVersion must then be
the one check that fails, so a passing first run means the check talked to
brain over mutual TLS.

kubeadm refuses to run preflight unless it runs as root (IsPrivilegedUser):
as another user the test is skipped, and fails under CI. Skipped unless
BRAIN_E2E=1 (``make e2e``), like the rest of tests/k8s.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.k8s import promstats
from tests.k8s.cluster import SERVICE_IP, Brain, log_tail
from tests.k8s.pki import NODE_SCRIPT, Issuer, save_pair, make_cluster_pki
from tests.support.servers import in_ci

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONFIG = REPO_ROOT / "deploy" / "kubeadm-external-brain.yaml"

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.timeout(1800),  # the first run builds kubeadm (and the control plane) via build.sh
    pytest.mark.skipif(os.environ.get("BRAIN_E2E") != "1",
                       reason="Kubernetes e2e: set BRAIN_E2E=1 or run `make e2e`"),
]

# The preflight checks that cannot pass on the machines this runs on (a VM or
# container that is not a Kubernetes node), by kubeadm's names. Never
# ExternalEtcdVersion. Ignored checks still run and print a WARNING.
IGNORED_CHECKS = {
    "CRI": "no container runtime: nothing listens on the InitConfiguration's criSocket "
           "(containerd's), and the test starts none",
    "ContainerRuntimeVersion": "asks that same container runtime for its version",
    "ImagePull": "pulls the control-plane images through that runtime (and only loopback is reachable)",
    "KubeletVersion": "runs `kubelet --version`; no kubelet is installed (the test runs no node)",
    "SystemVerification": "needs `kubelet --version` too before it validates the kernel and cgroups",
    "FileContent--proc-sys-net-ipv4-ip_forward": "the host has net.ipv4.ip_forward=0, and a test must not "
                                                 "change a host sysctl",
}
CHECK = "ExternalEtcdVersion"
assert CHECK not in IGNORED_CHECKS
PREFLIGHT_TIMEOUT = 120.0  # kubeadm retries the version GET 3 times, 5 s apart, 10 s timeout each


def _pki_defaults() -> dict[str, str]:
    """brain-node.sh's default certificate directories: the paths the deploy file names."""
    text = NODE_SCRIPT.read_text()
    out = {}
    for var in ("BRAIN_PKI_DIR", "KUBE_PKI_DIR"):
        m = re.search(rf'^{var}="\$\{{{var}:-([^}}]+)\}}"', text, re.M)
        assert m, f"{NODE_SCRIPT.name} no longer sets a default {var}"
        out[var] = m.group(1)
    return out


class Setup:
    def __init__(self, workdir: Path, kubeadm: Path):
        self.workdir = workdir
        self.kubeadm = kubeadm
        self.pki = make_cluster_pki(workdir / "pki", SERVICE_IP)  # brain's side by brain-node.sh pki
        self.brain = Brain(workdir=workdir, transport="tls", pki=self.pki)
        self.docs = list(yaml.safe_load_all(DEPLOY_CONFIG.read_text()))

    def config(self, name: str, client: tuple[Path, Path] | None = None) -> Path:
        """The deploy file with this run's port and certificate directories
        (and, when given, another client certificate and key)."""
        moved = {"BRAIN_PKI_DIR": self.pki.etcd_ca.cert.parent, "KUBE_PKI_DIR": self.pki.etcd_client.cert.parent}
        roots = {default: moved[var] for var, default in _pki_defaults().items()}
        docs = yaml.safe_load_all(DEPLOY_CONFIG.read_text())
        docs = [d for d in docs if d is not None]
        cluster = next(d for d in docs if d.get("kind") == "ClusterConfiguration")
        ext = cluster["etcd"]["external"]
        assert set(ext) == {"endpoints", "caFile", "certFile", "keyFile"}, ext
        [endpoint] = ext["endpoints"]
        url = urlsplit(endpoint)
        assert (url.scheme, url.hostname) == ("https", "127.0.0.1"), endpoint
        ext["endpoints"] = [f"https://127.0.0.1:{self.brain.port}"]
        for field in ("caFile", "certFile", "keyFile"):
            path = Path(ext[field])
            root = roots.get(str(path.parent))
            assert root is not None, f"{field} {path} is in none of brain-node.sh's directories {sorted(roots)}"
            ext[field] = str(root / path.name)
            assert Path(ext[field]).is_file(), f"{field}: brain-node.sh pki wrote no {path.name}"
        if client is not None:
            ext["certFile"], ext["keyFile"] = (str(p) for p in client)
        out = self.workdir / f"{name}.yaml"
        out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return out

    def preflight(self, config: Path) -> subprocess.CompletedProcess:
        argv = [str(self.kubeadm), "init", "phase", "preflight", "--config", str(config), "-v=1",
                "--ignore-preflight-errors=" + ",".join(IGNORED_CHECKS)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=PREFLIGHT_TIMEOUT, stdin=subprocess.DEVNULL)
        (self.workdir / f"{config.stem}.out").write_text(r.stdout + r.stderr)
        return r

    def counters(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.brain.metrics_port}/metrics", timeout=10) as resp:
            samples = promstats.parse(resp.read().decode())
        return {"http": promstats.total(samples, "brain_transport_http_requests_total"),
                "refused": promstats.total(samples, "brain_tls_handshake_failures_total")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if os.geteuid() != 0:
        msg = "kubeadm's preflight runs only as root (its IsPrivilegedUser check)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    from tests.k8s.e2e import build

    kubeadm = build() / "bin" / "kubeadm"
    s = Setup(tmp_path_factory.mktemp("kubeadm"), kubeadm)
    s.brain.start()
    try:
        yield s
    finally:
        s.brain.stop()


def _report(s: Setup, r: subprocess.CompletedProcess) -> str:
    return (f"kubeadm exit {r.returncode}; its output:\n{r.stdout}{r.stderr}\n"
            f"brain's log tail:\n{log_tail(s.brain.proc.log_path, 3000)}")


def _flagged(output: str) -> dict[str, set[str]]:
    """Check names kubeadm printed as [ERROR name] and [WARNING name]."""
    return {kind: set(re.findall(rf"\[{kind} ([^\]]+)\]", output)) for kind in ("ERROR", "WARNING")}


def test_deploy_config_names_the_kubeadm_version_built(setup):
    r = subprocess.run([str(setup.kubeadm), "version", "-o", "short"], capture_output=True, text=True, timeout=30)
    cluster = next(d for d in setup.docs if d and d.get("kind") == "ClusterConfiguration")
    assert r.returncode == 0, r.stderr
    assert cluster["kubernetesVersion"] == r.stdout.strip(), (
        "deploy/kubeadm-external-brain.yaml names another Kubernetes version than tests/k8s/go.mod pins")


def test_preflight_external_etcd_version_passes_on_brain(setup):
    before = setup.counters()
    r = setup.preflight(setup.config("kubeadm-external-brain"))
    out = r.stdout + r.stderr
    flagged = _flagged(out)
    for name in sorted(flagged["WARNING"]):
        why = IGNORED_CHECKS.get(name)
        print(f"kubeadm warned: {name}" + (f" (ignored: {why})" if why else ""))
    assert r.returncode == 0, _report(setup, r)
    assert CHECK not in flagged["ERROR"] | flagged["WARNING"], _report(setup, r)
    # the check ran (kubeadm skips it when no endpoint is configured) and reached brain's client port
    assert "validating the external etcd version" in out, _report(setup, r)
    after = setup.counters()
    assert after["http"] > before["http"], f"brain saw no HTTP request on its client port: {before} -> {after}"
    assert after["refused"] == before["refused"], f"brain refused a handshake: {before} -> {after}"


def test_preflight_external_etcd_version_fails_with_a_certificate_brain_does_not_trust(setup):
    stranger = Issuer("not-brains-ca")
    client = save_pair(setup.workdir, "stranger-client",
                        stranger.issue("kube-apiserver-brain-client", server=False, client=True))
    before = setup.counters()
    r = setup.preflight(setup.config("kubeadm-stranger-client", (client.cert, client.key)))
    flagged = _flagged(r.stdout + r.stderr)
    assert r.returncode != 0, _report(setup, r)
    assert flagged["ERROR"] == {CHECK}, _report(setup, r)
    after = setup.counters()
    assert after["refused"] > before["refused"], f"brain counted no refused handshake: {before} -> {after}"
    assert after["http"] == before["http"], f"an HTTP request got through: {before} -> {after}"
