"""The watch hub against a model, over random interleavings.

Writes, watcher creations at random start revisions (past, present,
future), cancels, progress requests, partial consumer drains, catch-up
steps, compactions and a tiny per-stream queue limit (so watchers keep
falling behind and catching up) are interleaved at random.  For every
stream's output we check:
  * every watcher gets exactly the events of its range from its start on,
    each once, in revision order, one Txn's events in one response;
  * a progress response at revision R comes after every event <= R of
    every watcher that existed on the stream when it was queued (the kine
    #731 / etcd #15220 bug cannot happen);
  * a watcher that fell below the compaction revision gets one compacted
    response and nothing after it.
"""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain.backend import MemoryBackend
from brain.mvcc.requests import CompactRequest, DeleteRangeRequest, PutRequest, TxnRequest
from brain.mvcc.store import Store
from brain.mvcc.watch import INVALID_WATCH_ID, WatchHub

KEYS = [b"a", b"b", b"c", b"d"]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(KEYS)),
        st.tuples(st.just("txn"), st.sampled_from(KEYS), st.sampled_from(KEYS)),
        st.tuples(st.just("del"), st.sampled_from(KEYS)),
        st.tuples(st.just("watch"), st.integers(0, 1), st.sampled_from([b"a", b"b", b"c"]),
                  st.sampled_from([b"", b"c", b"\x00"]),
                  st.one_of(st.just(0), st.integers(1, 6), st.integers(1, 12), st.integers(-1, 30))),
        st.tuples(st.just("progress"), st.integers(0, 1)),
        st.tuples(st.just("cancel"), st.integers(0, 1), st.integers(0, 5)),
        st.tuples(st.just("progress"), st.integers(0, 1)),
        st.tuples(st.just("drain"), st.integers(0, 1)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("compact")),
    ),
    min_size=5,
    max_size=80,
)


class Harness:
    def __init__(self, layout) -> None:
        self.store = Store(MemoryBackend(len(layout) + 1), layout)
        self.store.collect_changes()
        self.lock = threading.Lock()
        self.hub = WatchHub(self.store, self.lock, max_queued_events=3, sync_batch_records=2)
        self.streams = [self.hub.open_stream(lambda: None) for _ in range(2)]
        self.outputs: list[list] = [[], []]
        self.params: list[dict] = [{}, {}]  # stream -> watch id -> (key, end, first revision)
        self.log: list[tuple] = []  # (rev, key, type) of every committed change
        self.counter = 0

    def write(self, req) -> None:
        self.store.apply([req])
        events = self.store.take_changes()
        self.log.extend((ev.kv.mod_revision, ev.kv.key, ev.type) for ev in events)
        if events:
            self.hub.route_committed(events, self.store.revision)

    def watch(self, i: int, key: bytes, end: bytes, start: int) -> None:
        s = self.streams[i]
        before = len(s.outbox)
        self.hub.create(s, key, end, start, 0, prev_kv=True)
        resp = s.outbox[before]
        if not resp.canceled:
            first = start if start > 0 else self.hub.rev + 1
            self.params[i][resp.watch_id] = (key, end, first)

    def drain(self, i: int) -> None:
        self.outputs[i].extend(self.streams[i].pop_all())

    def expected(self, key: bytes, end: bytes, first: int) -> list[tuple]:
        def inside(k):
            if not end:
                return k == key
            if end == b"\x00":
                return k >= key
            return key <= k < end
        return [e for e in self.log if e[0] >= first and inside(e[1])]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from([[], [b"b", b"c"]]), program=steps)
