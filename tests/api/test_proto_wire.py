"""Wire-compatibility checks against the etcd v3.6 API.

Expected bytes are worked out by hand from the protobuf encoding rules
(tag = field_number << 3 | wire_type; wire type 0 = varint, 2 = length
delimited), using etcd's field numbers. If one of these fails, a field
number or type in proto/ has drifted from etcd.
"""

from __future__ import annotations

import pytest

from brain.api.pb.authpb import auth_pb2
from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from brain.api.pb.mvccpb import kv_pb2


def enc(msg) -> bytes:
    return msg.SerializeToString(deterministic=True)


# --- exact encodings --------------------------------------------------------


def test_response_header():
    h = rpc_pb2.ResponseHeader(cluster_id=1, member_id=2, revision=3, raft_term=4)
    assert enc(h) == b"\x08\x01\x10\x02\x18\x03\x20\x04"


def test_range_request_basic():
    req = rpc_pb2.RangeRequest(key=b"a", range_end=b"b", limit=5, revision=7, count_only=True)
    assert enc(req) == (
        b"\x0a\x01a"  # 1 key
        b"\x12\x01b"  # 2 range_end
        b"\x18\x05"  # 3 limit
        b"\x20\x07"  # 4 revision
        b"\x48\x01"  # 9 count_only
    )


def test_range_request_all_scalar_fields():
    req = rpc_pb2.RangeRequest(
        sort_order=rpc_pb2.RangeRequest.DESCEND,
        sort_target=rpc_pb2.RangeRequest.MOD,
        serializable=True,
        keys_only=True,
        min_mod_revision=1,
        max_mod_revision=2,
        min_create_revision=3,
        max_create_revision=4,
    )
    assert enc(req) == (
        b"\x28\x02"  # 5 sort_order = DESCEND(2)
        b"\x30\x03"  # 6 sort_target = MOD(3)
        b"\x38\x01"  # 7 serializable
        b"\x40\x01"  # 8 keys_only
        b"\x50\x01"  # 10 min_mod_revision
        b"\x58\x02"  # 11 max_mod_revision
        b"\x60\x03"  # 12 min_create_revision
        b"\x68\x04"  # 13 max_create_revision
    )


def test_range_request_negative_revision_is_ten_byte_varint():
    assert enc(rpc_pb2.RangeRequest(revision=-1)) == b"\x20" + b"\xff" * 9 + b"\x01"


def test_sort_enums():
    R = rpc_pb2.RangeRequest
    assert (R.NONE, R.ASCEND, R.DESCEND) == (0, 1, 2)
    assert (R.KEY, R.VERSION, R.CREATE, R.MOD, R.VALUE) == (0, 1, 2, 3, 4)


def test_range_response():
    resp = rpc_pb2.RangeResponse(
        header=rpc_pb2.ResponseHeader(revision=9),
        kvs=[kv_pb2.KeyValue(key=b"k", create_revision=2, mod_revision=3, version=4, value=b"v", lease=6)],
        more=True,
        count=1,
    )
    kv = b"\x0a\x01k\x10\x02\x18\x03\x20\x04\x2a\x01v\x30\x06"
    assert enc(resp) == b"\x0a\x02\x18\x09" + b"\x12" + bytes([len(kv)]) + kv + b"\x18\x01\x20\x01"


def test_put_request():
    req = rpc_pb2.PutRequest(key=b"k", value=b"v", lease=9, prev_kv=True, ignore_value=True, ignore_lease=True)
    assert enc(req) == b"\x0a\x01k\x12\x01v\x18\x09\x20\x01\x28\x01\x30\x01"


def test_delete_range():
    assert enc(rpc_pb2.DeleteRangeRequest(key=b"a", range_end=b"\x00", prev_kv=True)) == (
        b"\x0a\x01a\x12\x01\x00\x18\x01"
    )
    resp = rpc_pb2.DeleteRangeResponse(deleted=2, prev_kvs=[kv_pb2.KeyValue(key=b"a")])
    assert enc(resp) == b"\x10\x02\x1a\x03\x0a\x01a"


