"""Leases against `python -m brain serve`: etcdctl's lease commands, expiry,
durability across SIGTERM and kill -9 restarts, and a differential check of
the Lease RPCs against a real etcd.

Lease IDs chosen by the server differ between brain and etcd, so etcdctl
outputs are compared after replacing each server's own lease ID by <ID>, and
remaining TTLs (whole seconds, truncated) with a tolerance of one second.
"""

from __future__ import annotations

import json
import re
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.integration.conftest import require_etcdctl, run_etcdctl
from tests.support.servers import kv_stub

pytestmark = pytest.mark.etcd

_REMAINING = re.compile(r"remaining\((-?\d+)s\)")
_JSON_TTL = re.compile(r'"ttl":(-?\d+)')


def targets(servers):
    """(name, endpoint) of brain and of etcd."""
    return [("brain", servers.brain.endpoint), ("etcd", servers.etcd.endpoint)]


def masked(text: str, lease_hex: str, lease_dec: int | None = None) -> str:
    text = text.replace(lease_hex, "<ID>")
    if lease_dec is not None:
        text = text.replace(str(lease_dec), "<ID>")
    for pat, repl in ((r'"cluster_id":\d+', '"cluster_id":<C>'), (r'"member_id":\d+', '"member_id":<M>'),
                      (r'"raft_term":\d+', '"raft_term":<T>')):
        text = re.sub(pat, repl, text)
    return text


def remaining_of(text: str) -> int:
    m = _REMAINING.search(text)
    assert m, text
    return int(m.group(1))


def grant(endpoint: str, ttl: int) -> tuple[str, int]:
    r = run_etcdctl(endpoint, "lease", "grant", str(ttl))
    assert r.rc == 0, r.err
    m = re.fullmatch(r"lease ([0-9a-f]{16}) granted with TTL\((\d+)s\)\n", r.out)
    assert m, r.out
    return m.group(1), int(m.group(2))


def wait_until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


# ---------------------------------------------------------------------------
# etcdctl, brain mirrored to etcd


def test_lease_lifecycle_with_etcdctl(servers):
    require_etcdctl()
    seen = {}
    for name, ep in targets(servers):
        lid, ttl = grant(ep, 5)
        assert ttl == 5
        dec = int(lid, 16)
        out = []
        r = run_etcdctl(ep, "lease", "list")
        assert r.rc == 0 and lid in r.out.split("\n")[1:]
        out.append(r.out.splitlines()[0].startswith("found "))
        assert run_etcdctl(ep, "put", "--lease", lid, "lk/a", "1").out == "OK\n"
        assert run_etcdctl(ep, "put", "--lease", lid, "lk/b", "2").out == "OK\n"
        r = run_etcdctl(ep, "lease", "timetolive", lid)
        rem = [remaining_of(r.out)]
        out.append(_REMAINING.sub("remaining(<R>)", masked(r.out, lid)))
        r = run_etcdctl(ep, "lease", "timetolive", "--keys", lid)
        rem.append(remaining_of(r.out))
        out.append(_REMAINING.sub("remaining(<R>)", masked(r.out, lid)))
        r = run_etcdctl(ep, "lease", "timetolive", "--keys", lid, "-w", "json")
        doc = json.loads(r.out)
        assert sorted(doc["keys"]) == ["bGsvYQ==", "bGsvYg=="]  # lk/a, lk/b (etcd's order is a map's)
        rem.append(doc["ttl"])
        out.append((doc["id"] == dec, doc["granted-ttl"]))
        r = run_etcdctl(ep, "lease", "keep-alive", "--once", lid)
        out.append((r.rc, masked(r.out, lid)))
        r = run_etcdctl(ep, "lease", "keep-alive", "--once", lid, "-w", "json")
        out.append(masked(r.out, lid, dec))
        r = run_etcdctl(ep, "lease", "revoke", lid)
        out.append((r.rc, masked(r.out, lid)))
        out.append(run_etcdctl(ep, "get", "lk/", "--prefix").out)
        r = run_etcdctl(ep, "lease", "revoke", lid)
        out.append((r.rc, r.err))
        r = run_etcdctl(ep, "lease", "timetolive", lid)
        out.append((r.rc, masked(r.out, lid)))
        assert all(3 <= x <= 5 for x in rem), rem
        seen[name] = out
    b = seen["brain"]
    assert b[1] == "lease <ID> granted with TTL(5s), remaining(<R>)\n"
    assert b[2] == "lease <ID> granted with TTL(5s), remaining(<R>), attached keys([lk/a lk/b])\n"
    assert b[4] == (0, "lease <ID> keepalived with TTL(5)\n")
    assert b[6] == (0, "lease <ID> revoked\n")
    assert b[7] == ""
    assert b[8] == (1, "Error: failed to revoke lease (etcdserver: requested lease not found)")
    assert b[9] == (0, "lease <ID> already expired\n")
    e = seen["etcd"]
    # etcd lists attached keys in its map order
    e[2] = e[2].replace("[lk/b lk/a]", "[lk/a lk/b]")
    assert b == e