def test_watch_hub_delivers_exactly_once_in_order_and_progress_never_overtakes(layout, program):
    h = Harness(layout)
    for step in program:
        kind = step[0]
        h.counter += 1
        if kind == "put":
            h.write(PutRequest(step[1], b"v%d" % h.counter))
        elif kind == "txn":
            k1, k2 = step[1], step[2]
            ops = [PutRequest(k1, b"t%d" % h.counter)] + ([PutRequest(k2, b"u")] if k2 != k1 else [])
            h.write(TxnRequest([], ops, []))
        elif kind == "del":
            h.write(DeleteRangeRequest(step[1]))
        elif kind == "watch":
            _, i, key, end, start = step
            h.watch(i, key, end, start)
        elif kind == "cancel":
            h.hub.cancel(h.streams[step[1]], step[2])
        elif kind == "progress":
            h.hub.request_progress(h.streams[step[1]])
        elif kind == "drain":
            h.drain(step[1])
        elif kind == "sync":
            h.hub.sync_step()
        elif kind == "compact":
            rev = h.store.revision - 2
            if rev > h.store.compact_rev:
                h.store.apply([CompactRequest(rev)])
                while not h.store.compaction_step(2):
                    pass
    # Let everything settle: drain and catch up until quiet.
    for _ in range(1000):
        h.drain(0)
        h.drain(1)
        if not h.hub.sync_step() and not any(s.outbox for s in h.streams):
            break
    assert not h.hub.unsynced
    for i in range(2):
        check_stream(h, h.outputs[i], h.params[i])


def check_stream(h: Harness, out, params) -> None:
    live: set[int] = set()
    ended: dict[int, str] = {}
    got: dict[int, list] = {wid: [] for wid in params}
    for resp in out:
        wid = resp.watch_id
        if resp.created:
            if not resp.canceled:
                live.add(wid)
            continue
        if wid == INVALID_WATCH_ID:
            # Progress at R: every live watcher already got every event <= R.
            R = resp.revision
            for w in live:
                want = [e for e in h.expected(*params[w]) if e[0] <= R]
                assert got[w][: len(want)] == want, f"progress {R} overtook events of watcher {w}"
            continue
        if wid not in live and ended.get(wid) == "compacted" and resp.canceled and not resp.events:
            continue  # a compacted watcher keeps its id: the client's later cancel is answered
        assert wid in live, f"response for watcher {wid} that is not live"
        if resp.canceled:
            live.discard(wid)
            ended[wid] = "compacted" if resp.compact_revision else "canceled"
            continue
        revs = [ev.kv.mod_revision for ev in resp.events]
        assert resp.events and len(set(revs)) >= 1 and revs == sorted(revs)
        got[wid].extend((ev.kv.mod_revision, ev.kv.key, ev.type) for ev in resp.events)
    for wid, (key, end, first) in params.items():
        want = h.expected(key, end, first)
        if wid in ended:
            assert got[wid] == want[: len(got[wid])], f"watcher {wid}: not a prefix of its history"
        else:
            assert got[wid] == want, f"watcher {wid}: got {got[wid]} want {want}"
    # One revision's events for a watcher arrive in one response.
    seen: dict[tuple, int] = {}
    for n, resp in enumerate(out):
        for ev in resp.events:
            first = seen.setdefault((resp.watch_id, ev.kv.mod_revision), n)
            assert first == n, "a revision's events were split across responses"


def test_coalesce_merges_a_watchers_events_but_never_across_a_barrier():
    from brain.mvcc.requests import EVENT_PUT, Event, KeyValue
    from brain.mvcc.watch import WatchResponse, coalesce

    def ev(rev):
        return Event(EVENT_PUT, KeyValue(b"k", 1, rev, 1, b"v", 0))

    w1_5, w2_5, w1_6 = WatchResponse(1, 5, [ev(5)]), WatchResponse(2, 5, [ev(5)]), WatchResponse(1, 6, [ev(6)])
    progress = WatchResponse(-1, 6)
    w1_7 = WatchResponse(1, 7, [ev(7)])
    out = coalesce([w1_5, w2_5, w1_6, progress, w1_7])
    assert [(r.watch_id, r.revision, [e.kv.mod_revision for e in r.events]) for r in out] == [
        (1, 6, [5, 6]), (2, 5, [5]), (-1, 6, []), (1, 7, [7])]
    assert len(w1_5.events) == 1 and w1_5.revision == 5  # inputs are not modified
    # a cancel or a created response is a barrier too
    canceled = WatchResponse(2, 6, canceled=True)
    out = coalesce([w1_5, canceled, w1_6])
    assert [r.revision for r in out] == [5, 6, 6] and len(out[0].events) == 1
    # a merged response never exceeds the event limit
    many = [WatchResponse(1, r, [ev(r)]) for r in range(10, 20)]
    out = coalesce(many, max_events=4)
    assert [len(r.events) for r in out] == [4, 4, 2]
    assert [r.revision for r in out] == [13, 17, 19]
