"""etcdctl (v3 API) against `python -m brain serve`.

Every command also runs against a real etcd when one is installed and the
outputs must match (ids and raft term masked); the explicit assertions keep
the tests meaningful without etcd.  Tests share one server pair per module
and use their own key prefixes; they run in file order, the compaction tests
last.
"""

from __future__ import annotations

import json

import pytest

from brain.etcd_version import ETCD_VERSION
from tests.integration.conftest import require_etcdctl, run_etcdctl
from tests.support.servers import BrainServer

pytestmark = pytest.mark.etcd

COMPACTED = "Error: etcdserver: mvcc: required revision has been compacted"
FUTURE = "Error: etcdserver: mvcc: required revision is a future revision"


def lines(text: str) -> list[str]:
    return text.splitlines()


def rev_of(ctl, key: str) -> int:
    r = ctl("get", key, "-w", "json")
    return json.loads(r.out)["header"]["revision"]


def mod_rev(ctl, key: str) -> int:
    r = ctl("get", key, "-w", "json")
    return json.loads(r.out)["kvs"][0]["mod_revision"]


def test_put_get(ctl):
    assert ctl("put", "pg/k", "v1").out == "OK\n"
    r = ctl("get", "pg/k")
    assert (r.rc, r.out) == (0, "pg/k\nv1\n")
    assert ctl("get", "pg/missing").out == ""
    assert ctl("put", "pg/k", "has spaces").out == "OK\n"
    assert ctl("get", "pg/k", "--print-value-only").out == "has spaces\n"


def test_put_prev_kv_and_ignore_value(ctl):
    ctl("put", "pp/k", "a")
    assert ctl("put", "pp/k", "b", "--prev-kv").out == "OK\npp/k\na\n"
    assert ctl("put", "pp/k", "--ignore-value", "--prev-kv").out == "OK\npp/k\nb\n"
    assert ctl("get", "pp/k", "--print-value-only").out == "b\n"
    r = ctl("put", "pp/none", "--ignore-value")
    assert (r.rc, r.err) == (1, "Error: etcdserver: key not found")


def test_get_prefix_limit_keys_only(ctl):
    for c in "edcba":
        ctl("put", f"gp/{c}", f"val-{c}")
    ctl("put", "gq", "outside")
    r = ctl("get", "gp/", "--prefix")
    assert lines(r.out) == [x for c in "abcde" for x in (f"gp/{c}", f"val-{c}")]
    assert lines(ctl("get", "gp/", "--prefix", "--limit", "2").out) == ["gp/a", "val-a", "gp/b", "val-b"]
    assert lines(ctl("get", "gp/", "--prefix", "--keys-only").out) == ["gp/a", "", "gp/b", "", "gp/c", "", "gp/d", "", "gp/e", ""]
    assert lines(ctl("get", "gp/", "--prefix", "--print-value-only").out) == [f"val-{c}" for c in "abcde"]
    # a range given as [key, range_end)
    assert lines(ctl("get", "gp/b", "gp/d", "--keys-only").out) == ["gp/b", "", "gp/c", ""]


def test_get_json_has_count_and_more(ctl):
    for i in range(5):
        ctl("put", f"gj/{i}", str(i))
    r = json.loads(ctl("get", "gj/", "--prefix", "--limit", "2", "-w", "json").out)
    assert r["count"] == 5 and r["more"] is True and len(r["kvs"]) == 2
    assert set(r["header"]) == {"cluster_id", "member_id", "revision", "raft_term"}
    ctl("get", "gj/", "--prefix", "-w", "fields")
    ctl("get", "gj/", "--prefix", "-w", "protobuf", compare=False)


def test_get_from_key(ctl):
    # "zz" sorts after every other test's keys
    for k in ("zz/a", "zz/b", "zz/c"):
        ctl("put", k, "x")
    assert lines(ctl("get", "zz/b", "--from-key", "--keys-only").out) == ["zz/b", "", "zz/c", ""]
    assert lines(ctl("get", "zz/", "--from-key", "--keys-only", "--limit", "1").out) == ["zz/a", ""]


def test_get_rev(ctl):
    ctl("put", "gr/k", "first")
    first = mod_rev(ctl, "gr/k")
    ctl("put", "gr/k", "second")
    ctl("del", "gr/k")
    assert ctl("get", "gr/k").out == ""
    assert ctl("get", "gr/k", f"--rev={first}").out == "gr/k\nfirst\n"
    assert ctl("get", "gr/k", f"--rev={first + 1}", "--print-value-only").out == "second\n"
    r = ctl("get", "gr/k", f"--rev={rev_of(ctl, 'gr/k') + 1000}")
    assert (r.rc, r.out, r.err) == (1, "", FUTURE)


