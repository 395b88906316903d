"""The etcdserverpb.Cluster service for a single member.

MemberList answers one member: this server, with its name (--name), its
member ID, the client URLs it advertises (--advertise-client-urls, else the
URLs it listens on) and no peer URLs (brain has no peers).  The header
carries cluster_id, member_id and raft_term but no revision, as etcd's.

Membership cannot change.  Where etcd has an answer for the single-member
case it is used: removing, updating or promoting an ID that is not this
member is "etcdserver: member not found"; promoting this member (a voter)
is "etcdserver: can only promote a learner member".  Adding a member, and
removing or updating this one, fail with FAILED_PRECONDITION
"brain: membership changes are not supported (single member)".
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import grpc

from brain.api.convert import Header
from brain.api.unary import abort_with
from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from brain.mvcc.errors import EtcdError

log = logging.getLogger("brain.api.cluster")

ErrMemberNotFound = EtcdError("NOT_FOUND", "etcdserver: member not found")
ErrMemberNotLearner = EtcdError("FAILED_PRECONDITION", "etcdserver: can only promote a learner member")
ErrMembershipFixed = EtcdError("FAILED_PRECONDITION", "brain: membership changes are not supported (single member)")


class ClusterService(rpc_pb2_grpc.ClusterServicer):
    def __init__(self, engine, name: str, client_urls: Callable[[], Sequence[str]]) -> None:
        self.engine = engine
        self.name = name
        self.client_urls = client_urls

    def _header(self, h) -> None:
        # etcd's Cluster responses carry no revision
        Header.of(self.engine).fill(h, 0)

    def _me(self, m) -> None:
        m.ID = self.engine.member_id
        m.name = self.name
        m.clientURLs.extend(self.client_urls())

    def MemberList(self, request, context):
        try:
            resp = rpc_pb2.MemberListResponse()
            self._header(resp.header)
            self._me(resp.members.add())
            return resp
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, "MemberList")

    def MemberAdd(self, request, context):
        abort_with(context, ErrMembershipFixed, "MemberAdd")

    def MemberRemove(self, request, context):
        err = ErrMembershipFixed if request.ID == self.engine.member_id else ErrMemberNotFound
        abort_with(context, err, "MemberRemove")

    def MemberUpdate(self, request, context):
        err = ErrMembershipFixed if request.ID == self.engine.member_id else ErrMemberNotFound
        abort_with(context, err, "MemberUpdate")

    def MemberPromote(self, request, context):
        err = ErrMemberNotLearner if request.ID == self.engine.member_id else ErrMemberNotFound
        abort_with(context, err, "MemberPromote")


def cluster_handlers(svc: ClusterService, recv_limit: int) -> dict[str, grpc.RpcMethodHandler]:
    from brain.api.server import unary_handler  # server imports this module

    def unary(name, req, resp):
        return unary_handler(getattr(svc, name), req, resp, recv_limit)

    return {
        "MemberAdd": unary("MemberAdd", rpc_pb2.MemberAddRequest, rpc_pb2.MemberAddResponse),
        "MemberRemove": unary("MemberRemove", rpc_pb2.MemberRemoveRequest, rpc_pb2.MemberRemoveResponse),
        "MemberUpdate": unary("MemberUpdate", rpc_pb2.MemberUpdateRequest, rpc_pb2.MemberUpdateResponse),
        "MemberList": unary("MemberList", rpc_pb2.MemberListRequest, rpc_pb2.MemberListResponse),
        "MemberPromote": unary("MemberPromote", rpc_pb2.MemberPromoteRequest, rpc_pb2.MemberPromoteResponse),
    }
