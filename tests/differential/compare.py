"""Normalise etcd v3 KV responses and find the first difference.

A result is either a response message or an ``ErrorResult`` (gRPC status code
name + details text).  Normalisation:

* every ``ResponseHeader`` (top level and inside Txn sub-responses) loses
  ``cluster_id``, ``member_id`` and ``raft_term``; ``revision`` is kept;
* Range results sorted by a non-KEY target (VERSION/CREATE/MOD/VALUE) have
  their ties put in key order on both sides, because etcd uses Go's
  *unstable* sort.Sort (pdqsort; insertion sort — which happens to be
  stable — only for <= 12 elements), so the order among equal sort values is
  an etcd implementation accident.  When the result was truncated by
  ``limit`` (``more`` is true) the members of the last tie group are compared
  by their sort value only, since which tied keys survive the cut is equally
  accidental.

Everything else is compared exactly, including message presence (an unset
``prev_kv`` differs from an empty one) and repeated-field order.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format

from brain.api.pb.etcdserverpb import rpc_pb2

_HEADER_DROP = ("cluster_id", "member_id", "raft_term")

_SORT_FIELD = {
    rpc_pb2.RangeRequest.VERSION: "version",
    rpc_pb2.RangeRequest.CREATE: "create_revision",
    rpc_pb2.RangeRequest.MOD: "mod_revision",
    rpc_pb2.RangeRequest.VALUE: "value",
}
_FIELD_DEFAULT = {"version": 0, "create_revision": 0, "mod_revision": 0, "value": b""}


@dataclass(frozen=True)
class ErrorResult:
    code: str      # grpc.StatusCode name, e.g. "INVALID_ARGUMENT"
    details: str   # status message, e.g. "etcdserver: key is not provided"
    is_error: bool = True

    @classmethod
    def from_rpc_error(cls, err) -> "ErrorResult":
        code = err.code()
        return cls(code.name if code is not None else "UNKNOWN", err.details() or "")

    def __str__(self) -> str:
        return f"gRPC error {self.code}: {self.details!r}"


def _is_repeated(fd) -> bool:
    rep = getattr(fd, "is_repeated", None)
    if rep is not None:  # protobuf >= 5.29 (``label`` is gone in 7.x)
        return bool(rep)
    return fd.label == fd.LABEL_REPEATED


def to_plain(msg) -> dict:
    """Message -> nested dict of the fields that are set (presence-aware)."""
    out = {}
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            if _is_repeated(fd):
                if fd.message_type.GetOptions().map_entry:
                    out[fd.name] = {k: (to_plain(v) if hasattr(v, "ListFields") else v)
                                    for k, v in value.items()}
                else:
                    out[fd.name] = [to_plain(v) for v in value]
            else:
                out[fd.name] = to_plain(value)
        elif _is_repeated(fd):
            out[fd.name] = list(value)
        else:
            out[fd.name] = value
    return out


def _strip_headers(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "header" and isinstance(v, dict):
                for f in _HEADER_DROP:
                    v.pop(f, None)
            else:
                _strip_headers(v)
    elif isinstance(obj, list):
        for v in obj:
            _strip_headers(v)


def _normalize_range(req, plain: dict) -> None:
    field = _SORT_FIELD.get(req.sort_target)
    kvs = plain.get("kvs")
    if field is None or not kvs:
        return
    default = _FIELD_DEFAULT[field]
    groups: list[list[dict]] = []
    for kv in kvs:
        if groups and groups[-1][0].get(field, default) == kv.get(field, default):
            groups[-1].append(kv)
        else:
            groups.append([kv])
    out = []
    for i, g in enumerate(groups):
        if plain.get("more") and i == len(groups) - 1:
            out.extend({"<tied at limit cut; only sort value compared>": {field: kv.get(field, default)}}
                       for kv in g)
        else:
            out.extend(sorted(g, key=lambda kv: kv.get("key", b"")))
    plain["kvs"] = out


def _normalize_txn(req, plain: dict) -> None:
    branch = req.success if plain.get("succeeded") else req.failure
    for op_req, op_resp in zip(branch, plain.get("responses", [])):
        which = op_req.WhichOneof("request")
        if which == "request_range" and "response_range" in op_resp:
            _normalize_range(op_req.request_range, op_resp["response_range"])
        elif which == "request_txn" and "response_txn" in op_resp:
            _normalize_txn(op_req.request_txn, op_resp["response_txn"])


def normalize(method: str, request, result):
    """Comparable, plain form of ``result`` (an ErrorResult or a response message)."""
    if isinstance(result, ErrorResult):
        return {"<error>": {"code": result.code, "details": result.details}}
    plain = to_plain(result)
    _strip_headers(plain)
    if method == "Range":
        _normalize_range(request, plain)
    elif method == "Txn":
        _normalize_txn(request, plain)
    return plain


def first_difference(a, b, path: str = "", labels: tuple[str, str] = ("etcd", "other")) -> str | None:
    """Path and values of the first place where plain objects ``a`` and ``b`` differ."""
    la, lb = labels
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                return f"{p}: missing in {la}, present in {lb} ({b[k]!r})"
            if k not in b:
                return f"{p}: present in {la} ({a[k]!r}), missing in {lb}"
            d = first_difference(a[k], b[k], p, labels)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]", labels)
            if d:
                return d
        if len(a) != len(b):
            return f"{path}: length {len(a)} ({la}) != {len(b)} ({lb})"
        return None
    if a != b or type(a) is not type(b):
        return f"{path or '<root>'}: {a!r} ({la}) != {b!r} ({lb})"
    return None


def render(result) -> str:
    if isinstance(result, ErrorResult):
        return str(result)
    text = text_format.MessageToString(result).rstrip()
    return text or "(empty response)"