def test_compare_with_range_end_field_64():
    cmp = rpc_pb2.Compare(
        result=rpc_pb2.Compare.NOT_EQUAL,
        target=rpc_pb2.Compare.VALUE,
        key=b"k",
        value=b"v",
        range_end=b"z",
    )
    assert enc(cmp) == (
        b"\x08\x03"  # 1 result = NOT_EQUAL(3)
        b"\x10\x03"  # 2 target = VALUE(3)
        b"\x1a\x01k"  # 3 key
        b"\x3a\x01v"  # 7 value (target_union)
        b"\x82\x04\x01z"  # 64 range_end: tag 64<<3|2 = 514 = varint 82 04
    )


@pytest.mark.parametrize(
    "field, tag",
    [("version", 0x20), ("create_revision", 0x28), ("mod_revision", 0x30), ("lease", 0x40)],
)
def test_compare_target_union_int_members(field, tag):
    cmp = rpc_pb2.Compare(**{field: 5})
    assert cmp.WhichOneof("target_union") == field
    assert enc(cmp) == bytes([tag, 5])


def test_compare_enums():
    C = rpc_pb2.Compare
    assert (C.EQUAL, C.GREATER, C.LESS, C.NOT_EQUAL) == (0, 1, 2, 3)
    assert (C.VERSION, C.CREATE, C.MOD, C.VALUE, C.LEASE) == (0, 1, 2, 3, 4)


def test_txn_request_and_ops():
    txn = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"k")],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"k"))],
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k"))],
    )
    assert enc(txn) == (
        b"\x0a\x03\x1a\x01k"  # 1 compare { 3 key }
        b"\x12\x05\x12\x03\x0a\x01k"  # 2 success { 2 request_put { 1 key } }
        b"\x1a\x05\x0a\x03\x0a\x01k"  # 3 failure { 1 request_range { 1 key } }
    )
    assert enc(rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest())) == b"\x1a\x00"
    assert enc(rpc_pb2.RequestOp(request_txn=rpc_pb2.TxnRequest())) == b"\x22\x00"
    resp = rpc_pb2.TxnResponse(
        succeeded=True,
        responses=[rpc_pb2.ResponseOp(response_txn=rpc_pb2.TxnResponse())],
    )
    assert enc(resp) == b"\x10\x01\x1a\x02\x22\x00"
    assert enc(rpc_pb2.ResponseOp(response_delete_range=rpc_pb2.DeleteRangeResponse(deleted=1))) == (
        b"\x1a\x02\x10\x01"
    )


def test_compaction_request():
    assert enc(rpc_pb2.CompactionRequest(revision=300, physical=True)) == b"\x08\xac\x02\x10\x01"


def test_watch_request_oneof_tags():
    assert enc(rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())) == b"\x1a\x00"
    assert enc(rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=5))) == b"\x12\x02\x08\x05"
    create = rpc_pb2.WatchCreateRequest(
        key=b"a",
        range_end=b"b",
        start_revision=3,
        progress_notify=True,
        filters=[rpc_pb2.WatchCreateRequest.NOPUT, rpc_pb2.WatchCreateRequest.NODELETE],
        prev_kv=True,
        watch_id=7,
        fragment=True,
    )
    body = (
        b"\x0a\x01a"  # 1 key
        b"\x12\x01b"  # 2 range_end
        b"\x18\x03"  # 3 start_revision
        b"\x20\x01"  # 4 progress_notify
        b"\x2a\x02\x00\x01"  # 5 filters, packed [NOPUT=0, NODELETE=1]
        b"\x30\x01"  # 6 prev_kv
        b"\x38\x07"  # 7 watch_id
        b"\x40\x01"  # 8 fragment
    )
    assert enc(rpc_pb2.WatchRequest(create_request=create)) == b"\x0a" + bytes([len(body)]) + body


def test_watch_create_accepts_unpacked_filters():
    # Older encoders may send repeated enums unpacked; both forms must parse.
    req = rpc_pb2.WatchCreateRequest.FromString(b"\x28\x01\x28\x00")
    assert list(req.filters) == [1, 0]


