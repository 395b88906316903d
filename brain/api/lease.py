"""The etcdserverpb.Lease service: Grant, Revoke, KeepAlive, TimeToLive, Leases.

Answers are shaped as etcd 3.4 shapes them (observed against a real etcd):

* LeaseGrant answers the effective TTL (a TTL below etcd's minimum, zero
  and negative ones included, is raised to 2 s) and the chosen ID; its
  header carries the store's revision (a grant makes no revision);
* LeaseRevoke's header carries the revision of the deletions of the
  lease's keys (one revision for all of them, none if it held no key);
* LeaseKeepAlive answers every request in order with {ID, TTL}; an unknown
  or expired lease is answered with TTL 0, not an error; the header is
  taken before the renewal (etcd does so to never show a revision newer
  than the keep-alive);
* LeaseTimeToLive answers an unknown lease with TTL -1 and grantedTTL 0,
  not an error; TTL is the remaining time in whole seconds, truncated;
* LeaseLeases lists the IDs soonest expiry first.

Errors (EtcdError) leave as etcd's status codes and texts, as in the KV
service.
"""

from __future__ import annotations

import logging

from brain.api import convert
from brain.api.authz import user_given
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.rpc_table import BIDI_STREAM, Rpc, ServiceTable, read_kind_always
from brain.api.unary import Deferred, abort_with, stepped_rpc
from brain.mvcc import errors
from brain.mvcc.requests import LeaseGrantRequest, LeaseRevokeRequest

log = logging.getLogger("brain.api.lease")


class LeaseService:
    """Lease calls on top of an engine (see brain.engine.Engine)."""

    def __init__(self, engine, gate=None) -> None:
        self.engine = engine
        self.gate = gate  # brain.api.authz.Gate (None: no auth checks)
        self.header = convert.Header.of(engine)

    # -- auth guards (etcd 3.7's lease calls: a user given; reads of the
    # lease's keys for TimeToLive with keys and for Leases, unless root) --

    def _time_to_live_guard(self, auth, info, m) -> None:
        auth.check_user_given(info)
        if m.keys and not auth.is_admin(info):
            for key in self.engine.lease_keys(m.ID):
                auth.check_read(info, key)

    def _leases_guard(self, auth, info, _m) -> None:
        auth.check_user_given(info)
        if not auth.is_admin(info):
            for lease_id in self.engine.lease_ids():
                for key in self.engine.lease_keys(lease_id):
                    auth.check_read(info, key)

    # -- steps (brain.api.unary) ----------------------------------------

    def lease_grant(self, m):
        return Deferred(self.engine.prepare_lease_grant(LeaseGrantRequest(m.TTL, m.ID)), self._granted)

    def _granted(self, res):
        resp = rpc_pb2.LeaseGrantResponse()
        self.header.fill(resp.header, res.revision)
        resp.ID = res.id
        resp.TTL = res.ttl
        return resp

    def lease_revoke(self, m):
        return Deferred(LeaseRevokeRequest(m.ID), self._revoked)

    def _revoked(self, res):
        resp = rpc_pb2.LeaseRevokeResponse()
        self.header.fill(resp.header, res.revision)
        return resp

    def lease_time_to_live(self, m):
        resp = rpc_pb2.LeaseTimeToLiveResponse()
        try:
            res = self.engine.lease_time_to_live(m.ID, m.keys)
        except errors.EtcdError as e:
            if e != errors.ErrLeaseNotFound:
                raise
            self.header.fill(resp.header, self.engine.committed_rev)
            resp.ID = m.ID
            resp.TTL = -1
            return resp
        self.header.fill(resp.header, res.revision)
        resp.ID = res.id
        resp.TTL = res.ttl
        resp.grantedTTL = res.granted_ttl
        if res.keys:
            resp.keys.extend(res.keys)
        return resp

    def lease_leases(self, m):
        res = self.engine.lease_leases()
        resp = rpc_pb2.LeaseLeasesResponse()
        self.header.fill(resp.header, res.revision)
        add = resp.leases.add
        for lease_id in res.ids:
            add().ID = lease_id
        return resp

    @staticmethod
    def parse_keepalive(payload: bytes) -> int:
        """The lease ID of an encoded LeaseKeepAliveRequest."""
        return rpc_pb2.LeaseKeepAliveRequest.FromString(payload).ID

    def keepalive_responses(self, revision: int, outcomes) -> list[bytes]:
        """Encoded LeaseKeepAliveResponses for renewed leases [(id, ttl)];
        ``revision`` was read before the renewals (etcd's order)."""
        out = []
        for lease_id, ttl in outcomes:
            resp = rpc_pb2.LeaseKeepAliveResponse()
            self.header.fill(resp.header, revision)
            resp.ID = lease_id
            resp.TTL = ttl
            out.append(resp.SerializeToString())
        return out

    def rpc_table(self) -> ServiceTable:
        e, g = self.engine, self.gate
        return ServiceTable("etcdserverpb.Lease", (
            stepped_rpc(e, "LeaseGrant", rpc_pb2.LeaseGrantRequest, rpc_pb2.LeaseGrantResponse, self.lease_grant,
                        gate=g, guard=user_given),
            stepped_rpc(e, "LeaseRevoke", rpc_pb2.LeaseRevokeRequest, rpc_pb2.LeaseRevokeResponse,
                        self.lease_revoke, gate=g, guard=user_given),
            Rpc("LeaseKeepAlive", rpc_pb2.LeaseKeepAliveRequest, rpc_pb2.LeaseKeepAliveResponse, self.LeaseKeepAlive,
                shape=BIDI_STREAM, session="keepalive"),
            stepped_rpc(e, "LeaseTimeToLive", rpc_pb2.LeaseTimeToLiveRequest, rpc_pb2.LeaseTimeToLiveResponse,
                        self.lease_time_to_live, read_kind_always, gate=g, guard=self._time_to_live_guard),
            stepped_rpc(e, "LeaseLeases", rpc_pb2.LeaseLeasesRequest, rpc_pb2.LeaseLeasesResponse, self.lease_leases,
                        read_kind_always, gate=g, guard=self._leases_guard),
        ))

    # -- LeaseKeepAlive on grpcio (the native front has its own sessions) ----

    def LeaseKeepAlive(self, request_iterator, context):
        gate = self.gate
        for request in request_iterator:
            if gate is not None and gate.enabled:
                try:
                    gate.check_renew(gate.caller_of_context(context), request.ID)
                except Exception as e:  # noqa: BLE001
                    abort_with(context, e, "LeaseKeepAlive")
            resp = rpc_pb2.LeaseKeepAliveResponse()
            self.header.fill(resp.header, self.engine.committed_rev)
            resp.ID = request.ID
            try:
                resp.TTL = self.engine.lease_keepalive(request.ID)
            except errors.EtcdError as e:
                if e != errors.ErrLeaseNotFound:
                    abort_with(context, e, "LeaseKeepAlive")
                resp.TTL = 0
            except Exception as e:  # noqa: BLE001
                abort_with(context, e, "LeaseKeepAlive")
            yield resp
