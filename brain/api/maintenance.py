"""The etcdserverpb.Maintenance service: Status, Hash, HashKV, Alarm,
Defragment, Snapshot, MoveLeader, Downgrade.

Shaped as etcd 3.6 answers them (checked against etcd 3.4 where the two
agree, and etcd's source where 3.6 differs):

* Status: ``version`` is brain.etcd_version.ETCD_VERSION (3.7.3, a version
  kube-apiserver enables consistent reads from cache and watch progress
  requests for) and ``storageVersion`` its STORAGE_VERSION (3.6.0, as an
  etcd 3.7 member of a cluster still at version 3.6 reports: see
  brain.etcd_version); brain is its own leader; ``raftIndex`` and
  ``raftAppliedIndex`` are the committed revision (monotonic across
  restarts and restores); ``dbSize`` / ``dbSizeInUse`` are the value
  store's file size / in-use bytes plus the journal bytes written since the
  last checkpoint, i.e. exactly what --quota-backend-bytes is compared with;
  ``errors`` lists the alarms as etcd prints them
  ("memberID:<decimal> alarm:NOSPACE ").
* Hash / HashKV: brain's own hashes (CRC-32, not etcd's bytes; see
  brain.mvcc.kvhash); HashKV's revision rules and errors are etcd's.
* Alarm: GET / ACTIVATE / DEACTIVATE on the engine's alarm set; the
  response carries the alarm raised or cleared (an existing one for a
  repeated ACTIVATE, none for a DEACTIVATE of an alarm not raised).
* Defragment answers success: lmdb reuses freed pages, so there is nothing
  to defragment; it runs a checkpoint, which moves the journal into the
  value store and applies pending compaction deletes, so in-use bytes drop.
* Snapshot streams a consistent snapshot (brain.migrate.snapshot), an etcd
  database file holding the retained history and the leases, in 32 KiB
  blobs with ``remaining_bytes`` and ``version``, then its sha256 as a last
  message, as etcd's server does.
* MoveLeader: to itself succeeds (nothing to do, as etcd); on a single
  node any other ID is "etcdserver: bad leader transferee"; on a cluster
  replica, the leader hands the lead to the member named (a follower
  answers "etcdserver: not leader").  Downgrade: no target is valid.
"""

from __future__ import annotations

import logging
import re

from brain.api.authz import checked_call, needs_admin, needs_user
from brain.api import convert
from brain.api.pb.etcdserverpb import rpc_pb2
from brain.api.rpc_table import SERVER_STREAM, Rpc, ServiceTable
from brain.api.unary import abort_with
from brain.migrate import snapshot as snapshots
from brain.engine.alarms import ALARM_NONE
from brain.engine.config import DEFAULT_QUOTA_BYTES
from brain.etcd_version import ETCD_VERSION, STORAGE_VERSION
from brain.mvcc.errors import EtcdError, ErrNotLeader

log = logging.getLogger("brain.api.maintenance")

ErrBadLeaderTransferee = EtcdError("FAILED_PRECONDITION", "etcdserver: bad leader transferee")
ErrWrongDowngradeVersionFormat = EtcdError("INVALID_ARGUMENT", "etcdserver: wrong downgrade target version format")
ErrInvalidDowngradeTargetVersion = EtcdError("INVALID_ARGUMENT", "etcdserver: invalid downgrade target version")
ErrNoInflightDowngrade = EtcdError("FAILED_PRECONDITION", "etcdserver: no inflight downgrade job")
ErrUnknownMethod = EtcdError("UNKNOWN", "etcdserver: unknown method")