def test_watch_response():
    resp = rpc_pb2.WatchResponse(
        watch_id=1,
        created=True,
        canceled=True,
        compact_revision=4,
        cancel_reason="x",
        fragment=True,
        events=[kv_pb2.Event(type=kv_pb2.Event.DELETE, kv=kv_pb2.KeyValue(key=b"a"))],
    )
    assert enc(resp) == (
        b"\x10\x01"  # 2 watch_id
        b"\x18\x01"  # 3 created
        b"\x20\x01"  # 4 canceled
        b"\x28\x04"  # 5 compact_revision
        b"\x32\x01x"  # 6 cancel_reason
        b"\x38\x01"  # 7 fragment
        b"\x5a\x07\x08\x01\x12\x03\x0a\x01a"  # 11 events { type=DELETE, kv { key } }
    )


def test_event():
    assert (kv_pb2.Event.PUT, kv_pb2.Event.DELETE) == (0, 1)
    ev = kv_pb2.Event(type=kv_pb2.Event.PUT, prev_kv=kv_pb2.KeyValue(value=b"v"))
    assert enc(ev) == b"\x1a\x03\x2a\x01v"


def test_lease_messages():
    assert enc(rpc_pb2.LeaseGrantRequest(TTL=10, ID=2)) == b"\x08\x0a\x10\x02"
    assert enc(rpc_pb2.LeaseGrantResponse(ID=2, TTL=10, error="e")) == b"\x10\x02\x18\x0a\x22\x01e"
    assert enc(rpc_pb2.LeaseRevokeRequest(ID=3)) == b"\x08\x03"
    assert enc(rpc_pb2.LeaseKeepAliveRequest(ID=3)) == b"\x08\x03"
    assert enc(rpc_pb2.LeaseKeepAliveResponse(ID=3, TTL=5)) == b"\x10\x03\x18\x05"
    assert enc(rpc_pb2.LeaseTimeToLiveRequest(ID=1, keys=True)) == b"\x08\x01\x10\x01"
    assert enc(rpc_pb2.LeaseTimeToLiveResponse(ID=1, TTL=-1, grantedTTL=9, keys=[b"a", b"b"])) == (
        b"\x10\x01\x18" + b"\xff" * 9 + b"\x01\x20\x09\x2a\x01a\x2a\x01b"
    )
    assert enc(rpc_pb2.LeaseLeasesResponse(leases=[rpc_pb2.LeaseStatus(ID=4)])) == b"\x12\x02\x08\x04"
    assert enc(rpc_pb2.LeaseCheckpoint(ID=1, remaining_TTL=2)) == b"\x08\x01\x10\x02"


def test_member_messages():
    m = rpc_pb2.Member(ID=1, name="n", peerURLs=["p"], clientURLs=["c"], isLearner=True)
    member = b"\x08\x01\x12\x01n\x1a\x01p\x22\x01c\x28\x01"
    assert enc(m) == member
    assert enc(rpc_pb2.MemberAddRequest(peerURLs=["p"], isLearner=True)) == b"\x0a\x01p\x10\x01"
    assert enc(rpc_pb2.MemberAddResponse(member=m, members=[m])) == (
        b"\x12\x0d" + member + b"\x1a\x0d" + member
    )
    assert enc(rpc_pb2.MemberRemoveRequest(ID=2)) == b"\x08\x02"
    assert enc(rpc_pb2.MemberUpdateRequest(ID=2, peerURLs=["p"])) == b"\x08\x02\x12\x01p"
    assert enc(rpc_pb2.MemberListRequest(linearizable=True)) == b"\x08\x01"
    assert enc(rpc_pb2.MemberListResponse(members=[rpc_pb2.Member(ID=1)])) == b"\x12\x02\x08\x01"
    assert enc(rpc_pb2.MemberPromoteRequest(ID=2)) == b"\x08\x02"


def test_alarm_messages():
    assert (rpc_pb2.NONE, rpc_pb2.NOSPACE, rpc_pb2.CORRUPT) == (0, 1, 2)
    A = rpc_pb2.AlarmRequest
    assert (A.GET, A.ACTIVATE, A.DEACTIVATE) == (0, 1, 2)
    assert enc(A(action=A.DEACTIVATE, memberID=5, alarm=rpc_pb2.NOSPACE)) == b"\x08\x02\x10\x05\x18\x01"
    resp = rpc_pb2.AlarmResponse(alarms=[rpc_pb2.AlarmMember(memberID=5, alarm=rpc_pb2.CORRUPT)])
    assert enc(resp) == b"\x12\x04\x08\x05\x10\x02"


