"""Seeded generator of interleaved KV writes, compactions, Watch stream
actions and Lease calls, for driving etcd and brain in lockstep.

Like ``OpGenerator`` it is deterministic for a seed plus the sequence of
*reference* (etcd) answers it is fed: it learns the current / compaction
revision, the watch ids etcd assigned per stream and the lease ids etcd
granted.  Lease ids are always the reference's; the harness translates them
for the other server (server-chosen ids differ by design).

Never generated, on purpose:
* a client-chosen watch id of -1 (both servers accept it, but its responses
  are then indistinguishable from progress responses / rejected creates);
* leases that can expire during the sequence: every lease granted here has
  a TTL of >= 3600 s, except TTL <= 1 grants (which etcd raises to its 2 s
  minimum) that are revoked by the very next op.  Expiry is exercised by the
  harness's separate expiry phase, where nothing else happens meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from brain.api.pb.etcdserverpb import rpc_pb2

from .generator import KEYS, MISSING_LEASE_IDS, RANGE_STARTS, OpGenerator, prefix_end

WatchCreateRequest = rpc_pb2.WatchCreateRequest
NOPUT = WatchCreateRequest.NOPUT
NODELETE = WatchCreateRequest.NODELETE

# Client-chosen watch ids: small ones collide with etcd's auto ids (0, 1, 2,
# ...), which then skip them; one negative and one huge id.
CLIENT_WATCH_IDS = [1, 2, 3, 5, 8, 100, -5, 1 << 40]
# Client-chosen lease ids (besides re-using live ones).
CLIENT_LEASE_IDS = [0x10, 0x11, 0x2A, 0x7EA5E, 0x7FFFFFFFFFFFFFFF, -3]
LONG_TTLS = [3600, 7200, 86400, 9_000_000_000]  # 9e9 = etcd's MaxLeaseTTL
TOO_LARGE_TTL = 9_000_000_001
SHORT_TTLS = [-5, 0, 1]  # raised to etcd's 2 s minimum: revoked right away

# Features the generator can be told to leave out (``avoid``), to explore past
# a known difference.  Names are listed in the runner's --help.
AVOIDABLE = {
    "negative_start": "watch creates with a negative start_revision",
    "future_progress": "RequestProgress on a stream holding a watcher whose start_revision "
                       "is still in the future",
    "compacted_start": "watch creates with a start_revision below the compaction revision "
                       "(etcd keeps the id of a watcher it cancels for compaction registered)",
    "unanswered_progress": "RequestProgress where etcd 3.6 sends nothing: on a stream with no watcher, "
                           "or with one that is not synced (start_revision in the future, cancelled "
                           "for compaction); the progress is sent after quiescence, so history "
                           "catch-up is over",
    "leases": "every Lease call and put with a lease",
    "fast_keys_only": "keys_only ranges not sorted by value, top level and in txns (etcd 3.7.3 and brain answer "
                      "them from the key index, without the keys' lease; etcd 3.4 and 3.6 return the lease)",
}


@dataclass
class WOp:
    """One step.  ``kind``: kv | lease | create | cancel | progress."""

    kind: str
    method: str  # KV/Lease method name, or Create / Cancel / Progress
    request: object = None
    stream: int = -1
    tags: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        from google.protobuf import text_format

        where = f" stream {self.stream}" if self.stream >= 0 else ""
        tags = f" [{', '.join(self.tags)}]" if self.tags else ""
        body = ""
        if self.request is not None:
            body = text_format.MessageToString(self.request, as_one_line=True).strip()
        return f"{self.kind}.{self.method}{where}{tags}" + (f" {{ {body} }}" if body else "")


class _StreamState:
    def __init__(self) -> None:
        self.registered: list[int] = []   # ids etcd holds on this stream (not explicitly cancelled)
        self.compacted: set[int] = set()  # registered ids etcd cancelled for compaction
        self.ever: list[int] = []         # every id ever assigned here
        self.future: dict[int, int] = {}  # id -> start_revision, while that is in the future


class WatchLeaseGenerator(OpGenerator):
    def __init__(self, seed: int, n_streams: int = 3, *, leases: bool = True, avoid=()) -> None:
        super().__init__(seed)
        self.n_streams = n_streams
        self.avoid = set(avoid)
        self.leases_enabled = leases and "leases" not in self.avoid
        self.streams = [_StreamState() for _ in range(n_streams)]
        self.live_leases: list[int] = []    # reference ids
        self.dead_leases: list[int] = []    # revoked (or never granted) reference ids
        self.pending: list[WOp] = []        # ops that must come next
        self.last_create: tuple[int, object] | None = None

    def range_request(self):
        """OpGenerator's range; with ``fast_keys_only`` avoided, keys_only is cleared where etcd 3.7
        (and brain, which behaves as 3.7) answers from the key index alone, without leases (every
        random draw is still made: the stream stays the same)."""
        req = super().range_request()
        if "fast_keys_only" in self.avoid and req.keys_only and req.sort_target != rpc_pb2.RangeRequest.VALUE:
            req.keys_only = False
        return req

    # ---------------------------------------------------------------- observe
    def observe_op(self, op: WOp, ref) -> None:
        """``ref``: the reference's response (message / ErrorResult) for kv and
        lease ops, its created response for creates, True/False (answered or
        not) for cancels, None for progress."""
        if op.kind == "kv":
            self.observe(op, ref)
        elif op.kind == "lease":
            self._observe_lease(op, ref)
        elif op.kind == "create":
            st = self.streams[op.stream]
            if ref is not None and not ref.canceled and ref.created:
                wid = ref.watch_id
                st.registered.append(wid)
                st.ever.append(wid)
                if op.request.create_request.start_revision > self.cur_rev:
                    st.future[wid] = op.request.create_request.start_revision
        elif op.kind == "cancel":
            st = self.streams[op.stream]
            wid = op.request.cancel_request.watch_id
            if ref and wid in st.registered:
                st.registered.remove(wid)
                st.compacted.discard(wid)
                st.future.pop(wid, None)
        for st in self.streams:
            for wid, start in list(st.future.items()):
                if start <= self.cur_rev:
                    del st.future[wid]

    def observe_stream(self, stream: int, responses) -> None:
        """Reference responses of a stream that arrived asynchronously (fed at
        quiescence, so at a deterministic point)."""
        st = self.streams[stream]
        for r in responses:
            if r.canceled and r.compact_revision and r.watch_id in st.registered:
                st.compacted.add(r.watch_id)

    def _observe_lease(self, op: WOp, ref) -> None:
        if getattr(ref, "is_error", False):
            return
        self.observe(op, ref)  # revision (a revoke deletes the lease's keys)
        if op.method == "LeaseGrant":
            self.live_leases.append(ref.ID)
            if op.request.TTL < 2:
                # etcd raised it to 2 s: revoke before it can expire.
                self.pending.append(WOp("lease", "LeaseRevoke", rpc_pb2.LeaseRevokeRequest(ID=ref.ID),
                                        tags=("short TTL cleanup",)))
        elif op.method == "LeaseRevoke":
            lid = op.request.ID
            if lid in self.live_leases:
                self.live_leases.remove(lid)
                self.dead_leases.append(lid)

    # ---------------------------------------------------------------- helpers
    def lease_for_put(self) -> int:
        if self.leases_enabled and self.live_leases and self._chance(0.25):
            return self.rng.choice(self.live_leases)
        return 0

    def put_request(self, key: bytes | None = None) -> rpc_pb2.PutRequest:
        req = super().put_request(key)
        if not req.lease and not req.ignore_lease:
            lid = self.lease_for_put()
            if lid:
                req.lease = lid
        return req

    def compare(self) -> rpc_pb2.Compare:
        c = super().compare()
        if (c.target == rpc_pb2.Compare.LEASE and self.leases_enabled and self.live_leases
                and self._chance(0.6)):
            c.lease = self.rng.choice(self.live_leases)
        return c

    def simple_put(self, key: bytes) -> rpc_pb2.PutRequest:
        return rpc_pb2.PutRequest(key=key, value=self.value(), prev_kv=self._chance(0.3),
                                  lease=self.lease_for_put())

    def some_lease_id(self) -> int:
        """For revoke / time-to-live / keep-alive: mostly live, else dead or missing."""
        r = self.rng.random()
        if r < 0.7 and self.live_leases:
            return self.rng.choice(self.live_leases)
        if r < 0.85 and self.dead_leases:
            return self.rng.choice(self.dead_leases)
        return self.rng.choice(MISSING_LEASE_IDS + [0])

    # ------------------------------------------------------------- KV writes
    def multi_put_txn(self) -> rpc_pb2.TxnRequest:
        """A Txn putting several distinct keys (one revision, one response per
        watcher), sometimes with a single-key delete and a compare."""
        keys = self.rng.sample(KEYS, self.rng.randint(2, 5))
        success = [rpc_pb2.RequestOp(request_put=self.simple_put(k)) for k in keys]
        if self._chance(0.35):
            others = [k for k in KEYS if k not in keys]
            success.insert(self.rng.randrange(len(success) + 1), rpc_pb2.RequestOp(
                request_delete_range=rpc_pb2.DeleteRangeRequest(key=self.rng.choice(others),
                                                                prev_kv=self._chance(0.5))))
        req = rpc_pb2.TxnRequest(success=success)
        if self._chance(0.4):
            req.compare.append(self.compare())
            fkeys = self.rng.sample(KEYS, self.rng.randint(0, 3))
            req.failure.extend(rpc_pb2.RequestOp(request_put=self.simple_put(k)) for k in fkeys)
        return req

    def kv_op(self) -> WOp:
        r = self.rng.random()
        if r < 0.42:
            return WOp("kv", "Put", self.put_request())
        if r < 0.58:
            return WOp("kv", "DeleteRange", self.delete_request(single_weight=0.55))
        if r < 0.78:
            return WOp("kv", "Txn", self.multi_put_txn())
        if r < 0.88:
            return WOp("kv", "Txn", self.txn_request())
        if r < 0.95:
            return WOp("kv", "Range", self.range_request())
        return WOp("kv", "Compact", self.compact_request())

    # ----------------------------------------------------------- watch ops
    def watch_start_revision(self) -> tuple[int, str]:
        r = self.rng.random()
        if r < 0.38:
            return 0, "start=0"
        if r < 0.58:
            return self.rng.randint(max(1, self.compact_rev), self.cur_rev), "start=historical"
        if r < 0.66:
            return self.cur_rev, "start=current"
        if r < 0.76:
            return self.cur_rev + self.rng.randint(1, 3), "start=future"
        if r < 0.84 and self.compact_rev >= 1:
            return self.compact_rev, "start=compaction revision"
        if r < 0.94 and self.compact_rev > 1 and "compacted_start" not in self.avoid:
            return self.rng.randint(1, self.compact_rev - 1), "start=compacted"
        if r < 0.97 and "negative_start" not in self.avoid:
            return -self.rng.randint(1, 3), "start=negative"
        if self.compact_rev > 1 and "compacted_start" in self.avoid:
            return self.compact_rev, "start=compaction revision"
        return 1, "start=1"

    def watch_range(self) -> tuple[bytes, bytes, str]:
        r = self.rng.random()
        if r < 0.35:
            return self.key(), b"", "single key"
        if r < 0.6:
            start = self.rng.choice(RANGE_STARTS + KEYS[:6])
            return start, prefix_end(start), "prefix"
        if r < 0.72:
            return self.key(), b"\x00", "from key"
        if r < 0.78:
            return self.rng.choice([b"", b"\x00"]), b"\x00", "everything"
        if r < 0.84:
            a, b = sorted(self.rng.sample(KEYS, 2))
            return a, b, "range"
        if r < 0.92:
            k = self.key()
            return k, self.rng.choice([k, b"\x01" if k > b"\x01" else k]), "empty range"
        return b"", b"", "empty key"

    def create_op(self) -> WOp:
        s = self.rng.randrange(self.n_streams)
        st = self.streams[s]
        key, end, what = self.watch_range()
        start, start_tag = self.watch_start_revision()
        c = WatchCreateRequest(key=key, range_end=end, start_revision=start)
        tags = [what, start_tag]
        if self._chance(0.4):
            c.prev_kv = True
            tags.append("prev_kv")
        r = self.rng.random()
        if r < 0.1:
            c.filters.append(NOPUT)
        elif r < 0.2:
            c.filters.append(NODELETE)
        elif r < 0.23:
            c.filters.extend([NOPUT, NODELETE])
        if self._chance(0.1):
            c.progress_notify = True
        if self._chance(0.1):
            c.fragment = True
        r = self.rng.random()
        candidates = [w for w in st.registered if w != 0]  # 0 would mean "auto"
        if r < 0.15 and candidates:
            c.watch_id = self.rng.choice(candidates)
            tags.append("duplicate id")
        elif r < 0.35:
            c.watch_id = self.rng.choice(CLIENT_WATCH_IDS)
            tags.append("client id")
        else:
            tags.append("auto id")
        return WOp("create", "Create", rpc_pb2.WatchRequest(create_request=c), stream=s, tags=tuple(tags))

    def cancel_op(self) -> WOp:
        s = self.rng.randrange(self.n_streams)
        st = self.streams[s]
        r = self.rng.random()
        if r < 0.75 and st.registered:
            wid, tag = self.rng.choice(st.registered), "registered id"
            if wid in st.compacted:
                tag = "id cancelled by compaction"
        elif r < 0.9 and st.ever:
            wid = self.rng.choice(st.ever)
            tag = "registered id" if wid in st.registered else "cancelled id"
        else:
            wid, tag = self.rng.choice([7, 999, 1 << 41, -7]), "unknown id"
        return WOp("cancel", "Cancel", rpc_pb2.WatchRequest(
            cancel_request=rpc_pb2.WatchCancelRequest(watch_id=wid)), stream=s, tags=(tag,))

    def progress_answerable(self, stream: int) -> bool:
        """Whether etcd 3.6 answers a RequestProgress on ``stream``: it holds
        a watcher, and every watcher it holds is synced (etcd 3.6.16's
        progressIfSync; otherwise the request is dropped, not deferred)."""
        st = self.streams[stream]
        return bool(st.registered) and not st.future and not (st.compacted & set(st.registered))

    def progress_op(self) -> WOp | None:
        streams = list(range(self.n_streams))
        if "future_progress" in self.avoid:
            streams = [i for i in streams if not self.streams[i].future]
        if "unanswered_progress" in self.avoid:
            streams = [i for i in streams if self.progress_answerable(i)]
        if not streams:
            return None
        s = self.rng.choice(streams)
        tags = ("future watcher pending",) if self.streams[s].future else ()
        return WOp("progress", "Progress", rpc_pb2.WatchRequest(
            progress_request=rpc_pb2.WatchProgressRequest()), stream=s, tags=tags)

    def expects_cancel_answer(self, op: WOp) -> bool:
        """Whether etcd answers this cancel (it does for every id it still
        holds, including watchers it cancelled for compaction)."""
        return op.request.cancel_request.watch_id in self.streams[op.stream].registered

    # ------------------------------------------------------------ lease ops
    def lease_op(self) -> WOp:
        r = self.rng.random()
        if r < 0.32:
            req = rpc_pb2.LeaseGrantRequest(TTL=self.rng.choice(LONG_TTLS))
            tags = []
            q = self.rng.random()
            if q < 0.5:
                tags.append("server-chosen id")
            elif q < 0.65 and self.live_leases:
                req.ID = self.rng.choice(self.live_leases)
                tags.append("existing id")
            else:
                req.ID = self.rng.choice(CLIENT_LEASE_IDS)
                tags.append("client id")
            q = self.rng.random()
            if q < 0.1:
                req.TTL = TOO_LARGE_TTL
                tags.append("TTL too large")
            elif q < 0.18:
                req.TTL = self.rng.choice(SHORT_TTLS)
                tags.append("TTL below minimum")
            return WOp("lease", "LeaseGrant", req, tags=tuple(tags))
        if r < 0.5:
            return WOp("lease", "LeaseRevoke", rpc_pb2.LeaseRevokeRequest(ID=self.some_lease_id()))
        if r < 0.72:
            return WOp("lease", "LeaseTimeToLive", rpc_pb2.LeaseTimeToLiveRequest(
                ID=self.some_lease_id(), keys=self._chance(0.6)))
        if r < 0.84:
            return WOp("lease", "LeaseLeases", rpc_pb2.LeaseLeasesRequest())
        return WOp("lease", "LeaseKeepAlive", rpc_pb2.LeaseKeepAliveRequest(ID=self.some_lease_id()))

    # ------------------------------------------------------------------ main
    def next_wop(self) -> WOp:
        if self.pending:
            return self.pending.pop(0)
        while True:
            r = self.rng.random()
            if r < 0.58:
                return self.kv_op()
            if r < 0.72:
                return self.create_op()
            if r < 0.79:
                return self.cancel_op()
            if r < 0.84:
                op = self.progress_op()
                if op is not None:
                    return op
                continue
            if self.leases_enabled:
                return self.lease_op()
