"""brain: a Kubernetes storage backend speaking the etcd v3 API."""


def __getattr__(name: str) -> str:
    # brain's version has one home, native/Cargo.toml (maturin builds the
    # package metadata from it); reading it back costs an import of
    # importlib.metadata, paid only by those who ask.
    if name == "__version__":
        from importlib.metadata import version

        return version("brain-etcd")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