def test_lease_errors_and_minimum_ttl(ctl):
    r = ctl("lease", "grant", "9000000001")
    assert (r.rc, r.err) == (1, "Error: failed to grant lease (etcdserver: too large lease TTL)")
    r = ctl("put", "--lease", "123456", "le/k", "1")
    assert (r.rc, r.err) == (1, "Error: etcdserver: requested lease not found")
    r = ctl("lease", "timetolive", "abcdef")
    assert (r.rc, r.out) == (0, "lease 0000000000abcdef already expired\n")
    r = ctl("lease", "keep-alive", "--once", "abcdef")
    assert (r.rc, r.err) == (2, "Error: etcdserver: requested lease not found")
    r = ctl("lease", "revoke", "abcdef")
    assert (r.rc, r.err) == (1, "Error: failed to revoke lease (etcdserver: requested lease not found)")
    r = ctl("lease", "grant", "1", compare=False)
    assert re.fullmatch(r"lease [0-9a-f]{16} granted with TTL\(2s\)\n", r.out)


def test_expiry_deletes_keys_in_one_revision(servers):
    require_etcdctl()
    revs = {}
    pending = []
    for name, ep in targets(servers):
        lid, ttl = grant(ep, 2)
        for k in ("lx/c", "lx/a", "lx/b"):
            assert run_etcdctl(ep, "put", "--lease", lid, k, "v").rc == 0
        run_etcdctl(ep, "put", "lx/keep", "v")
        before = json.loads(run_etcdctl(ep, "get", "lx/keep", "-w", "json").out)["header"]["revision"]
        pending.append((name, ep, lid, before, time.monotonic()))
    for name, ep, lid, before, t0 in pending:
        assert wait_until(lambda: run_etcdctl(ep, "get", "lx/a").out == "", timeout=8), name
        took = time.monotonic() - t0
        assert 1.0 < took < 6.0, (name, took)
        doc = json.loads(run_etcdctl(ep, "get", "lx/", "--prefix", "-w", "json").out)
        assert [kv["key"] for kv in doc["kvs"]] == ["bHgva2VlcA=="]  # lx/keep
        assert doc["header"]["revision"] == before + 1, name  # all three deletes in one revision
        r = run_etcdctl(ep, "lease", "timetolive", lid)
        assert r.out == f"lease {lid} already expired\n"
        revs[name] = doc["header"]["revision"]
    assert revs["brain"] == revs["etcd"]


# ---------------------------------------------------------------------------
# durability across restarts


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_lease_survives_restart_and_still_expires(brain_factory, how):
    require_etcdctl()
    srv = brain_factory()
    ep = srv.endpoint
    long_id, _ = grant(ep, 60)
    short_id, _ = grant(ep, 3)
    assert run_etcdctl(ep, "put", "--lease", long_id, "ls/long", "v").rc == 0
    assert run_etcdctl(ep, "put", "--lease", short_id, "ls/short", "v").rc == 0
    if how == "kill9":
        srv.kill9()
        srv.start()
    else:
        srv.restart()
    t0 = time.monotonic()
    listed = run_etcdctl(ep, "lease", "list").out
    assert long_id in listed and short_id in listed
    r = run_etcdctl(ep, "lease", "timetolive", "--keys", long_id)
    # the full TTL again (plus etcd's one-second election-timeout extension)
    assert r.out.startswith(f"lease {long_id} granted with TTL(60s), remaining(")
    assert r.out.endswith(", attached keys([ls/long])\n")
    assert remaining_of(r.out) in (59, 60)
    r = run_etcdctl(ep, "lease", "timetolive", "--keys", short_id)
    assert "attached keys([ls/short])" in r.out and remaining_of(r.out) in (2, 3)
    assert run_etcdctl(ep, "get", "ls/short", "--print-value-only").out == "v\n"
    # the short lease still expires after its (renewed) TTL
    assert wait_until(lambda: run_etcdctl(ep, "get", "ls/short").out == "", timeout=10)
    assert time.monotonic() - t0 > 2.0
    assert run_etcdctl(ep, "get", "ls/long", "--print-value-only").out == "v\n"
    assert run_etcdctl(ep, "lease", "keep-alive", "--once", long_id).out == f"lease {long_id} keepalived with TTL(60)\n"
    # and its expiry is durable too
    srv.kill9()
    srv.start()
    assert short_id not in run_etcdctl(ep, "lease", "list").out
    assert run_etcdctl(ep, "get", "ls/short").out == ""


