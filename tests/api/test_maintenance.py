"""Maintenance and Cluster services, the gRPC call counters and the metrics /
health endpoints, in process: a real engine behind a real gRPC server.

Where etcd's answer is fixed text (errors, alarm strings) it is checked
against a real etcd when one is installed."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.api.server import ApiServer
from brain.config import ServerConfig
from brain.engine import Engine, EngineConfig
from brain.migrate import snapshot as snaps
from brain.etcd_version import ETCD_VERSION, STORAGE_VERSION
from brain.metrics import MetricsServer
from brain.mvcc import errors
from brain.mvcc.requests import PutRequest
from tests.support.servers import free_port, require_etcd, start_etcd

pytestmark = pytest.mark.timeout(120)

NOSPACE, CORRUPT = 1, 2


class Client:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.m = rpc_pb2_grpc.MaintenanceStub(self.channel)
        self.cluster = rpc_pb2_grpc.ClusterStub(self.channel)

    def err(self, fn, *args) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as e:
            fn(*args, timeout=10)
        return e.value.code(), e.value.details()


@pytest.fixture
def engine(tmp_path):
    eng = Engine.open(EngineConfig(str(tmp_path / "data"), shards=3, shard_boundaries=[b"f", b"p"],
                                   quota_backend_bytes=1 << 30))
    yield eng
    eng.close()


@pytest.fixture
def api(engine):
    srv = ApiServer(engine, ServerConfig(name="m1", data_dir=engine.config.data_dir,
                                         listen_client_urls=["http://127.0.0.1:0"]))
    srv.start()
    yield srv
    srv.stop(None)


@pytest.fixture
def client(api):
    c = Client(api.endpoints[0][len("http://"):])
    yield c
    c.channel.close()


@pytest.fixture(scope="module")
def etcd():
    require_etcd()  # the comparisons are the point: a failure under CI, a listed skip elsewhere
    srv = start_etcd()
    c = Client(srv.endpoint)
    yield c
    c.channel.close()
    srv.cleanup()


def put(client, key: bytes, value: bytes = b"v") -> int:
    return client.kv.Put(pb.PutRequest(key=key, value=value)).header.revision


# ---------------------------------------------------------------------------
# Status, Hash, HashKV


def test_status(client, engine):
    put(client, b"a")
    st = client.m.Status(pb.StatusRequest())
    assert st.version == ETCD_VERSION and st.version.startswith("3.7.")  # the version brain behaves as
    assert st.leader == engine.member_id == st.header.member_id
    assert st.header.cluster_id == engine.cluster_id and st.header.revision == 2
    assert st.raftIndex == st.raftAppliedIndex == 2 and st.raftTerm == engine.term == st.header.raft_term
    assert st.storageVersion == STORAGE_VERSION and not st.isLearner
    assert st.dbSizeQuota == 1 << 30
    assert st.dbSize >= st.dbSizeInUse > 0
    assert st.HasField("downgradeInfo") and not st.downgradeInfo.enabled
    assert list(st.errors) == []
    put(client, b"b")
    st2 = client.m.Status(pb.StatusRequest())
    assert st2.raftIndex == 3  # monotonic with the revision


def test_hashkv_and_hash(client, engine):
    for i in range(5):
        put(client, b"k%d" % i)
    h = client.m.HashKV(pb.HashKVRequest())
    assert (h.header.revision, h.hash_revision, h.compact_revision) == (6, 6, -1)
    assert h.hash == snaps.hash_kv(engine).hash
    assert client.m.HashKV(pb.HashKVRequest(revision=3)).hash_revision == 3
    assert client.m.HashKV(pb.HashKVRequest(revision=3)).hash != h.hash
    client.kv.Compact(pb.CompactionRequest(revision=4))
    h4 = client.m.HashKV(pb.HashKVRequest(revision=4))
    assert (h4.compact_revision, h4.hash_revision) == (4, 4)
    whole = client.m.Hash(pb.HashRequest())
    assert whole.header.revision == 6 and whole.hash == snaps.hash_all(engine)[0]


def test_hashkv_errors_match_etcd(client, etcd):
    for i in range(5):
        put(client, b"k%d" % i)
    client.kv.Compact(pb.CompactionRequest(revision=4))
    got = [client.err(client.m.HashKV, pb.HashKVRequest(revision=r)) for r in (3, 100)]
    assert got == [
        (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"),
        (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision"),
    ]
    assert etcd.err(etcd.m.HashKV, pb.HashKVRequest(revision=10**6)) == got[1]


# ---------------------------------------------------------------------------
# Alarm


def test_alarms(client, engine, etcd):
    me = engine.member_id
    assert list(client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET)).alarms) == []
    r = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=me, alarm=NOSPACE))
    assert [(a.memberID, a.alarm) for a in r.alarms] == [(me, NOSPACE)]
    assert r.header.member_id == me
    # activating again answers the alarm already raised
    r = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=me, alarm=NOSPACE))
    assert [(a.memberID, a.alarm) for a in r.alarms] == [(me, NOSPACE)]
    # NONE is not an alarm (etcd 3.6)
    assert list(client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=me)).alarms) == []
    client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=77, alarm=CORRUPT))
    everything = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET))
    assert sorted((a.memberID, a.alarm) for a in everything.alarms) == sorted([(me, NOSPACE), (77, CORRUPT)])
    only = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET, alarm=CORRUPT))
    assert [(a.memberID, a.alarm) for a in only.alarms] == [(77, CORRUPT)]
    st = client.m.Status(pb.StatusRequest())
    assert sorted(st.errors) == sorted([f"memberID:{me} alarm:NOSPACE ", "memberID:77 alarm:CORRUPT "])
    # CORRUPT refuses writes with etcd's text; reads go on
    assert client.err(client.kv.Put, pb.PutRequest(key=b"x", value=b"y")) == (
        grpc.StatusCode.DATA_LOSS, "etcdserver: corrupt cluster")
    client.kv.Range(pb.RangeRequest(key=b"x"))
    eid = etcd.m.Status(pb.StatusRequest()).leader
    etcd.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=eid, alarm=NOSPACE))
    etcd.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=77, alarm=CORRUPT))
    try:
        est = etcd.m.Status(pb.StatusRequest())
        assert sorted(est.errors) == sorted([f"memberID:{eid} alarm:NOSPACE ", "memberID:77 alarm:CORRUPT "])
        assert etcd.err(etcd.kv.Put, pb.PutRequest(key=b"x", value=b"y")) == (
            grpc.StatusCode.DATA_LOSS, "etcdserver: corrupt cluster")
    finally:
        etcd.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=77, alarm=CORRUPT))
        etcd.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=eid, alarm=NOSPACE))
    r = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=77, alarm=CORRUPT))
    assert [(a.memberID, a.alarm) for a in r.alarms] == [(77, CORRUPT)]
    r = client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=77, alarm=CORRUPT))
    assert list(r.alarms) == []
    assert client.err(client.kv.Put, pb.PutRequest(key=b"x", value=b"y")) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
    client.m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=me, alarm=NOSPACE))
    put(client, b"x")


# ---------------------------------------------------------------------------
# Defragment, MoveLeader, Downgrade


def test_defragment_checkpoints(client, engine):
    put(client, b"a")
    assert engine.statistics().journal_bytes_since_checkpoint > 0
    resp = client.m.Defragment(pb.DefragmentRequest())
    assert not resp.HasField("header")  # etcd answers an empty message
    assert engine.statistics().journal_bytes_since_checkpoint == 0


def test_move_leader_matches_etcd(client, engine, etcd):
    assert client.m.MoveLeader(pb.MoveLeaderRequest(targetID=engine.member_id)) == pb.MoveLeaderResponse()
    got = client.err(client.m.MoveLeader, pb.MoveLeaderRequest(targetID=12345))
    assert got == (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
    leader = etcd.m.Status(pb.StatusRequest()).leader
    assert etcd.m.MoveLeader(pb.MoveLeaderRequest(targetID=leader)) == pb.MoveLeaderResponse()
    assert etcd.err(etcd.m.MoveLeader, pb.MoveLeaderRequest(targetID=12345)) == got


def test_downgrade_is_refused(client):
    D = pb.DowngradeRequest
    assert client.err(client.m.Downgrade, D(action=D.VALIDATE, version="3.5")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid downgrade target version")
    assert client.err(client.m.Downgrade, D(action=D.ENABLE, version="three")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: wrong downgrade target version format")
    assert client.err(client.m.Downgrade, D(action=D.CANCEL)) == (
        grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: no inflight downgrade job")


# ---------------------------------------------------------------------------
# Snapshot


def test_snapshot_stream_is_etcd_shaped_and_restorable(client, engine, tmp_path):
    for i in range(3000):  # more than one 32 KiB blob
        engine.put(PutRequest(b"key/%05d" % i, b"x" * 20))
    msgs = list(client.m.Snapshot(pb.SnapshotRequest(), timeout=60))
    assert len(msgs) >= 3
    data = b"".join(m.blob for m in msgs[:-1])
    assert all(m.version == STORAGE_VERSION for m in msgs)
    assert [m.remaining_bytes for m in msgs[:-1]] == sorted((m.remaining_bytes for m in msgs[:-1]), reverse=True)
    assert msgs[-2].remaining_bytes == 0 and msgs[-1].remaining_bytes == 0
    assert msgs[0].remaining_bytes + len(msgs[0].blob) == len(data)
    assert all(len(m.blob) == 32 * 1024 for m in msgs[:-2])
    assert len(data) % 512 == 0 and msgs[-1].blob == hashlib.sha256(data).digest()
    path = tmp_path / "snap.db"
    path.write_bytes(data + msgs[-1].blob)
    st = snaps.status(str(path))
    assert (st.format, st.revision, st.total_keys) == ("etcd", engine.committed_rev, 3000)
    res = snaps.restore(str(path), str(tmp_path / "restored"), shards=1, boundaries=[])
    assert (res.revision, res.keys) == (engine.committed_rev, 3000)
    # nothing is left behind in the data directory
    assert not [n for n in os.listdir(engine.config.data_dir) if "tmp" in n]


# ---------------------------------------------------------------------------
# Cluster


def test_member_list_and_membership_changes(api, client, engine, etcd):
    r = client.cluster.MemberList(pb.MemberListRequest())
    assert (r.header.cluster_id, r.header.member_id, r.header.raft_term, r.header.revision) == (
        engine.cluster_id, engine.member_id, engine.term, 0)
    assert len(r.members) == 1
    m = r.members[0]
    assert (m.ID, m.name, list(m.clientURLs), list(m.peerURLs), m.isLearner) == (
        engine.member_id, "m1", api.endpoints, [], False)
    me = engine.member_id
    fixed = (grpc.StatusCode.FAILED_PRECONDITION, "brain: membership changes are not supported (single member)")
    not_found = (grpc.StatusCode.NOT_FOUND, "etcdserver: member not found")
    assert client.err(client.cluster.MemberAdd, pb.MemberAddRequest(peerURLs=["http://10.0.0.1:2380"])) == fixed
    assert client.err(client.cluster.MemberRemove, pb.MemberRemoveRequest(ID=me)) == fixed
    assert client.err(client.cluster.MemberRemove, pb.MemberRemoveRequest(ID=42)) == not_found
    assert client.err(client.cluster.MemberUpdate, pb.MemberUpdateRequest(ID=me, peerURLs=["http://x:1"])) == fixed
    assert client.err(client.cluster.MemberUpdate, pb.MemberUpdateRequest(ID=42, peerURLs=["http://x:1"])) == \
        not_found
    promote = client.err(client.cluster.MemberPromote, pb.MemberPromoteRequest(ID=me))
    assert promote == (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: can only promote a learner member")
    assert client.err(client.cluster.MemberPromote, pb.MemberPromoteRequest(ID=42)) == not_found
    eid = etcd.m.Status(pb.StatusRequest()).leader
    assert etcd.err(etcd.cluster.MemberRemove, pb.MemberRemoveRequest(ID=42)) == not_found
    assert etcd.err(etcd.cluster.MemberPromote, pb.MemberPromoteRequest(ID=eid)) == promote
    assert etcd.err(etcd.cluster.MemberPromote, pb.MemberPromoteRequest(ID=42)) == not_found


def test_member_list_advertises_the_advertised_urls(engine):
    srv = ApiServer(engine, ServerConfig(name="adv", data_dir=engine.config.data_dir,
                                         listen_client_urls=["http://127.0.0.1:0"],
                                         advertise_client_urls=["https://brain.example:2379"]))
    srv.start()
    try:
        c = Client(srv.endpoints[0][len("http://"):])
        members = c.cluster.MemberList(pb.MemberListRequest()).members
        assert [list(m.clientURLs) for m in members] == [["https://brain.example:2379"]]
        c.channel.close()
    finally:
        srv.stop(None)


# ---------------------------------------------------------------------------
# metrics and health


@pytest.fixture
def metrics(api, engine):
    port = free_port()
    ms = MetricsServer(engine, [f"http://127.0.0.1:{port}"], grpc_stats=api.grpc_stats)
    ms.start()
    yield ms.endpoints[0]
    ms.stop()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def scrape(url: str) -> dict[str, list]:
    status, ctype, text = get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    for lab, v in samples.get(name, []):
        if all(lab.get(k) == w for k, w in labels.items()):
            return v
    raise KeyError((name, labels))


def test_metrics(metrics, client, engine):
    for i in range(25):
        put(client, b"m/%d" % i)
    client.kv.DeleteRange(pb.DeleteRangeRequest(key=b"m/0"))
    client.err(client.cluster.MemberRemove, pb.MemberRemoveRequest(ID=42))
    engine.checkpoint()
    s = scrape(metrics)
    assert value(s, "etcd_debugging_mvcc_keys_total") == 24
    assert value(s, "etcd_debugging_mvcc_current_revision") == engine.committed_rev
    assert value(s, "etcd_debugging_mvcc_compact_revision") == -1
    assert value(s, "etcd_disk_wal_fsync_duration_seconds_count") >= 26
    assert value(s, "etcd_disk_wal_fsync_duration_seconds_bucket", le="+Inf") >= 26
    assert value(s, "etcd_disk_backend_commit_duration_seconds_count") >= 1
    total, in_use = value(s, "etcd_mvcc_db_total_size_in_bytes"), value(s, "etcd_mvcc_db_total_size_in_use_in_bytes")
    assert total >= in_use > 0
    st = client.m.Status(pb.StatusRequest())
    assert (st.dbSize, st.dbSizeInUse) == (total, in_use)
    assert value(s, "etcd_server_quota_backend_bytes") == 1 << 30
    assert value(s, "etcd_server_has_leader") == 1 and value(s, "etcd_server_is_leader") == 1
    assert value(s, "etcd_server_version", server_version=ETCD_VERSION) == 1
    assert value(s, "etcd_server_id", server_id=f"{engine.member_id:x}") == 1
    assert value(s, "etcd_debugging_mvcc_watcher_total") >= 0
    assert value(s, "etcd_debugging_mvcc_slow_watcher_total") >= 0
    assert value(s, "brain_engine_requests_total") >= 26
    assert value(s, "brain_checkpoints_total") >= 1
    grpc_labels = dict(grpc_type="unary", grpc_service="etcdserverpb.KV", grpc_method="Put")
    assert value(s, "grpc_server_started_total", **grpc_labels) == 25
    assert value(s, "grpc_server_handled_total", grpc_code="OK", **grpc_labels) == 25
    assert value(s, "grpc_server_handled_total", grpc_code="NotFound", grpc_method="MemberRemove") == 1
    assert value(s, "grpc_server_msg_received_total", **grpc_labels) == 25
    assert any(name.startswith("process_") for name in s)


def test_health_endpoints(metrics, client, engine):
    status, _ctype, body = get(metrics + "/health")
    assert (status, json.loads(body)) == (200, {"health": "true", "reason": ""})
    assert get(metrics + "/livez")[::2] == (200, "ok\n")
    status, _ctype, body = get(metrics + "/readyz?verbose")
    assert status == 200 and "[+]serializable_read ok\n" in body and body.endswith("ok\n")
    engine.alarm_activate(engine.member_id, NOSPACE)
    status, _ctype, body = get(metrics + "/health")
    assert (status, json.loads(body)) == (503, {"health": "false", "reason": "ALARM NOSPACE"})
    assert get(metrics + "/health?exclude=NOSPACE")[0] == 200
    assert get(metrics + "/readyz")[0] == 200  # only CORRUPT makes etcd not ready
    engine.alarm_activate(9, CORRUPT)
    status, _ctype, body = get(metrics + "/readyz")
    assert status == 503 and "[-]data_corruption failed: alarm activated: CORRUPT" in body
    assert get(metrics + "/readyz/serializable_read")[0] == 200
    engine.alarm_deactivate(9, CORRUPT)
    engine.alarm_deactivate(engine.member_id, NOSPACE)
    assert get(metrics + "/health")[0] == 200
    assert get(metrics + "/nope")[0] == 404
    req = urllib.request.Request(metrics + "/health", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and e.value.headers["Allow"] == "GET"


def test_health_reports_a_failed_engine(metrics, engine):
    engine.committer.fail(errors.ErrStopped, "journal write failed: test")  # as a failed fdatasync leaves it
    status, _ctype, body = get(metrics + "/health")
    assert status == 503 and json.loads(body)["reason"].startswith("ENGINE FAILED:")
    assert get(metrics + "/readyz")[0] == 503
