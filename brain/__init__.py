"""brain: a Kubernetes storage backend speaking the etcd v3 API."""

__version__ = "0.1.0"
