"""Seed inputs for tests.fuzz.api_target: one well-formed request (or a few)
per method, so that the fuzzer starts from what clients send.

    python -m tests.fuzz.seeds

writes them to tests/fuzz/corpus/api/seed-<method>-<n> (checked in); the
fuzzer's own finds are merged there by hand (libFuzzer's -merge=1).
"""

from __future__ import annotations

from pathlib import Path

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.grpc.health.v1 import health_pb2
from tests.fuzz.api_target import join_messages

CORPUS = Path(__file__).resolve().parent / "corpus" / "api"

# the methods as api_target.FrontTarget orders them (by path)
PATHS = sorted([
    "/etcdserverpb.Cluster/MemberAdd", "/etcdserverpb.Cluster/MemberList", "/etcdserverpb.Cluster/MemberPromote",
    "/etcdserverpb.Cluster/MemberRemove", "/etcdserverpb.Cluster/MemberUpdate", "/etcdserverpb.KV/Compact",
    "/etcdserverpb.KV/DeleteRange", "/etcdserverpb.KV/Put", "/etcdserverpb.KV/Range", "/etcdserverpb.KV/RangeStream",
    "/etcdserverpb.KV/Txn", "/etcdserverpb.Lease/LeaseGrant", "/etcdserverpb.Lease/LeaseKeepAlive",
    "/etcdserverpb.Lease/LeaseLeases", "/etcdserverpb.Lease/LeaseRevoke", "/etcdserverpb.Lease/LeaseTimeToLive",
    "/etcdserverpb.Maintenance/Alarm", "/etcdserverpb.Maintenance/Defragment", "/etcdserverpb.Maintenance/Downgrade",
    "/etcdserverpb.Maintenance/Hash", "/etcdserverpb.Maintenance/HashKV", "/etcdserverpb.Maintenance/MoveLeader",
    "/etcdserverpb.Maintenance/Snapshot", "/etcdserverpb.Maintenance/Status", "/etcdserverpb.Watch/Watch",
    "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/List", "/grpc.health.v1.Health/Watch",
])


def _txn() -> pb.TxnRequest:
    t = pb.TxnRequest()
    c = t.compare.add(key=b"/registry/a", target=pb.Compare.MOD, result=pb.Compare.EQUAL)
    c.mod_revision = 0
    t.success.add().request_put.CopyFrom(pb.PutRequest(key=b"/registry/a", value=b"v"))
    t.failure.add().request_range.CopyFrom(pb.RangeRequest(key=b"/registry/a"))
    nested = t.success.add().request_txn
    nested.success.add().request_delete_range.CopyFrom(pb.DeleteRangeRequest(key=b"/registry/b", range_end=b"/registry/c"))
    return t