def test_status_response_field_numbers():
    assert enc(rpc_pb2.StatusResponse(dbSizeInUse=300)) == b"\x48\xac\x02"  # 9
    resp = rpc_pb2.StatusResponse(
        version="3.6.0",
        dbSize=1,
        leader=2,
        raftIndex=3,
        raftTerm=4,
        raftAppliedIndex=5,
        errors=["e"],
        dbSizeInUse=6,
        isLearner=True,
        storageVersion="3.6",
        dbSizeQuota=7,
        downgradeInfo=rpc_pb2.DowngradeInfo(enabled=True, targetVersion="3.5"),
    )
    assert enc(resp) == (
        b"\x12\x053.6.0"  # 2 version
        b"\x18\x01"  # 3 dbSize
        b"\x20\x02"  # 4 leader
        b"\x28\x03"  # 5 raftIndex
        b"\x30\x04"  # 6 raftTerm
        b"\x38\x05"  # 7 raftAppliedIndex
        b"\x42\x01e"  # 8 errors
        b"\x48\x06"  # 9 dbSizeInUse
        b"\x50\x01"  # 10 isLearner
        b"\x5a\x033.6"  # 11 storageVersion
        b"\x60\x07"  # 12 dbSizeQuota
        b"\x6a\x07\x08\x01\x12\x033.5"  # 13 downgradeInfo { enabled, targetVersion }
    )


def test_hash_and_snapshot():
    assert enc(rpc_pb2.HashKVRequest(revision=3)) == b"\x08\x03"
    assert enc(rpc_pb2.HashKVResponse(hash=1, compact_revision=2, hash_revision=3)) == b"\x10\x01\x18\x02\x20\x03"
    assert enc(rpc_pb2.HashResponse(hash=1)) == b"\x10\x01"
    assert enc(rpc_pb2.SnapshotResponse(remaining_bytes=1, blob=b"x", version="3.6.0")) == (
        b"\x10\x01\x1a\x01x\x22\x053.6.0"
    )


def test_move_leader_and_downgrade():
    assert enc(rpc_pb2.MoveLeaderRequest(targetID=7)) == b"\x08\x07"
    D = rpc_pb2.DowngradeRequest
    assert (D.VALIDATE, D.ENABLE, D.CANCEL) == (0, 1, 2)
    assert enc(D(action=D.CANCEL, version="3.5")) == b"\x08\x02\x12\x033.5"
    assert enc(rpc_pb2.DowngradeResponse(version="3.6")) == b"\x12\x033.6"


def test_auth_messages():
    assert enc(rpc_pb2.AuthenticateRequest(name="u", password="p")) == b"\x0a\x01u\x12\x01p"
    assert enc(rpc_pb2.AuthenticateResponse(token="t")) == b"\x12\x01t"
    req = rpc_pb2.AuthUserAddRequest(
        name="u", password="p", options=auth_pb2.UserAddOptions(no_password=True), hashedPassword="h"
    )
    assert enc(req) == b"\x0a\x01u\x12\x01p\x1a\x02\x08\x01\x22\x01h"
    assert enc(rpc_pb2.AuthUserChangePasswordRequest(name="u", password="p", hashedPassword="h")) == (
        b"\x0a\x01u\x12\x01p\x1a\x01h"
    )
    assert enc(rpc_pb2.AuthUserGrantRoleRequest(user="u", role="r")) == b"\x0a\x01u\x12\x01r"
    assert enc(rpc_pb2.AuthUserRevokeRoleRequest(name="u", role="r")) == b"\x0a\x01u\x12\x01r"
    assert enc(rpc_pb2.AuthRoleGetRequest(role="r")) == b"\x0a\x01r"
    perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"a", range_end=b"b")
    assert enc(perm) == b"\x08\x02\x12\x01a\x1a\x01b"
    assert enc(rpc_pb2.AuthRoleGrantPermissionRequest(name="r", perm=perm)) == (
        b"\x0a\x01r\x12\x08\x08\x02\x12\x01a\x1a\x01b"
    )
    assert enc(rpc_pb2.AuthRoleRevokePermissionRequest(role="r", key=b"a", range_end=b"b")) == (
        b"\x0a\x01r\x12\x01a\x1a\x01b"
    )
    assert enc(rpc_pb2.AuthStatusResponse(enabled=True, authRevision=3)) == b"\x10\x01\x18\x03"
    assert enc(rpc_pb2.AuthRoleGetResponse(perm=[auth_pb2.Permission()])) == b"\x12\x00"
    assert enc(rpc_pb2.AuthUserListResponse(users=["a"])) == b"\x12\x01a"


