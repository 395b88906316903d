"""Drive etcd (reference) and another server in lockstep through a seeded
sequence of KV writes, compactions, Watch stream actions and Lease calls, and
compare everything they answer (see watch_compare.py for the normalisation).

Lockstep rules (so that both servers see the same thing at the same point):

* unary calls (KV, Lease) go to the reference, then to the other; each pair
  of answers is compared at once;
* a watch create is sent on stream i of both servers and the harness waits
  for both created responses before going on (the created revision and
  which writes a start_revision=0 watcher sees depend on that);
* a Compact and a Cancel first wait for *quiescence* (no response on any
  stream of either server for ``quiet`` seconds): etcd's catch-up runs every
  100 ms, and an etcd cancel racing with undelivered events may drop or
  reorder them.  An answered cancel is then awaited on both;
* a RequestProgress is awaited on both; its revision must be the current one;
* every ``round_len`` ops, and before a Compact / Cancel, the streams'
  responses since the last comparison are compared per watcher.  A round that
  differs is re-collected once after a longer quiet period before it counts
  as a difference (a slow server is not a different one);
* finally, with leases enabled, an *expiry phase*: a 2 s lease holding keys in
  several shards, watched on three streams, expires on both servers; the
  delete events, the Range afterwards and TimeToLive must match.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf import text_format

from brain.api.pb.etcdserverpb import rpc_pb2

from .compare import ErrorResult, first_difference, render, to_plain, _strip_headers
from .generator import prefix_end
from .watch_compare import (CreateMeta, ExclusionRule, StreamState, align_ttl, normalize_stream,
                            normalize_unary, translate_request)
from .watch_generator import WatchLeaseGenerator, WOp
from .watch_streams import Side, quiesce

RPC_TIMEOUT = 15.0
CREATE_TIMEOUT = 5.0
CANCEL_TIMEOUT = 5.0
PROGRESS_TIMEOUT = 2.0
LATE_QUIET = 1.5
EXPIRY_TTL = 2
EXPIRY_TIMEOUT = 15.0
EXPIRY_KEYS = [b"/expiry/k0", b"/expiry/k1", b"kexpiry", b"zexpiry"]  # several shards

RESULTS: list["WatchRunResult"] = []


@dataclass
class WatchDiff:
    seed: int
    index: int            # 0-based op number (last op run when found)
    where: str
    detail: str
    labels: tuple[str, str]
    repro: str

    def report(self) -> str:
        return (f"DIFFERENCE at op #{self.index} (seed {self.seed}): {self.where}\n"
                f"{self.detail}\nreproduce: {self.repro}")


@dataclass
class WatchRunResult:
    seed: int
    label: str = ""
    ops_done: int = 0
    counts: collections.Counter = field(default_factory=collections.Counter)
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    diff: WatchDiff | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ops_compared(self) -> int:  # what tests/conftest.py's session summary reads
        return self.ops_done

    def summary(self) -> str:
        c = self.counts
        head = (f"{self.label + ' ' if self.label else ''}seed {self.seed}: {self.ops_done} ops; compared "
                f"{c['unary']} unary answers ({c['lease answers']} lease), {c['events']} watch events, "
                f"{c['controls']} watch control responses, {c['progress']} progress responses "
                f"over {c['rounds']} rounds ({c['late rounds']} late, "
                f"{c['excluded events']} events excluded as deliberate), "
                f"{c['expiry phases']} lease expiry phase(s)"
                + ("" if self.diff is None else f"; first difference at op #{self.diff.index}"))
        lines = [head]
        for (what, outcome), n in sorted(self.outcomes.items()):
            lines.append(f"  {what:24s} {n:5d}  {outcome}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


class DifferenceFound(Exception):
    def __init__(self, where: str, detail: str):
        super().__init__(where)
        self.where, self.detail = where, detail


def _call(fn, request):
    try:
        return fn(request, timeout=RPC_TIMEOUT)
    except grpc.RpcError as e:
        return ErrorResult.from_rpc_error(e)


def _keepalive_once(lease_stub, request):
    try:
        it = lease_stub.LeaseKeepAlive(iter([request]), timeout=RPC_TIMEOUT)
        try:
            return next(it)
        finally:
            it.cancel()
    except grpc.RpcError as e:
        return ErrorResult.from_rpc_error(e)
    except StopIteration:
        return ErrorResult("NO_RESPONSE", "keep-alive stream ended without an answer")


def _is_created(r) -> bool:
    return r.created


def _is_progress(r) -> bool:
    return (r.watch_id == -1 and not r.created and not r.canceled and not r.events
            and not r.compact_revision)


def _plain_control(r) -> dict:
    p = to_plain(r)
    _strip_headers(p)
    return p


def _one_line(r) -> str:
    if r is None:
        return "(nothing)"
    if isinstance(r, ErrorResult):
        return str(r)
    m = type(r)()
    m.CopyFrom(r)
    if m.HasField("header"):
        for f in ("cluster_id", "member_id", "raft_term"):
            m.header.ClearField(f)
    return text_format.MessageToString(m, as_one_line=True) or "(empty response)"


def _outcome(op: WOp, ref) -> str:
    if isinstance(ref, ErrorResult):
        return f"{ref.code}: {ref.details}"
    tags = ", ".join(op.tags)
    if op.kind == "create":
        if ref is None:
            return "no answer"
        if ref.canceled:
            return f"rejected: {ref.cancel_reason}"
        return f"created ({tags})" if tags else "created"
    if op.kind == "cancel":
        return f"{'answered' if ref else 'no answer'} ({tags})"
    if op.kind == "progress":
        if ref == "skipped":
            return "skipped (etcd 3.6 would not answer after quiescence)"
        return "answered" + (f" ({tags})" if tags else "")
    return "ok" + (f" ({tags})" if tags else "")


class _Lockstep:
    def __init__(self, ref: Side, other: Side, seed: int, *, n_streams: int, quiet: float,
                 round_len: int, leases: bool, avoid, log, result: WatchRunResult):
        self.ref, self.other = ref, other
        self.sides = (ref, other)
        self.labels = (ref.label, other.label)
        self.gen = WatchLeaseGenerator(seed, n_streams, leases=leases, avoid=avoid)
        self.n_streams = n_streams
        self.quiet = quiet
        self.round_len = round_len
        self.log = log
        self.res = result
        self.lease_map: dict[int, int] = {}   # reference id -> other id
        self.inverse: dict[int, int] = {}     # other id -> reference id
        self.creates: list[list[CreateMeta]] = [[] for _ in range(n_streams)]
        self.states = {side.label: [StreamState() for _ in range(n_streams)] for side in self.sides}
        self.consumed = {side.label: [0] * n_streams for side in self.sides}
        self.rev_ops: dict[int, int] = {}     # revision -> op index that wrote it (reference)
        self.index = -1
        self.op: WOp | None = None

    # ------------------------------------------------------------- helpers
    def _differ(self, a, b):
        return first_difference(a, b, labels=self.labels)

    def _fail(self, where: str, detail: str):
        raise DifferenceFound(where, detail)

    def _op_text(self) -> str:
        return f"--- op #{self.index} ---\n{self.op.describe()}" if self.op is not None else ""

    def _note_rev(self, before: int) -> None:
        if self.gen.cur_rev > before:
            for r in range(before + 1, self.gen.cur_rev + 1):
                self.rev_ops[r] = self.index

    # ------------------------------------------------------------- unary
    def unary(self, op: WOp):
        a_req = op.request
        b_req = translate_request(op.request, self.lease_map)
        if op.method == "LeaseKeepAlive":
            a = _keepalive_once(self.ref.lease, a_req)
            b = _keepalive_once(self.other.lease, b_req)
        else:
            svc = "kv" if op.kind == "kv" else "lease"
            a = _call(getattr(getattr(self.ref, svc), op.method), a_req)
            b = _call(getattr(getattr(self.other, svc), op.method), b_req)
        for s in self.sides:
            s.touch()
        if (op.method == "LeaseGrant" and op.request.ID == 0
                and not isinstance(a, ErrorResult) and not isinstance(b, ErrorResult)):
            # etcd picks positive ids ("only use positive int64 id's") that never repeat
            if b.ID <= 0 or b.ID in self.inverse:
                self._fail(f"LeaseGrant: {self.labels[1]} chose lease id {b.ID} (not positive, or "
                           "handed out before)",
                           f"{self._op_text()}\n--- {self.labels[0]} ---\n{_one_line(a)}\n"
                           f"--- {self.labels[1]} ---\n{_one_line(b)}")
            self.lease_map[a.ID] = b.ID
            self.inverse[b.ID] = a.ID
        pa = normalize_unary(op.method, op.request, a)
        pb = normalize_unary(op.method, op.request, b, self.inverse)
        if op.method == "LeaseTimeToLive":
            align_ttl(pa, pb)
        where = self._differ(pa, pb)
        self.res.counts["unary"] += 1
        if op.kind == "lease":
            self.res.counts["lease answers"] += 1
        if where is not None:
            self._fail(where, f"{self._op_text()}\n--- request sent to {self.labels[1]} ---\n"
                              f"{text_format.MessageToString(b_req, as_one_line=True)}\n"
                              f"--- {self.labels[0]} ---\n{render(a)}\n--- {self.labels[1]} ---\n{render(b)}")
        return a, b

    # ------------------------------------------------------------- streams
    def _send_both(self, op: WOp) -> tuple[int, int]:
        ia = self.ref.streams[op.stream].send(op.request)
        ib = self.other.streams[op.stream].send(op.request)
        for s in self.sides:
            s.touch()
        return ia, ib

    def _await_both(self, op: WOp, starts, predicate, timeout: float):
        got = []
        for side, start in zip(self.sides, starts):
            st = side.streams[op.stream]
            i = st.wait_for(start, predicate, timeout)
            got.append(None if i is None else st.responses[i])
            if st.error is not None:
                self._fail(f"{side.label} watch stream {op.stream} failed: {st.error}", self._op_text())
        return got

    def _compare_control(self, op: WOp, a, b, what: str) -> None:
        pa = None if a is None else _plain_control(a)
        pb = None if b is None else _plain_control(b)
        if pa is None and pb is None:
            return
        if pa is None or pb is None:
            self._fail(f"{what}: answered by {self.labels[0] if pb is None else self.labels[1]} only",
                       f"{self._op_text()}\n--- {self.labels[0]} ---\n{_one_line(a)}\n"
                       f"--- {self.labels[1]} ---\n{_one_line(b)}")
        where = self._differ(pa, pb)
        if where is not None:
            self._fail(f"{what}: {where}", f"{self._op_text()}\n--- {self.labels[0]} ---\n{_one_line(a)}\n"
                                            f"--- {self.labels[1]} ---\n{_one_line(b)}")

    def create(self, op: WOp):
        c = op.request.create_request
        rule = None
        if self.gen.compact_rev > 0 and c.start_revision == self.gen.compact_rev:
            rule = ExclusionRule(self.gen.compact_rev)
        self.creates[op.stream].append(CreateMeta(self.index, rule))
        starts = self._send_both(op)
        a, b = self._await_both(op, starts, _is_created, CREATE_TIMEOUT)
        if a is None:
            self._fail(f"{self.labels[0]} sent no created response within {CREATE_TIMEOUT}s", self._op_text())
        self._compare_control(op, a, b, "created response")
        return a

    def cancel(self, op: WOp):
        self.round()
        wid = op.request.cancel_request.watch_id
        expect = self.gen.expects_cancel_answer(op)
        starts = self._send_both(op)
        if not expect:
            return False

        def pred(r):
            return r.canceled and not r.created and r.watch_id == wid

        a, b = self._await_both(op, starts, pred, CANCEL_TIMEOUT)
        if a is None:
            self._fail(f"{self.labels[0]} did not answer a cancel the generator expected it to answer "
                       "(harness model of etcd is wrong)", self._op_text())
        self._compare_control(op, a, b, "canceled response")
        return True

    def progress(self, op: WOp):
        if "unanswered_progress" in self.gen.avoid:
            # Let history catch-up finish (etcd 3.6 drops a progress request
            # while any watcher is unsynced) and learn of compaction cancels.
            self.round()
            if not self.gen.progress_answerable(op.stream):
                return "skipped"
        starts = self._send_both(op)
        a, b = self._await_both(op, starts, _is_progress, PROGRESS_TIMEOUT)
        if a is None:
            self._fail(f"{self.labels[0]} sent no progress response within {PROGRESS_TIMEOUT}s", self._op_text())
        if b is None:
            self._fail(f"{self.labels[1]} sent no progress response within {PROGRESS_TIMEOUT}s "
                       f"({self.labels[0]} answered at revision {a.header.revision})",
                       f"{self._op_text()}\n--- {self.labels[0]} ---\n{_one_line(a)}\n"
                       f"--- {self.labels[1]} ---\n(nothing)")
        if a.header.revision != self.gen.cur_rev:
            self._fail(f"{self.labels[0]} progress revision {a.header.revision} != current "
                       f"{self.gen.cur_rev} (harness assumption broken)", self._op_text())
        self._compare_control(op, a, b, "progress response")
        return a

    # ------------------------------------------------------------- rounds
    def _views(self, side: Side, s: int):
        resp = side.streams[s].snapshot(self.consumed[side.label][s])
        inverse = self.inverse if side is self.other else None
        view, state = normalize_stream(resp, self.states[side.label][s], self.creates[s], inverse)
        return resp, view, state

    def round(self) -> None:
        if not quiesce(self.sides, self.quiet):
            self._fail("watch streams never fell quiet", self._op_text())
        for s in range(self.n_streams):
            for side in self.sides:
                if side.streams[s].error is not None:
                    self._fail(f"{side.label} watch stream {s} failed: {side.streams[s].error}", self._op_text())
            ra, va, sa = self._views(self.ref, s)
            rb, vb, sb = self._views(self.other, s)
            where = self._differ(va.plain(), vb.plain())
            if where is not None:
                quiesce(self.sides, LATE_QUIET)
                ra, va, sa = self._views(self.ref, s)
                rb, vb, sb = self._views(self.other, s)
                where2 = self._differ(va.plain(), vb.plain())
                if where2 is None:
                    self.res.counts["late rounds"] += 1
                else:
                    self._fail(f"watch stream {s}: {where2}", self._round_detail(s, va, vb, ra, rb, sa))
            self.gen.observe_stream(s, ra)
            self.res.counts["events"] += va.events
            self.res.counts["controls"] += va.controls
            self.res.counts["progress"] += len(va.progress)
            self.res.counts["excluded events"] += (sa.excluded - self.states[self.ref.label][s].excluded
                                                   + sb.excluded - self.states[self.other.label][s].excluded)
            self.states[self.ref.label][s], self.states[self.other.label][s] = sa, sb
            self.consumed[self.ref.label][s] += len(ra)
            self.consumed[self.other.label][s] += len(rb)
        self.res.counts["rounds"] += 1

    def _round_detail(self, s, va, vb, ra, rb, state) -> str:
        a_lab, b_lab = self.labels
        lines = [f"(responses of stream {s} since the previous comparison, after quiescence)"]
        wids = sorted(set(va.watchers) | set(vb.watchers))
        for wid in wids:
            ia, ib = va.watchers.get(wid, []), vb.watchers.get(wid, [])
            if ia == ib:
                continue
            origin = state.origins.get(wid)
            lines.append(f"watch id {wid} (created by op #{'?' if origin is None else origin}):")
            for lab, items in ((a_lab, ia), (b_lab, ib)):
                lines.append(f"  {lab}:")
                for it in items:
                    ev = it.get("event")
                    if ev is not None:
                        rev = ev.get("kv", {}).get("mod_revision", 0)
                        lines.append(f"    {ev}  (revision {rev}, written by op #{self.rev_ops.get(rev, '?')})")
                    else:
                        lines.append(f"    {it}")
        if va.rejected != vb.rejected:
            lines.append(f"rejected creates: {a_lab} {va.rejected}\n                  {b_lab} {vb.rejected}")
        if va.progress != vb.progress:
            lines.append(f"progress revisions: {a_lab} {va.progress} / {b_lab} {vb.progress}")
        lines.append(f"raw {a_lab} responses:")
        lines.extend("  " + _one_line(r) for r in ra[-40:])
        lines.append(f"raw {b_lab} responses:")
        lines.extend("  " + _one_line(r) for r in rb[-40:])
        return "\n".join(lines)

    # ------------------------------------------------------------- main loop
    def step(self, op: WOp) -> None:
        before = self.gen.cur_rev
        if op.kind in ("kv", "lease"):
            if op.method == "Compact":
                self.round()
            a, b = self.unary(op)
            self.gen.observe_op(op, a)
            outcome_ref = a
        elif op.kind == "create":
            a = self.create(op)
            self.gen.observe_op(op, a)
            outcome_ref = a
        elif op.kind == "cancel":
            answered = self.cancel(op)
            self.gen.observe_op(op, answered)
            outcome_ref = answered
        else:
            a = self.progress(op)
            self.gen.observe_op(op, None)
            outcome_ref = a
        self._note_rev(before)
        self.res.outcomes[(f"{op.kind}.{op.method}", _outcome(op, outcome_ref))] += 1
        if self.log is not None:
            self.log(self.index, op)

    def run(self, n_ops: int) -> None:
        for i in range(n_ops):
            self.index = i
            self.op = self.gen.next_wop()
            self.step(self.op)
            self.res.ops_done = i + 1
            if (i + 1) % self.round_len == 0:
                self.round()
        self.round()

    # ------------------------------------------------------------- expiry
    def expiry_phase(self) -> None:
        """A 2 s lease with keys in several shards expires on both servers."""
        self.op = None
        gen = self.gen
        grant = WOp("lease", "LeaseGrant", rpc_pb2.LeaseGrantRequest(TTL=EXPIRY_TTL), tags=("expiry phase",))
        self.index += 1
        self.op = grant
        a, _ = self.unary(grant)
        if isinstance(a, ErrorResult):
            self._fail(f"{self.labels[0]} refused the expiry-phase grant: {a}", self._op_text())
        gen.observe(grant, a)
        lid = a.ID
        watches = [
            (0, rpc_pb2.WatchCreateRequest(key=b"/expiry/", range_end=prefix_end(b"/expiry/"), prev_kv=True)),
            (1 % self.n_streams, rpc_pb2.WatchCreateRequest(key=b"\x00", range_end=b"\x00")),
            (2 % self.n_streams, rpc_pb2.WatchCreateRequest(key=b"kexpiry", prev_kv=True,
                                                            filters=[rpc_pb2.WatchCreateRequest.NOPUT])),
        ]
        for stream, c in watches:
            self.index += 1
            self.op = WOp("create", "Create", rpc_pb2.WatchRequest(create_request=c), stream=stream,
                          tags=("expiry phase",))
            self.create(self.op)
        before = gen.cur_rev
        for k in EXPIRY_KEYS:
            self.index += 1
            self.op = WOp("kv", "Put", rpc_pb2.PutRequest(key=k, value=b"expiring", lease=lid),
                          tags=("expiry phase",))
            a, _ = self.unary(self.op)
            gen.observe(self.op, a)
        self._note_rev(before)
        self.round()
        # Wait for both servers to expire the lease.
        self.index += 1
        self.op = WOp("lease", "(wait for expiry)", rpc_pb2.LeaseTimeToLiveRequest(ID=lid, keys=True),
                      tags=("expiry phase",))
        t0 = time.monotonic()
        gone: dict[str, float] = {}
        probe = rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00", count_only=True)
        while len(gone) < 2 and time.monotonic() - t0 < EXPIRY_TIMEOUT:
            for side in self.sides:
                if side.label in gone:
                    continue
                req = translate_request(self.op.request, self.lease_map) if side is self.other else self.op.request
                ttl = _call(side.lease.LeaseTimeToLive, req)
                rng = _call(side.kv.Range, rpc_pb2.RangeRequest(key=b"/expiry/", range_end=prefix_end(b"/expiry/"),
                                                                count_only=True))
                if (not isinstance(ttl, ErrorResult) and ttl.TTL == -1
                        and not isinstance(rng, ErrorResult) and rng.count == 0):
                    gone[side.label] = time.monotonic() - t0
            time.sleep(0.1)
        for side in self.sides:
            if side.label not in gone:
                self._fail(f"lease {lid:#x} (TTL {EXPIRY_TTL}s) did not expire on {side.label} within "
                           f"{EXPIRY_TIMEOUT}s", self._op_text())
        self.res.notes.append("expiry phase: lease gone after " + ", ".join(
            f"{lab} {t:.1f}s" for lab, t in gone.items()))
        for side in self.sides:
            side.touch()
        before = gen.cur_rev
        after = self.unary(WOp("kv", "Range", probe))[0]
        gen.observe(WOp("kv", "Range", probe), after)
        self._note_rev(before)
        self.round()
        # After expiry: the keys are gone, TimeToLive says -1, the lease is not listed.
        for req, method in ((rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00"), "Range"),
                            (rpc_pb2.LeaseTimeToLiveRequest(ID=lid, keys=True), "LeaseTimeToLive"),
                            (rpc_pb2.LeaseLeasesRequest(), "LeaseLeases")):
            self.index += 1
            self.op = WOp("kv" if method == "Range" else "lease", method, req, tags=("after expiry",))
            self.unary(self.op)
        self.res.counts["expiry phases"] += 1


def run_watch_differential(ref_endpoint: str, other_endpoint: str, seed: int, n_ops: int, *,
                           labels: tuple[str, str] = ("etcd", "brain"), n_streams: int = 3,
                           quiet: float = 0.3, round_len: int = 10, leases: bool = True,
                           expiry: bool = True, avoid=(), label: str = "", repro_extra: str = "",
                           log=None, other_response_filter=None) -> WatchRunResult:
    """Run ``n_ops`` generated steps (plus the expiry phase) on two *fresh*
    servers; stops at the first difference (``result.diff``)."""
    from .harness import check_fresh

    res = WatchRunResult(seed=seed, label=label)
    avoid_arg = f" --avoid {','.join(sorted(avoid))}" if avoid else ""
    no_leases = "" if leases else " --no-leases"
    ref = Side(ref_endpoint, labels[0], n_streams)
    other = Side(other_endpoint, labels[1], n_streams, other_response_filter)
    run = None
    try:
        check_fresh(ref.kv, other.kv, labels)
        run = _Lockstep(ref, other, seed, n_streams=n_streams, quiet=quiet, round_len=round_len,
                        leases=leases, avoid=avoid, log=log, result=res)
        try:
            run.run(n_ops)
            if leases and expiry and "leases" not in set(avoid):
                run.expiry_phase()
        except DifferenceFound as d:
            n = run.index + 1
            repro = (f"python -m tests.differential.watch_run --seed {seed} --ops {min(n, n_ops)}"
                     f"{repro_extra}{avoid_arg}{no_leases}" + ("" if n <= n_ops else " (expiry phase)"))
            res.diff = WatchDiff(seed, run.index, d.where, d.detail, labels, repro)
    finally:
        ref.close()
        other.close()
    return res
