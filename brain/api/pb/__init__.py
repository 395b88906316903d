"""Generated etcd v3 API modules. Regenerate with `python -m brain.api.genproto`."""
