"""The etcdserverpb.Cluster service: who the members are.  (Named for what
it serves: brain/cluster is the package of a replica's NATS side.)

On a cluster replica, the members are the cluster's replicas (see
ClusterService); on a single node, as follows.

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

from brain.api.authz import checked_call, needs_admin, needs_user
from brain.api.convert import Header
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.rpc_table import Rpc, ServiceTable
from brain.api.unary import abort_with
from brain.mvcc.errors import EtcdError

log = logging.getLogger("brain.api.membership")

ErrMemberNotFound = EtcdError("NOT_FOUND", "etcdserver: member not found")
ErrMemberNotLearner = EtcdError("FAILED_PRECONDITION", "etcdserver: can only promote a learner member")
ErrMembershipFixed = EtcdError("FAILED_PRECONDITION", "brain: membership changes are not supported (single member)")
ErrLearnersUnsupported = EtcdError("FAILED_PRECONDITION", "brain: learner members are not supported")


class ClusterService:
    """MemberList and friends: one member on a single node; on a cluster
    replica (``replica``: a brain.cluster.Replica) every replica in the
    cluster's membership bucket, and MemberAdd/MemberRemove change it."""

    def __init__(self, engine, name: str, client_urls: Callable[[], Sequence[str]], replica=None,
                 gate=None) -> None:
        self.gate = gate  # brain.api.authz.Gate (None: no auth checks)
        self.engine = engine
        self.name = name
        self.client_urls = client_urls
        self.replica = replica

    def _header(self, h) -> None:
        # etcd's Cluster responses carry no revision
        Header.of(self.engine).fill(h, 0)

    def _me(self, m) -> None:
        m.ID = self.engine.member_id
        m.name = self.name
        m.clientURLs.extend(self.client_urls())

    def _fill_members(self, resp) -> None:
        if self.replica is None:
            self._me(resp.members.add())
            return
        for member in self.replica.members():
            m = resp.members.add()
            m.ID = member.id
            m.name = member.name
            m.peerURLs.extend(member.peer_urls)
            m.clientURLs.extend(member.client_urls)

    def _known(self, member_id: int) -> bool:
        if self.replica is None:
            return member_id == self.engine.member_id
        return any(m.id == member_id for m in self.replica.members())

    def MemberList(self, request, context):
        try:
            resp = rpc_pb2.MemberListResponse()
            self._header(resp.header)
            self._fill_members(resp)
            return resp
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, "MemberList")

    def MemberAdd(self, request, context):
        if self.replica is None:
            abort_with(context, ErrMembershipFixed, "MemberAdd")
        if request.isLearner:
            abort_with(context, ErrLearnersUnsupported, "MemberAdd")
        try:
            added = self.replica.add_member("", list(request.peerURLs))
            resp = rpc_pb2.MemberAddResponse()
            self._header(resp.header)
            resp.member.ID = added.id
            resp.member.peerURLs.extend(added.peer_urls)
            self._fill_members(resp)
            return resp
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "MemberAdd")

    def MemberRemove(self, request, context):
        if self.replica is None:
            err = ErrMembershipFixed if request.ID == self.engine.member_id else ErrMemberNotFound
            abort_with(context, err, "MemberRemove")
        try:
            if not self.replica.remove_member(request.ID):
                raise ErrMemberNotFound.fresh()
            resp = rpc_pb2.MemberRemoveResponse()
            self._header(resp.header)
            self._fill_members(resp)
            return resp
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "MemberRemove")

    def MemberUpdate(self, request, context):
        if self.replica is None or not self._known(request.ID):
            err = ErrMembershipFixed if request.ID == self.engine.member_id else ErrMemberNotFound
            abort_with(context, err, "MemberUpdate")
        # brain has no peer URLs to move: the update is accepted as a no-op
        resp = rpc_pb2.MemberUpdateResponse()
        self._header(resp.header)
        self._fill_members(resp)
        return resp

    def MemberPromote(self, request, context):
        err = ErrMemberNotLearner if self._known(request.ID) else ErrMemberNotFound
        abort_with(context, err, "MemberPromote")


    def rpc_table(self) -> ServiceTable:
        return ServiceTable("etcdserverpb.Cluster", (
            # etcd: member changes need root, the list a user (3.7)
            Rpc("MemberAdd", rpc_pb2.MemberAddRequest, rpc_pb2.MemberAddResponse,
                checked_call(self.gate, self.MemberAdd, needs_admin, "MemberAdd")),
            Rpc("MemberRemove", rpc_pb2.MemberRemoveRequest, rpc_pb2.MemberRemoveResponse,
                checked_call(self.gate, self.MemberRemove, needs_admin, "MemberRemove")),
            Rpc("MemberUpdate", rpc_pb2.MemberUpdateRequest, rpc_pb2.MemberUpdateResponse,
                checked_call(self.gate, self.MemberUpdate, needs_admin, "MemberUpdate")),
            Rpc("MemberList", rpc_pb2.MemberListRequest, rpc_pb2.MemberListResponse,
                checked_call(self.gate, self.MemberList, needs_user, "MemberList")),
            Rpc("MemberPromote", rpc_pb2.MemberPromoteRequest, rpc_pb2.MemberPromoteResponse,
                checked_call(self.gate, self.MemberPromote, needs_admin, "MemberPromote")),
        ))