def test_sort_by_and_order(ctl):
    # created in the order b, c, a; then b is written again (newest mod, version 2)
    ctl("put", "so/b", "2")
    ctl("put", "so/c", "3")
    ctl("put", "so/a", "9")
    ctl("put", "so/b", "1")

    def keys(*flags):
        return lines(ctl("get", "so/", "--prefix", "--keys-only", *flags).out)[::2]

    assert keys() == ["so/a", "so/b", "so/c"]
    assert keys("--order=DESCEND") == ["so/c", "so/b", "so/a"]
    assert keys("--sort-by=CREATE") == ["so/b", "so/c", "so/a"]
    assert keys("--sort-by=CREATE", "--order=DESCEND") == ["so/a", "so/c", "so/b"]
    assert keys("--sort-by=MODIFY") == ["so/c", "so/a", "so/b"]
    assert keys("--sort-by=VALUE") == ["so/b", "so/c", "so/a"]
    assert keys("--sort-by=VALUE", "--order=DESCEND") == ["so/a", "so/c", "so/b"]
    assert keys("--sort-by=VERSION", "--order=DESCEND")[0] == "so/b"
    assert keys("--sort-by=KEY", "--order=ASCEND", "--limit", "2") == ["so/a", "so/b"]


def test_del_prefix_and_prev_kv(ctl):
    for c in "abc":
        ctl("put", f"dp/{c}", c.upper())
    ctl("put", "dq", "keep")
    assert ctl("del", "dp/a").out == "1\n"
    assert ctl("del", "dp/a").out == "0\n"
    assert ctl("del", "dp/", "--prefix", "--prev-kv").out == "2\ndp/b\nB\ndp/c\nC\n"
    assert ctl("get", "dq", "--print-value-only").out == "keep\n"
    ctl("put", "dr/1", "x")
    ctl("put", "dr/2", "y")
    assert ctl("del", "dr/1", "dr/3").out == "2\n"
    assert ctl("del", "dz", "--from-key").out.endswith("\n")


def test_txn_success_and_failure(ctl):
    ctl("put", "tx/k1", "v1")
    ctl("put", "tx/k2", "v2")
    r = ctl("txn", stdin='value("tx/k1") = "v1"\n\nput tx/k3 "x y"\nget tx/k1\n\nget tx/k2\n\n')
    assert (r.rc, r.out) == (0, "SUCCESS\n\nOK\n\ntx/k1\nv1\n")
    r = ctl("txn", stdin='value("tx/k1") = "nope"\n\nput tx/k4 x\n\nget tx/k2\ndel tx/k9\n\n')
    assert r.out == "FAILURE\n\ntx/k2\nv2\n\n0\n"
    assert ctl("get", "tx/k3", "--print-value-only").out == "x y\n"
    assert ctl("get", "tx/k4").out == ""


def test_txn_compare_targets(ctl):
    ctl("put", "tc/k", "v")
    m = mod_rev(ctl, "tc/k")
    for cmp_, want in [
        (f'mod("tc/k") = "{m}"', "SUCCESS"),
        (f'mod("tc/k") > "{m}"', "FAILURE"),
        (f'mod("tc/k") < "{m + 1}"', "SUCCESS"),
        ('version("tc/k") = "1"', "SUCCESS"),
        ('version("tc/k") != "1"', "FAILURE"),
        (f'create("tc/k") = "{m}"', "SUCCESS"),
        ('create("tc/none") = "0"', "SUCCESS"),
        ('value("tc/k") > "a"', "SUCCESS"),
        ('value("tc/k") < "a"', "FAILURE"),
    ]:  # lease("k") compares make etcdctl 3.4 panic (bad value); see test_grpc_client
        r = ctl("txn", stdin=f"{cmp_}\n\n\n\n")
        assert lines(r.out)[:1] == [want], cmp_
    # several compares must all hold
    r = ctl("txn", stdin=f'version("tc/k") = "1"\nmod("tc/k") = "{m}"\nvalue("tc/k") = "w"\n\n\n\n')
    assert lines(r.out)[:1] == ["FAILURE"]


def test_txn_json(ctl):
    ctl("put", "tj/a", "1")
    r = ctl("txn", "-w", "json", stdin='value("tj/a") = "1"\n\nput tj/b 2\nget tj/a\ndel tj/zz\n\n\n')
    resp = json.loads(r.out)
    assert resp["succeeded"] is True
    kinds = [next(iter(op["Response"])) for op in resp["responses"]]
    assert kinds == ["ResponsePut", "ResponseRange", "ResponseDeleteRange"]
    # nested responses carry only the revision in their header
    assert resp["responses"][1]["Response"]["ResponseRange"]["header"] == {"revision": resp["header"]["revision"]}