_SEMVER = re.compile(r"^v?(\d+)\.(\d+)(\.\d+)?(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def alarm_text(member_id: int, alarm: int) -> str:
    """An AlarmMember as etcd prints it (Go's compact proto text, trailing
    space included; zero fields are left out)."""
    parts = []
    if member_id:
        parts.append(f"memberID:{member_id}")
    if alarm:
        parts.append(f"alarm:{rpc_pb2.AlarmType.Name(alarm) if alarm in rpc_pb2.AlarmType.values() else alarm}")
    return " ".join(parts) + " " if parts else ""


def _alarm_check(gate, request, context) -> None:
    if request.action == rpc_pb2.AlarmRequest.GET:
        gate.require_user(context)
    else:
        gate.require_admin(context)


class MaintenanceService:
    """Maintenance calls on top of an engine (see brain.engine.Engine)."""

    def __init__(self, engine, replica=None, gate=None) -> None:
        self.engine = engine
        self.replica = replica  # a brain.cluster.Replica on a cluster replica
        self.gate = gate  # brain.api.authz.Gate (None: no auth checks)
        self.header = convert.Header.of(engine)

    # -- status and hashes -------------------------------------------------

    def Status(self, request, context):
        try:
            eng = self.engine
            st = eng.statistics()
            resp = rpc_pb2.StatusResponse()
            self.header.fill(resp.header, st.committed_revision)
            resp.version = ETCD_VERSION
            journal = st.journal_bytes_since_checkpoint
            resp.dbSize = st.backend_size_bytes + journal
            resp.dbSizeInUse = st.backend_in_use_bytes + journal
            resp.leader = eng.leader_id
            # a replica's journal index; on a single node, the revision
            index = st.applied_index if getattr(eng, "forwarder", None) is not None else st.committed_revision
            resp.raftIndex = index
            resp.raftAppliedIndex = index
            resp.raftTerm = eng.term
            resp.isLearner = False
            resp.storageVersion = STORAGE_VERSION
            resp.dbSizeQuota = eng.config.quota_backend_bytes or DEFAULT_QUOTA_BYTES  # etcd: its default for 0
            resp.downgradeInfo.SetInParent()
            resp.errors.extend(alarm_text(m, a) for m, a in eng.alarms.get())
            if st.failed:
                resp.errors.append(f"brain: engine refuses writes until restarted: {st.failed}")
            return resp
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort_with(context, e, "Status")

    def Hash(self, request, context):
        try:
            h, rev = snapshots.hash_all(self.engine)
            resp = rpc_pb2.HashResponse()
            self.header.fill(resp.header, rev)
            resp.hash = h
            return resp
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Hash")

    def HashKV(self, request, context):
        try:
            h = snapshots.hash_kv(self.engine, request.revision)
            resp = rpc_pb2.HashKVResponse()
            self.header.fill(resp.header, h.current_revision)
            resp.hash = h.hash
            resp.compact_revision = h.compact_revision
            resp.hash_revision = h.hash_revision
            return resp
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "HashKV")

    # -- alarms ------------------------------------------------------------

    def Alarm(self, request, context):
        try:
            eng = self.engine
            resp = rpc_pb2.AlarmResponse()
            action, alarm, member = request.action, request.alarm, request.memberID
            if action == rpc_pb2.AlarmRequest.GET:
                found = eng.alarms.get(alarm)
            elif action == rpc_pb2.AlarmRequest.ACTIVATE:
                found = []
                if alarm != ALARM_NONE:
                    if eng.alarm_activate(member, alarm):
                        log.warning("alarm %s raised for member %x by a client", alarm_text(0, alarm).strip(), member)
                    found = [(member, alarm)]
            elif action == rpc_pb2.AlarmRequest.DEACTIVATE:
                found = [(member, alarm)] if eng.alarm_deactivate(member, alarm) else []
                if found:
                    log.info("alarm %s cleared for member %x", alarm_text(0, alarm).strip(), member)
            else:
                found = []
            for m, a in found:
                am = resp.alarms.add()
                am.memberID = m
                am.alarm = a
            self.header.fill(resp.header, eng.committed_rev)
            return resp
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Alarm")

    # -- defragment and snapshot ------------------------------------------

    def Defragment(self, request, context):
        try:
            log.info("defragment requested: running a checkpoint (lmdb needs no defragmentation)")
            self.engine.checkpoint()
            return rpc_pb2.DefragmentResponse()
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Defragment")

    def Snapshot(self, request, context):
        eng = self.engine
        try:
            f, info = snapshots.spool_snapshot(eng, eng.config.data_dir, out=lambda line: log.info("%s", line))
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Snapshot")
        log.info("sending snapshot at revision %d to client (%d bytes, %d records)",
                 info.revision, info.size, info.records)
        try:
            remaining = info.size
            for blob in snapshots.iter_chunks(f, info.size):
                remaining -= len(blob)
                resp = rpc_pb2.SnapshotResponse()
                resp.remaining_bytes = remaining
                resp.blob = blob
                resp.version = STORAGE_VERSION
                yield resp
            resp = rpc_pb2.SnapshotResponse()
            resp.blob = info.digest
            resp.version = STORAGE_VERSION
            yield resp
        finally:
            f.close()

    # -- leadership and versions ------------------------------------------

    def MoveLeader(self, request, context):
        try:
            replica = self.replica
            if replica is None:
                if request.targetID != self.engine.member_id:
                    raise ErrBadLeaderTransferee.fresh()
            else:
                # etcd: only the leader moves the lead, to a known member
                if not self.engine.is_leader:
                    raise ErrNotLeader.fresh()
                if request.targetID != self.engine.member_id:
                    if not any(m.id == request.targetID and m.updated for m in replica.members()):
                        raise ErrBadLeaderTransferee.fresh()
                    replica.move_leader(request.targetID)
            return rpc_pb2.MoveLeaderResponse()  # etcd answers without a header
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "MoveLeader")

    def Downgrade(self, request, context):
        try:
            action = request.action
            if action == rpc_pb2.DowngradeRequest.CANCEL:
                raise ErrNoInflightDowngrade.fresh()
            if action not in (rpc_pb2.DowngradeRequest.VALIDATE, rpc_pb2.DowngradeRequest.ENABLE):
                raise ErrUnknownMethod.fresh()
            if not _SEMVER.match(request.version):
                raise ErrWrongDowngradeVersionFormat.fresh()
            # brain writes only its own storage format: no older etcd can
            # take over its data directory, so no downgrade target exists.
            raise ErrInvalidDowngradeTargetVersion.fresh()
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, "Downgrade")


    def rpc_table(self) -> ServiceTable:
        # etcd's authMaintenanceServer: root for all but Status and reading
        # alarms, which need a user
        gate = self.gate

        def checked(call, check, method):
            return checked_call(gate, call, check, method)

        return ServiceTable("etcdserverpb.Maintenance", (
            Rpc("Alarm", rpc_pb2.AlarmRequest, rpc_pb2.AlarmResponse, checked(self.Alarm, _alarm_check, "Alarm")),
            Rpc("Status", rpc_pb2.StatusRequest, rpc_pb2.StatusResponse, checked(self.Status, needs_user, "Status")),
            Rpc("Defragment", rpc_pb2.DefragmentRequest, rpc_pb2.DefragmentResponse,
                checked(self.Defragment, needs_admin, "Defragment")),
            Rpc("Hash", rpc_pb2.HashRequest, rpc_pb2.HashResponse, checked(self.Hash, needs_admin, "Hash")),
            Rpc("HashKV", rpc_pb2.HashKVRequest, rpc_pb2.HashKVResponse, checked(self.HashKV, needs_admin, "HashKV")),
            Rpc("Snapshot", rpc_pb2.SnapshotRequest, rpc_pb2.SnapshotResponse,
                checked(self.Snapshot, needs_admin, "Snapshot"), shape=SERVER_STREAM),
            Rpc("MoveLeader", rpc_pb2.MoveLeaderRequest, rpc_pb2.MoveLeaderResponse,
                checked(self.MoveLeader, needs_admin, "MoveLeader")),
            Rpc("Downgrade", rpc_pb2.DowngradeRequest, rpc_pb2.DowngradeResponse,
                checked(self.Downgrade, needs_admin, "Downgrade")),
        ))
