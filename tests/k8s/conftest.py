"""tests/k8s: a real Kubernetes control plane on brain (see e2e.py)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "k8s: runs kube-apiserver and friends on brain; needs BRAIN_E2E=1 (make e2e)")