def seeds() -> dict[str, list[bytes]]:
    """Requests by path, each a payload as api_target.FrontTarget.run takes it."""
    watch = [
        pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"/registry/", range_end=b"/registry0", prev_kv=True,
                                                             progress_notify=True, fragment=True)),
        pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a", start_revision=1, watch_id=7,
                                                             filters=[pb.WatchCreateRequest.NOPUT])),
        pb.WatchRequest(progress_request=pb.WatchProgressRequest()),
        pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=7)),
    ]
    s = {
        "/etcdserverpb.Cluster/MemberAdd": [pb.MemberAddRequest(peerURLs=["http://127.0.0.1:2380"])],
        "/etcdserverpb.Cluster/MemberList": [pb.MemberListRequest(linearizable=True)],
        "/etcdserverpb.Cluster/MemberPromote": [pb.MemberPromoteRequest(ID=1)],
        "/etcdserverpb.Cluster/MemberRemove": [pb.MemberRemoveRequest(ID=1)],
        "/etcdserverpb.Cluster/MemberUpdate": [pb.MemberUpdateRequest(ID=1, peerURLs=["http://127.0.0.1:2380"])],
        "/etcdserverpb.KV/Compact": [pb.CompactionRequest(revision=2, physical=True)],
        "/etcdserverpb.KV/DeleteRange": [pb.DeleteRangeRequest(key=b"a", range_end=b"\0", prev_kv=True)],
        "/etcdserverpb.KV/Put": [pb.PutRequest(key=b"/registry/a", value=b"v", prev_kv=True),
                                 pb.PutRequest(key=b"b", ignore_value=True, ignore_lease=True)],
        "/etcdserverpb.KV/Range": [pb.RangeRequest(key=b"/registry/", range_end=b"/registry0", limit=10,
                                                   sort_order=pb.RangeRequest.DESCEND,
                                                   sort_target=pb.RangeRequest.MOD, serializable=True),
                                   pb.RangeRequest(key=b"\0", range_end=b"\0", count_only=True, revision=1,
                                                   min_mod_revision=1, max_create_revision=9)],
        "/etcdserverpb.KV/RangeStream": [pb.RangeRequest(key=b"\0", range_end=b"\0", limit=3)],
        "/etcdserverpb.KV/Txn": [_txn()],
        "/etcdserverpb.Lease/LeaseGrant": [pb.LeaseGrantRequest(TTL=60, ID=1000)],
        "/etcdserverpb.Lease/LeaseLeases": [pb.LeaseLeasesRequest()],
        "/etcdserverpb.Lease/LeaseRevoke": [pb.LeaseRevokeRequest(ID=1000)],
        "/etcdserverpb.Lease/LeaseTimeToLive": [pb.LeaseTimeToLiveRequest(ID=1000, keys=True)],
        "/etcdserverpb.Maintenance/Alarm": [pb.AlarmRequest(action=pb.AlarmRequest.GET),
                                            pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=1,
                                                            alarm=pb.NOSPACE)],
        "/etcdserverpb.Maintenance/Defragment": [pb.DefragmentRequest()],
        "/etcdserverpb.Maintenance/Downgrade": [pb.DowngradeRequest(action=pb.DowngradeRequest.VALIDATE,
                                                                    version="3.5.0")],
        "/etcdserverpb.Maintenance/Hash": [pb.HashRequest()],
        "/etcdserverpb.Maintenance/HashKV": [pb.HashKVRequest(revision=1)],
        "/etcdserverpb.Maintenance/MoveLeader": [pb.MoveLeaderRequest(targetID=1)],
        "/etcdserverpb.Maintenance/Snapshot": [pb.SnapshotRequest()],
        "/etcdserverpb.Maintenance/Status": [pb.StatusRequest()],
        "/grpc.health.v1.Health/Check": [health_pb2.HealthCheckRequest(service=""),
                                         health_pb2.HealthCheckRequest(service="etcd")],
        "/grpc.health.v1.Health/List": [health_pb2.HealthListRequest()],
        "/grpc.health.v1.Health/Watch": [health_pb2.HealthCheckRequest(service="")],
    }
    out = {path: [m.SerializeToString() for m in msgs] for path, msgs in s.items()}
    out["/etcdserverpb.Watch/Watch"] = [join_messages([m.SerializeToString() for m in watch])]
    out["/etcdserverpb.Lease/LeaseKeepAlive"] = [join_messages([pb.LeaseKeepAliveRequest(ID=1000).SerializeToString(),
                                                                pb.LeaseKeepAliveRequest(ID=5).SerializeToString()])]
    return out


def inputs() -> dict[str, bytes]:
    """The seeds as fuzzer inputs ([selector][payload]), by file name."""
    files = {}
    for path, payloads in seeds().items():
        selector = PATHS.index(path)
        name = path.rsplit("/", 1)[1]
        for i, payload in enumerate(payloads):
            files[f"seed-{name}-{i}"] = bytes([selector]) + payload
    return files


def main() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in inputs().items():
        (CORPUS / name).write_bytes(data)


if __name__ == "__main__":
    main()
