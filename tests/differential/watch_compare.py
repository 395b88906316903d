"""Normalisation for the watch / lease differential comparison.

Watch streams
-------------
etcd and brain may group a watcher's events differently across responses
(catch-up from history batches several revisions per response; live events
come one revision per response) and interleave different watchers of one
stream differently.  So a stream's responses are compared as:

* per watch id, the ordered list of *items*: control responses (created /
  canceled, with their header revision, compact_revision and cancel_reason)
  and every event as (type, kv, prev_kv).  The header revision of responses
  that carry events is not compared (it depends on the grouping);
* the stream's rejected creates (watch_id -1, created and canceled), in order;
* the stream's progress responses (watch_id -1, nothing else set): their
  number and header revisions, not their position.  etcd 3.4 answers
  RequestProgress immediately, even ahead of events a catching-up watcher
  has not been sent yet (etcd issue #15220); brain holds the answer until
  every watcher is synced, so it never overtakes an event.  Deliberate.

One deliberate difference is removed from both sides before comparing
(``ExclusionRule``): compaction at revision C keeps, in brain, a DELETE at
exactly C, which etcd drops (its key index removes a tombstone at the
compaction revision, and its background compaction then deletes the record,
so whether a watcher from C still sees it is even timing-dependent in etcd).
For a watcher created with start_revision == C (the compaction revision at
that moment), DELETE events with mod_revision == C are dropped.

``cluster_id`` / ``member_id`` / ``raft_term`` are dropped everywhere.

Leases
------
Server-chosen lease ids differ by design; the harness maps the other
server's ids to the reference's before comparing (``translate_back``).
TimeToLive ``TTL`` (seconds left) may differ by 1 s; its ``keys`` are
compared as a set (etcd 3.4 lists them in Go map order); LeaseLeases'
``leases`` as a set (both order by expiry, and leases granted within the
same instant tie).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .compare import ErrorResult, _strip_headers, normalize, to_plain

INVALID_WATCH_ID = -1
DELETE = 1  # mvccpb.Event.DELETE


# --------------------------------------------------------------------- leases
def translate_request(req, id_map: dict[int, int]):
    """A copy of ``req`` with reference lease ids replaced by the other server's."""
    if not id_map:
        return req
    out = type(req)()
    out.CopyFrom(req)
    _translate_in_place(out, id_map)
    return out


def _translate_in_place(msg, m: dict[int, int]) -> None:
    name = msg.DESCRIPTOR.name
    if name == "PutRequest":
        if msg.lease in m:
            msg.lease = m[msg.lease]
    elif name == "TxnRequest":
        for c in msg.compare:
            if c.WhichOneof("target_union") == "lease" and c.lease in m:
                c.lease = m[c.lease]
        for op in list(msg.success) + list(msg.failure):
            which = op.WhichOneof("request")
            if which == "request_put":
                _translate_in_place(op.request_put, m)
            elif which == "request_txn":
                _translate_in_place(op.request_txn, m)
    elif name in ("LeaseGrantRequest", "LeaseRevokeRequest", "LeaseTimeToLiveRequest",
                  "LeaseKeepAliveRequest"):
        if msg.ID in m:
            msg.ID = m[msg.ID]


def translate_back(plain, inverse: dict[int, int]):
    """Map the other server's lease ids (fields ``lease`` and ``ID``) in a plain
    (dict) result to the reference's ids, in place."""
    if not inverse:
        return plain
    if isinstance(plain, dict):
        for k, v in plain.items():
            if k in ("lease", "ID") and isinstance(v, int):
                plain[k] = inverse.get(v, v)
            else:
                translate_back(v, inverse)
    elif isinstance(plain, list):
        for v in plain:
            translate_back(v, inverse)
    return plain


def normalize_unary(method: str, request, result, inverse: dict[int, int] | None = None):
    """compare.normalize plus lease handling (see module doc)."""
    plain = normalize(method, request, result)
    if inverse:
        translate_back(plain, inverse)
    if isinstance(result, ErrorResult):
        return plain
    if method == "LeaseTimeToLive" and "keys" in plain:
        plain["keys"] = sorted(plain["keys"])
    elif method == "LeaseLeases" and "leases" in plain:
        plain["leases"] = sorted(plain["leases"], key=lambda d: d.get("ID", 0))
    return plain


