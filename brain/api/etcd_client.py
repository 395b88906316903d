"""A client of a running etcd, for `brain mirror` and `brain snapshot save`:
what they ask of the source (brain.migrate.source.Source), over etcd's own
API, returned as plain values, so nothing outside brain/api sees grpc or
protobuf.

TLS follows etcdctl's flags: --cacert (CA bundle to verify the server; the
system's if not given), --cert/--key (a client certificate for
--client-cert-auth servers).  Endpoints are http://host:port,
https://host:port, host:port or unix://path.  An etcd with auth on is asked
as a user (etcdctl's --user name:password, ``ClientAuth``): the client
authenticates first, sends its token with every call and authenticates
again when etcd says the token is unknown or old (as clientv3 does).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from brain.migrate.source import SourceError, WatchBatch
from brain.mvcc.requests import EVENT_DELETE, EVENT_PUT, Event, KeyValue

MAX_MESSAGE = 256 << 20
# A key no one uses: probes read it (count only), so they cost nothing.
PROBE_KEY = b"\xff\xffbrain-mirror/compaction-probe"


@dataclass(frozen=True)
class ClientAuth:
    user: str = ""
    password: str = ""


@dataclass(frozen=True)
class ClientTLS:
    cacert: str = ""
    cert: str = ""
    key: str = ""

    @property
    def wanted(self) -> bool:
        return bool(self.cacert or self.cert or self.key)


def dial(endpoint: str, tls: ClientTLS | None = None) -> grpc.Channel:
    """A channel to `endpoint`; https:// (or TLS flags given) means TLS."""
    tls = tls or ClientTLS()
    target = endpoint.strip()
    secure = tls.wanted
    for prefix, is_tls in (("https://", True), ("http://", False), ("unixs://", True), ("unix://", False)):
        if target.startswith(prefix):
            secure = secure or is_tls
            target = ("unix:" + target[len(prefix):]) if prefix.startswith("unix") else target[len(prefix):]
            break
    target = target.rstrip("/")
    options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]
    if not secure:
        return grpc.insecure_channel(target, options=options)
    if bool(tls.cert) != bool(tls.key):
        raise SourceError("--cert and --key go together")

    def read(path: str) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise SourceError(f"{path}: {e.strerror}") from None

    creds = grpc.ssl_channel_credentials(root_certificates=read(tls.cacert), private_key=read(tls.key),
                                         certificate_chain=read(tls.cert))
    return grpc.secure_channel(target, creds, options=options)


def _kv(pb) -> KeyValue:
    return KeyValue(pb.key, pb.create_revision, pb.mod_revision, pb.version, pb.value, pb.lease)


def _error(e: grpc.RpcError, what: str) -> SourceError:
    code = e.code()
    return SourceError(f"{what}: {code.name if code else 'UNKNOWN'}: {e.details()}")


# What etcd answers a token it no longer takes: authenticate again and retry.
_STALE_TOKEN = ("etcdserver: invalid auth token", "etcdserver: revision of auth store is old")