def test_restart_renews_ttl_like_etcd(brain_factory, etcd_factory):
    """A recovered lease gets its whole TTL again, counted from the restart
    (plus 1 s: etcd's election timeout), not what it had left before it.

    The lease ages 3 s first, so a server that kept the old deadline would
    answer at most ttl - 3; a renewed one answers the whole TTL + 1 less the
    time since the restart began (truncated to whole seconds)."""
    ttl, aged = 10, 3.0
    got = {}
    for name, srv in (("brain", brain_factory()), ("etcd", etcd_factory())):
        with srv.stubs() as st:
            st.lease.LeaseGrant(pb.LeaseGrantRequest(TTL=ttl, ID=4242))
        time.sleep(aged)  # the lease ages before the restart
        t0 = time.monotonic()
        srv.restart()
        with srv.stubs() as st:
            left = st.lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=4242)).TTL
        since = time.monotonic() - t0
        got[name] = (left, round(since, 2))
        assert int(ttl + 1 - since) <= left <= ttl + 1, (name, left, since)
        assert left > ttl - aged, (name, left, since, "the lease was not renewed by the restart")
    assert abs(got["brain"][0] - got["etcd"][0]) <= 1, got


# ---------------------------------------------------------------------------
# gRPC differential: Lease RPC responses, brain vs etcd


def _strip(msg) -> dict:
    """A response as a dict without cluster_id / member_id / raft_term."""
    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(msg, preserving_proto_field_name=True)
    h = d.get("header")
    if h is not None:
        for f in ("cluster_id", "member_id", "raft_term"):
            h.pop(f, None)
    if "keys" in d:
        d["keys"] = sorted(d["keys"])  # etcd lists them in map order
    return d


def _script(st) -> list:
    """A fixed sequence of Lease (and a few KV) calls; each outcome recorded."""
    out = []

    def call(name, fn, req):
        try:
            out.append((name, _strip(fn(req))))
        except grpc.RpcError as e:
            out.append((name, "error", e.code().name, e.details()))

    L, KV = st.lease, st.kv
    call("grant", L.LeaseGrant, pb.LeaseGrantRequest(TTL=30, ID=101))
    call("grant-min", L.LeaseGrant, pb.LeaseGrantRequest(TTL=1, ID=102))
    call("grant-zero", L.LeaseGrant, pb.LeaseGrantRequest(TTL=0, ID=103))
    call("grant-neg", L.LeaseGrant, pb.LeaseGrantRequest(TTL=-7, ID=104))
    call("grant-max", L.LeaseGrant, pb.LeaseGrantRequest(TTL=9_000_000_000, ID=105))
    call("grant-too-large", L.LeaseGrant, pb.LeaseGrantRequest(TTL=9_000_000_001, ID=106))
    call("grant-exists", L.LeaseGrant, pb.LeaseGrantRequest(TTL=30, ID=101))
    call("grant-exists-too-large", L.LeaseGrant, pb.LeaseGrantRequest(TTL=9_000_000_001, ID=101))
    call("grant-negative-id", L.LeaseGrant, pb.LeaseGrantRequest(TTL=20, ID=-9))
    call("put", KV.Put, pb.PutRequest(key=b"d/b", value=b"1", lease=101))
    call("put", KV.Put, pb.PutRequest(key=b"d/a", value=b"1", lease=101))
    call("put", KV.Put, pb.PutRequest(key=b"d/c", value=b"1", lease=-9))
    call("put-missing-lease", KV.Put, pb.PutRequest(key=b"d/x", value=b"1", lease=999))
    call("ttl", L.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=101))
    call("ttl-keys", L.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=101, keys=True))
    call("ttl-keys-none", L.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=105, keys=True))
    call("ttl-missing", L.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=12345, keys=True))
    call("ttl-zero", L.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=0))
    call("leases", L.LeaseLeases, pb.LeaseLeasesRequest())
    reqs = [pb.LeaseKeepAliveRequest(ID=i) for i in (101, 999, 0, -9, 102, 101)]
    for r in L.LeaseKeepAlive(iter(reqs), timeout=10):
        out.append(("keepalive", _strip(r)))
    call("revoke", L.LeaseRevoke, pb.LeaseRevokeRequest(ID=101))
    call("revoke-again", L.LeaseRevoke, pb.LeaseRevokeRequest(ID=101))
    call("revoke-zero", L.LeaseRevoke, pb.LeaseRevokeRequest(ID=0))
    call("revoke-no-keys", L.LeaseRevoke, pb.LeaseRevokeRequest(ID=105))
    call("range", KV.Range, pb.RangeRequest(key=b"d/", range_end=b"d0"))
    call("leases", L.LeaseLeases, pb.LeaseLeasesRequest())
    return out