def test_range_stream_response_wraps_a_range_response_in_field_1():
    m = rpc_pb2.RangeStreamResponse(range_response=rpc_pb2.RangeResponse(count=3))
    assert enc(m) == b"\x0a\x02\x20\x03"


def test_authpb_records():
    P = auth_pb2.Permission
    assert (P.READ, P.WRITE, P.READWRITE) == (0, 1, 2)
    user = auth_pb2.User(name=b"u", password=b"p", roles=["r"], options=auth_pb2.UserAddOptions(no_password=True))
    assert enc(user) == b"\x0a\x01u\x12\x01p\x1a\x01r\x22\x02\x08\x01"
    assert enc(auth_pb2.Role(name=b"r", keyPermission=[P(key=b"k")])) == b"\x0a\x01r\x12\x03\x12\x01k"


# --- services ---------------------------------------------------------------

# (service, method, client streaming, server streaming), as in etcd v3.6,
# plus etcd 3.7's KV.RangeStream.
ETCD_METHODS = [
    ("KV", "Range", False, False),
    ("KV", "RangeStream", False, True),
    ("KV", "Put", False, False),
    ("KV", "DeleteRange", False, False),
    ("KV", "Txn", False, False),
    ("KV", "Compact", False, False),
    ("Watch", "Watch", True, True),
    ("Lease", "LeaseGrant", False, False),
    ("Lease", "LeaseRevoke", False, False),
    ("Lease", "LeaseKeepAlive", True, True),
    ("Lease", "LeaseTimeToLive", False, False),
    ("Lease", "LeaseLeases", False, False),
    ("Cluster", "MemberAdd", False, False),
    ("Cluster", "MemberRemove", False, False),
    ("Cluster", "MemberUpdate", False, False),
    ("Cluster", "MemberList", False, False),
    ("Cluster", "MemberPromote", False, False),
    ("Maintenance", "Alarm", False, False),
    ("Maintenance", "Status", False, False),
    ("Maintenance", "Defragment", False, False),
    ("Maintenance", "Hash", False, False),
    ("Maintenance", "HashKV", False, False),
    ("Maintenance", "Snapshot", False, True),
    ("Maintenance", "MoveLeader", False, False),
    ("Maintenance", "Downgrade", False, False),
    ("Auth", "AuthEnable", False, False),
    ("Auth", "AuthDisable", False, False),
    ("Auth", "AuthStatus", False, False),
    ("Auth", "Authenticate", False, False),
    ("Auth", "UserAdd", False, False),
    ("Auth", "UserGet", False, False),
    ("Auth", "UserList", False, False),
    ("Auth", "UserDelete", False, False),
    ("Auth", "UserChangePassword", False, False),
    ("Auth", "UserGrantRole", False, False),
    ("Auth", "UserRevokeRole", False, False),
    ("Auth", "RoleAdd", False, False),
    ("Auth", "RoleGet", False, False),
    ("Auth", "RoleList", False, False),
    ("Auth", "RoleDelete", False, False),
    ("Auth", "RoleGrantPermission", False, False),
    ("Auth", "RoleRevokePermission", False, False),
]


def _grpc_paths_from_descriptors():
    out = {}
    for service in rpc_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            out[f"/{service.full_name}/{method.name}"] = (method.client_streaming, method.server_streaming)
    return out