class EtcdClient:
    def __init__(self, endpoint: str, tls: ClientTLS | None = None, *, timeout: float = 30.0,
                 auth: ClientAuth | None = None) -> None:
        self.endpoint = endpoint
        self.channel = dial(endpoint, tls)
        self.timeout = timeout
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.watch_stub = rpc_pb2_grpc.WatchStub(self.channel)
        self.lease = rpc_pb2_grpc.LeaseStub(self.channel)
        self.maintenance = rpc_pb2_grpc.MaintenanceStub(self.channel)
        self._auth = auth if auth is not None and auth.user else None
        self.metadata: tuple = ()
        if self._auth is not None:
            self._authenticate()

    def close(self) -> None:
        self.channel.close()

    def _authenticate(self) -> None:
        try:
            token = rpc_pb2_grpc.AuthStub(self.channel).Authenticate(
                rpc_pb2.AuthenticateRequest(name=self._auth.user, password=self._auth.password),
                timeout=self.timeout).token
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: authenticate as {self._auth.user}") from None
        self.metadata = (("token", token),)

    def _unary(self, fn, request):
        """``fn(request)`` with this client's token, authenticating again
        once when etcd no longer takes it (RpcError as the call raises it)."""
        try:
            return fn(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            if self._auth is None or e.details() not in _STALE_TOKEN:
                raise
        self._authenticate()
        return fn(request, timeout=self.timeout, metadata=self.metadata)

    # -- simple calls -------------------------------------------------------

    def status(self) -> tuple[int, str, int]:
        """(cluster ID, server version, current revision)."""
        try:
            st = self._unary(self.maintenance.Status, rpc_pb2.StatusRequest())
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: status") from None
        return st.header.cluster_id, st.version, st.header.revision

    def revision(self) -> int:
        """etcd's current revision (a linearizable read)."""
        try:
            r = self._unary(self.kv.Range, rpc_pb2.RangeRequest(key=PROBE_KEY, count_only=True))
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: range") from None
        return r.header.revision

    def leases(self) -> list[int]:
        try:
            r = self._unary(self.lease.LeaseLeases, rpc_pb2.LeaseLeasesRequest())
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: lease list") from None
        return [x.ID for x in r.leases]

    def lease_ttl(self, lease_id: int) -> tuple[int, int] | None:
        """(granted TTL, remaining TTL) or None when the lease is gone."""
        try:
            r = self._unary(self.lease.LeaseTimeToLive, rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id))
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: lease timetolive") from None
        if r.TTL == -1:
            return None
        return r.grantedTTL, r.TTL

    def _compacted(self, rev: int) -> bool:
        """True when a read at `rev` is refused as compacted."""
        try:
            self._unary(self.kv.Range, rpc_pb2.RangeRequest(key=PROBE_KEY, revision=rev, count_only=True))
            return False
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (e.details() or ""):
                return True
            raise _error(e, f"{self.endpoint}: range") from None

    def compact_revision(self, floor: int) -> int:
        """etcd's compaction revision if it is above `floor`, else `floor`.
        etcd does not report it, but refuses reads below it: one read at
        floor + 1 tells whether it moved, a bisection then finds it."""
        current = self.revision()
        if floor + 1 > current or not self._compacted(floor + 1):
            return floor
        lo, hi = floor + 1, current  # compacted at lo, readable at hi
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if self._compacted(mid):
                lo = mid
            else:
                hi = mid
        return hi

    # -- snapshot ------------------------------------------------------------

    def snapshot(self, f: BinaryIO, progress: Callable[[int, int], None] | None = None) -> int:
        """Write etcd's snapshot (its database and the sha256 after it) to
        `f`; returns the database size.  Checks the digest as it goes."""
        sha = hashlib.sha256()
        size = 0
        last = b""
        try:
            for resp in self.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), metadata=self.metadata):
                if last:
                    sha.update(last)
                    size += len(last)
                f.write(resp.blob)
                last = resp.blob
                if progress is not None:
                    progress(size + len(last), size + len(last) + resp.remaining_bytes)
        except grpc.RpcError as e:
            raise _error(e, f"{self.endpoint}: snapshot") from None
        if len(last) != 32 or sha.digest() != last:
            raise SourceError(f"{self.endpoint}: snapshot: sha256 checksum not found or wrong (incomplete?)")
        return size

    # -- watch ---------------------------------------------------------------

    def watch_all(self, start_revision: int, *, progress_every: float = 1.0) -> "AllKeysWatch":
        return AllKeysWatch(self, start_revision, progress_every)


class AllKeysWatch:
    """A watch over every key from `start_revision`, asking etcd for a
    progress report every `progress_every` seconds so an idle source still
    tells its revision.  Iterate for WatchBatch values; close() ends it."""

    def __init__(self, client: EtcdClient, start_revision: int, progress_every: float) -> None:
        self._reqs: queue.Queue = queue.Queue()
        self._reqs.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=b"\0", range_end=b"\0", start_revision=start_revision)))
        self._call = client.watch_stub.Watch(iter(self._reqs.get, None), metadata=client.metadata)
        self._endpoint = client.endpoint
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(progress_every,), name="brain-mirror-progress",
                                        daemon=True)
        self._ticker.start()

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            self._reqs.put(rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest()))

    def __iter__(self) -> Iterator[WatchBatch]:
        try:
            for resp in self._call:
                if resp.compact_revision:
                    yield WatchBatch(resp.header.revision, compacted=resp.compact_revision)
                    return
                if resp.canceled:
                    raise SourceError(f"{self._endpoint}: watch canceled: {resp.cancel_reason or 'no reason'}")
                events = [Event(EVENT_PUT if ev.type == 0 else EVENT_DELETE, _kv(ev.kv)) for ev in resp.events]
                yield WatchBatch(resp.header.revision, events)
        except grpc.RpcError as e:
            if self._stop.is_set():
                return
            raise _error(e, f"{self._endpoint}: watch") from None

    def close(self) -> None:
        self._stop.set()
        self._reqs.put(None)
        self._call.cancel()