def _ttl_close(a, b) -> bool:
    """Equal, except TTL fields of TimeToLive may differ by one second."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and a[0] == b[0]:
        da, db = dict(a[1]), dict(b[1])
        if a[0].startswith("ttl") and "TTL" in da and "TTL" in db:
            if abs(int(da.pop("TTL")) - int(db.pop("TTL"))) > 1:
                return False
        return da == db
    return a == b


def test_lease_rpcs_match_etcd(brain_factory, etcd_factory):
    brain, etcd = brain_factory(), etcd_factory()
    with brain.stubs() as st:
        got = _script(st)
    with etcd.stubs() as st:
        want = _script(st)
    assert len(got) == len(want)
    diffs = [(g, w) for g, w in zip(got, want) if not _ttl_close(g, w)]
    assert not diffs, "\n".join(f"brain {g}\n etcd {w}" for g, w in diffs)
    # spot checks that hold without etcd too
    outcome = dict((o[0], o) for o in got)
    assert outcome["grant-min"][1]["TTL"] == "2"
    assert outcome["grant-too-large"][1:] == ("error", "OUT_OF_RANGE", "etcdserver: too large lease TTL")
    assert outcome["grant-exists"][1:] == ("error", "FAILED_PRECONDITION", "etcdserver: lease already exists")
    assert outcome["ttl-missing"][1] == {"header": {"revision": "4"}, "ID": "12345", "TTL": "-1"}


# ---------------------------------------------------------------------------
# delete events of revoke and expiry, as a watcher sees them


def _lease_events(endpoint: str) -> list:
    """Watch w/ on a server; revoke one lease and let another expire; return
    the events as (type, key, mod_revision) with revisions made relative."""
    from tests.integration.test_watch import WatchClient

    w = WatchClient(endpoint)
    try:
        with kv_stub(endpoint) as st:
            L, KV = st.lease, st.kv
            base = KV.Range(pb.RangeRequest(key=b"w/"), timeout=10).header.revision
            w.create(b"w/", b"w0")
            L.LeaseGrant(pb.LeaseGrantRequest(TTL=60, ID=31), timeout=10)
            L.LeaseGrant(pb.LeaseGrantRequest(TTL=2, ID=32), timeout=10)
            for key, lid in ((b"w/r2", 31), (b"w/r1", 31), (b"w/e2", 32), (b"w/e1", 32)):
                KV.Put(pb.PutRequest(key=key, value=b"v", lease=lid), timeout=10)
            L.LeaseRevoke(pb.LeaseRevokeRequest(ID=31), timeout=10)
            evs = w.events(8, timeout=10)
        return [(ev.type, ev.kv.key, ev.kv.mod_revision - base, ev.kv.lease) for _, ev in evs]
    finally:
        w.close()


def test_revoke_and_expiry_emit_delete_events(brain_factory, etcd_factory):
    brain = brain_factory()
    got = _lease_events(brain.endpoint)
    PUT, DELETE = 0, 1
    assert got == [
        (PUT, b"w/r2", 1, 31), (PUT, b"w/r1", 2, 31), (PUT, b"w/e2", 3, 32), (PUT, b"w/e1", 4, 32),
        # revoke: both keys in one revision, in key order
        (DELETE, b"w/r1", 5, 0), (DELETE, b"w/r2", 5, 0),
        # expiry: the same
        (DELETE, b"w/e1", 6, 0), (DELETE, b"w/e2", 6, 0),
    ]
    assert got == _lease_events(etcd_factory().endpoint)