def align_ttl(ref_plain, other_plain, tolerance: int = 1) -> None:
    """TimeToLive: accept a remaining-TTL difference up to ``tolerance`` seconds
    (copy the reference's value over the other's when within it)."""
    if not (isinstance(ref_plain, dict) and isinstance(other_plain, dict)):
        return
    a, b = ref_plain.get("TTL"), other_plain.get("TTL")
    if a is not None and b is not None and a > 0 and b > 0 and abs(a - b) <= tolerance:
        other_plain["TTL"] = a


# --------------------------------------------------------------- watch streams
@dataclass
class ExclusionRule:
    """Drop DELETE events at ``revision`` for one watcher incarnation."""

    revision: int
    reason: str = "delete at the compaction revision (brain keeps it, etcd drops it)"


@dataclass
class CreateMeta:
    """What the harness knows about the k-th create request on a stream."""

    op_index: int
    exclusion: ExclusionRule | None = None


@dataclass
class StreamState:
    """Per (side, stream) normaliser state carried across rounds."""

    creates_seen: int = 0                       # created responses consumed so far
    rules: dict[int, ExclusionRule | None] = field(default_factory=dict)  # live watch id -> rule
    excluded: int = 0                           # events dropped by rules so far
    origins: dict[int, int] = field(default_factory=dict)  # watch id -> op index of its create

    def copy(self) -> "StreamState":
        return StreamState(self.creates_seen, dict(self.rules), self.excluded, dict(self.origins))


@dataclass
class StreamView:
    watchers: dict          # watch id -> list of items
    rejected: list          # rejected creates, in order
    progress: list          # header revisions of progress responses
    events: int = 0         # events kept
    controls: int = 0       # control items (created/canceled/rejected)

    def plain(self) -> dict:
        return {"watchers": self.watchers, "rejected creates": self.rejected,
                "progress revisions": self.progress}


def _header_rev(resp) -> int:
    return resp.header.revision


def normalize_stream(responses, state: StreamState, creates: list[CreateMeta],
                     inverse: dict[int, int] | None = None) -> tuple[StreamView, StreamState]:
    """Responses of one round of one stream -> comparable view; returns the
    view and the state after it (``state`` itself is not modified)."""
    st = state.copy()
    view = StreamView({}, [], [])
    for r in responses:
        wid = r.watch_id
        if r.created:
            meta = creates[st.creates_seen] if st.creates_seen < len(creates) else None
            st.creates_seen += 1
            if r.canceled:
                view.rejected.append({"revision": _header_rev(r), "watch_id": wid,
                                      "cancel_reason": r.cancel_reason,
                                      "compact_revision": r.compact_revision})
                view.controls += 1
                continue
            st.rules[wid] = meta.exclusion if meta is not None else None
            st.origins[wid] = meta.op_index if meta is not None else -1
            view.watchers.setdefault(wid, []).append({"created": {"revision": _header_rev(r)}})
            view.controls += 1
            continue
        if (wid == INVALID_WATCH_ID and not r.canceled and not r.events
                and not r.compact_revision and not r.cancel_reason):
            view.progress.append(_header_rev(r))
            continue
        items = view.watchers.setdefault(wid, [])
        rule = st.rules.get(wid)
        for ev in r.events:
            if rule is not None and ev.type == DELETE and ev.kv.mod_revision == rule.revision:
                st.excluded += 1
                continue
            plain = to_plain(ev)
            if inverse:
                translate_back(plain, inverse)
            items.append({"event": plain})
            view.events += 1
        rest = to_plain(r)
        rest.pop("events", None)
        rest.pop("watch_id", None)
        _strip_headers(rest)
        header = rest.pop("header", {})
        if r.events and not rest:
            continue
        if not r.events:
            rest["revision"] = header.get("revision", 0)
        items.append({"control": rest})
        view.controls += 1
        if r.canceled:
            st.rules.pop(wid, None)
    return view, st