def test_txn_too_many_ops(ctl):
    ops = "\n".join(f"put tm/{i} v" for i in range(129))
    r = ctl("txn", stdin=f"\n{ops}\n\n\n")
    assert (r.rc, r.err) == (1, "Error: etcdserver: too many operations in txn request")
    ops = "\n".join(f"put tm/{i} v" for i in range(128))
    assert ctl("txn", stdin=f"\n{ops}\n\n\n").out.startswith("SUCCESS")


def test_errors_printed_like_etcd(ctl):
    r = ctl("put", "", "v")
    assert (r.rc, r.err) == (1, "Error: etcdserver: key is not provided")
    r = ctl("put", "big", stdin=b"x" * 1600000)
    assert (r.rc, r.err) == (1, "Error: etcdserver: request is too large")
    assert ctl("put", "big", stdin=b"x" * 1500000).out == "OK\n"
    assert len(ctl("get", "big", "--print-value-only").out) == 1500001


def test_endpoint_health(ctl):
    r = ctl("endpoint", "health", compare=False)
    assert r.rc == 0, r.err
    assert "is healthy: successfully committed proposal" in r.err + r.out


def test_endpoint_status(ctl, servers):
    r = run_etcdctl(servers.brain.endpoint, "endpoint", "status", "-w", "json")
    assert r.rc == 0, r.err
    (status,) = json.loads(r.out)
    assert status["Endpoint"] == servers.brain.endpoint
    assert status["Status"]["version"] == ETCD_VERSION
    assert status["Status"]["header"]["revision"] >= 1 and status["Status"]["dbSize"] > 0


def test_endpoint_status_cluster(ctl, servers):
    """`--cluster` dials every member's advertised client URL; etcdctl 3.4
    sends that URL ("http://127.0.0.1:port") as the HTTP/2 authority, which
    the transport must accept (etcd does)."""
    r = run_etcdctl(servers.brain.endpoint, "endpoint", "status", "--cluster", "-w", "json")
    assert r.rc == 0, r.err
    (status,) = json.loads(r.out)
    members = json.loads(run_etcdctl(servers.brain.endpoint, "member", "list", "-w", "json").out)["members"]
    assert status["Endpoint"] == members[0]["clientURLs"][0]
    assert status["Status"]["leader"] == status["Status"]["header"]["member_id"]
    r = run_etcdctl(servers.brain.endpoint, "endpoint", "health", "--cluster")
    assert r.rc == 0 and "is healthy" in r.err + r.out, r.err


# --- compaction: last, because it makes old revisions unreadable -----------


def test_compaction_and_compacted_errors(ctl):
    ctl("put", "cp/k", "old")
    old = mod_rev(ctl, "cp/k")
    ctl("put", "cp/k", "new")
    ctl("put", "cp/other", "1")
    ctl("put", "cp/other", "2")
    now = rev_of(ctl, "cp/k")
    assert ctl("get", "cp/k", f"--rev={old}").out == "cp/k\nold\n"
    assert ctl("compaction", str(old + 1)).out == f"compacted revision {old + 1}\n"
    r = ctl("get", "cp/k", f"--rev={old}")
    assert (r.rc, r.out, r.err) == (1, "", COMPACTED)
    # the compacted revision itself stays readable
    assert ctl("get", "cp/k", f"--rev={old + 1}", "--print-value-only").out == "new\n"
    r = ctl("compaction", str(old + 1))
    assert (r.rc, r.err) == (1, COMPACTED)
    r = ctl("compaction", str(now + 100))
    assert (r.rc, r.err) == (1, FUTURE)
    r = ctl("compaction", "--physical", str(now))
    assert (r.rc, r.out, r.err) == (0, f"compacted revision {now}\n", "")
    assert ctl("get", "cp/k", "--print-value-only").out == "new\n"
    r = ctl("get", "cp/k", f"--rev={now - 1}")
    assert r.err == COMPACTED


def test_unix_socket_endpoint(tmp_path):
    require_etcdctl()
    sock = tmp_path / "brain.sock"
    srv = BrainServer(shards=1)
    srv.extra_args = ["--listen-client-urls", f"{srv.client_url},unix://{sock}"]
    try:
        srv.start()
        ep = f"unix://{sock}"
        assert run_etcdctl(ep, "put", "u", "over-unix").out == "OK\n"
        assert run_etcdctl(srv.endpoint, "get", "u", "--print-value-only").out == "over-unix\n"
        assert run_etcdctl(ep, "get", "u").out == "u\nover-unix\n"
    finally:
        srv.cleanup()
    assert not sock.exists()