def test_service_method_paths_and_streaming():
    want = {f"/etcdserverpb.{s}/{m}": (cs, ss) for s, m, cs, ss in ETCD_METHODS}
    assert _grpc_paths_from_descriptors() == want
    for path in (
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.Watch/Watch",
        "/etcdserverpb.Lease/LeaseKeepAlive",
        "/etcdserverpb.Maintenance/Snapshot",
    ):
        assert path in want


def test_method_request_response_types():
    kv = rpc_pb2.DESCRIPTOR.services_by_name["KV"].methods_by_name
    assert kv["Compact"].input_type.full_name == "etcdserverpb.CompactionRequest"
    assert kv["Compact"].output_type.full_name == "etcdserverpb.CompactionResponse"
    assert kv["RangeStream"].input_type.full_name == "etcdserverpb.RangeRequest"
    assert kv["RangeStream"].output_type.full_name == "etcdserverpb.RangeStreamResponse"
    auth = rpc_pb2.DESCRIPTOR.services_by_name["Auth"].methods_by_name
    assert auth["UserAdd"].input_type.full_name == "etcdserverpb.AuthUserAddRequest"
    assert auth["RoleGrantPermission"].output_type.full_name == "etcdserverpb.AuthRoleGrantPermissionResponse"
    for service in rpc_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            assert method.input_type.file is rpc_pb2.DESCRIPTOR
            assert method.output_type.full_name.startswith("etcdserverpb.")


class _RecordingChannel:
    def __init__(self):
        self.calls = {}

    def _record(self, kind):
        def make(path, request_serializer=None, response_deserializer=None, **_):
            self.calls[path] = kind
            return object()

        return make

    def __getattr__(self, kind):
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


def test_generated_stubs_use_etcd_paths():
    channel = _RecordingChannel()
    for service in ("KV", "Watch", "Lease", "Cluster", "Maintenance", "Auth"):
        getattr(rpc_pb2_grpc, f"{service}Stub")(channel)
    kinds = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }
    assert channel.calls == {f"/etcdserverpb.{s}/{m}": kinds[(cs, ss)] for s, m, cs, ss in ETCD_METHODS}


def test_descriptor_full_names():
    assert kv_pb2.DESCRIPTOR.package == "mvccpb"
    assert auth_pb2.DESCRIPTOR.package == "authpb"
    assert rpc_pb2.DESCRIPTOR.package == "etcdserverpb"
    assert kv_pb2.KeyValue.DESCRIPTOR.full_name == "mvccpb.KeyValue"
    assert rpc_pb2.RangeResponse.DESCRIPTOR.fields_by_name["kvs"].message_type.full_name == "mvccpb.KeyValue"
    assert rpc_pb2.WatchResponse.DESCRIPTOR.fields_by_name["events"].message_type.full_name == "mvccpb.Event"


# --- grpc.health.v1 ------------------------------------------------------------
# The bytes etcd 3.6.16 answered with (recorded from its Health service).


def test_health_messages_encode_as_etcd_sends_them():
    from brain.api.pb.grpc.health.v1 import health_pb2 as h

    assert enc(h.HealthCheckRequest(service="unknown")) == b"\x0a\x07unknown"
    assert enc(h.HealthCheckResponse(status=h.HealthCheckResponse.SERVING)) == b"\x08\x01"
    assert enc(h.HealthCheckResponse(status=h.HealthCheckResponse.NOT_SERVING)) == b"\x08\x02"
    assert enc(h.HealthCheckResponse(status=h.HealthCheckResponse.SERVICE_UNKNOWN)) == b"\x08\x03"
    listed = h.HealthListResponse()
    listed.statuses[""].status = h.HealthCheckResponse.SERVING
    assert enc(listed) == b"\x0a\x06\x0a\x00\x12\x02\x08\x01"


def test_health_stub_paths():
    from brain.api.pb.grpc.health.v1 import health_pb2, health_pb2_grpc

    channel = _RecordingChannel()
    health_pb2_grpc.HealthStub(channel)
    assert channel.calls == {"/grpc.health.v1.Health/Check": "unary_unary",
                             "/grpc.health.v1.Health/List": "unary_unary",
                             "/grpc.health.v1.Health/Watch": "unary_stream"}
    assert health_pb2.DESCRIPTOR.package == "grpc.health.v1"
