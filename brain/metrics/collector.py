"""The metric families, computed at scrape time from the engine's statistics.

etcd names used (their meaning in brain):

  etcd_mvcc_db_total_size_in_bytes          value store file + journal bytes since the checkpoint
  etcd_mvcc_db_total_size_in_use_in_bytes   value store in-use bytes + the same journal bytes
                                            (what --quota-backend-bytes is compared with)
  etcd_server_quota_backend_bytes           the quota
  etcd_debugging_mvcc_keys_total            live keys
  etcd_debugging_mvcc_current_revision      committed revision
  etcd_debugging_mvcc_compact_revision      compaction revision (-1: none)
  etcd_debugging_mvcc_watcher_total         watchers          (from the watch manager, 0 without one)
  etcd_debugging_mvcc_slow_watcher_total    unsynced watchers
  etcd_debugging_mvcc_watch_stream_total    watch streams
  etcd_debugging_mvcc_pending_events_total  events queued on watch streams, not yet taken by their reader
  etcd_server_proposals_pending             writes queued for the committer's next turn
  etcd_debugging_server_lease_expired_total leases revoked by expiry
  etcd_debugging_server_alarms              raised alarms {member_id, alarm_type}
  etcd_server_has_leader / is_leader        a leader is known / this replica leads (a single node: 1, 1)
  etcd_server_leader_changes_seen_total     terms seen (a single node: 1, it leads from the start)
  etcd_server_is_learner                    0
  etcd_server_version{server_version}       1 for the etcd version brain reports
  etcd_cluster_version{cluster_version}     1 for the cluster version
  etcd_server_id{server_id}                 1 for the member ID in hex
  etcd_disk_wal_fsync_duration_seconds      journal fdatasync per committed batch (histogram)
  etcd_disk_backend_commit_duration_seconds checkpoint writes to the value store (histogram)
  grpc_server_started_total, grpc_server_handled_total, grpc_server_msg_received_total,
  grpc_server_msg_sent_total                per gRPC method, as go-grpc-prometheus

brain's own: brain_engine_batches_total, brain_engine_requests_total (group
commit: requests / batches is the batching factor), brain_checkpoints_total,
brain_checkpoint_last_duration_seconds, brain_journal_bytes_since_checkpoint,
brain_backend_size_bytes, brain_backend_in_use_bytes, brain_memtable_records,
brain_index_keys (keys in the index, deleted ones not yet compacted included),
brain_leases, brain_engine_failed (1 once a journal failure stopped writes),
brain_limit_hits_total{limit} (LimitsCollector: every bound on what clients
can make the server hold, by its flag).
On a cluster replica also brain_cluster_term, brain_journal_applied_index,
brain_cluster_forwarded_writes_total, brain_cluster_forward_retries_total and
brain_read_index_round_trips_total.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from brain.engine.alarms import ALARM_NAMES
from brain.etcd_version import ETCD_CLUSTER_VERSION, ETCD_VERSION, major_minor

log = logging.getLogger("brain.metrics")

# etcd: prometheus.ExponentialBuckets(0.001, 2, 14), 1 ms .. 8.192 s
DISK_BUCKETS = tuple(0.001 * 2**i for i in range(14))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _info(name: str, doc: str, label: str, value: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[label])
    g.add_metric([value], 1)
    return g


class BrainCollector:
    """A custom collector: every value is read when Prometheus scrapes."""

    def __init__(self, engine, grpc_stats=None) -> None:
        self.engine = engine
        self.grpc_stats = grpc_stats

    def describe(self):
        return []  # no registration-time collect()

    def collect(self):
        eng = self.engine
        st = eng.statistics()
        journal = st.journal_bytes_since_checkpoint
        yield _gauge("etcd_mvcc_db_total_size_in_bytes",
                     "Total size of the underlying database physically allocated in bytes.",
                     st.backend_size_bytes + journal)
        yield _gauge("etcd_mvcc_db_total_size_in_use_in_bytes",
                     "Total size of the underlying database logically in use in bytes.",
                     st.backend_in_use_bytes + journal)
        yield _gauge("etcd_server_quota_backend_bytes", "Current backend storage quota size in bytes.",
                     eng.config.quota_backend_bytes)
        yield _gauge("etcd_debugging_mvcc_keys_total", "Total number of keys.", st.keys_live)
        yield _gauge("etcd_debugging_mvcc_current_revision", "The current revision of store.",
                     st.committed_revision)
        yield _gauge("etcd_debugging_mvcc_compact_revision", "The revision of the last compaction in store.",
                     st.compact_revision)

        watchers = slow = streams = 0
        watches = getattr(eng, "watches", None)
        if watches is not None and hasattr(watches, "statistics"):
            try:
                watchers, slow, streams = watches.statistics()
            except Exception:  # noqa: BLE001 - a scrape must not fail on this
                log.debug("watch statistics unavailable", exc_info=True)
        yield _gauge("etcd_debugging_mvcc_watcher_total", "Total number of watchers.", watchers)
        yield _gauge("etcd_debugging_mvcc_slow_watcher_total", "Total number of unsynced slow watchers.", slow)
        yield _gauge("etcd_debugging_mvcc_watch_stream_total", "Total number of watch streams.", streams)
        yield _gauge("etcd_debugging_mvcc_pending_events_total", "Total number of pending events to be sent.",
                     _watch_limits(eng).get("pending_events", 0))
        yield _gauge("etcd_server_proposals_pending", "The current number of pending proposals to commit.",
                     st.pending_writes)

        yield _counter("etcd_debugging_server_lease_expired_total", "The total number of expired leases.",
                       st.leases_expired)

        alarms = GaugeMetricFamily("etcd_debugging_server_alarms", "Alarms for every member in cluster. "
                                   "1 for 'server_id' label with current ID. 2 for 'alarm_type' label "
                                   "with type of this alarm", labels=["member_id", "alarm_type"])
        for member, alarm in eng.alarms.get():
            alarms.add_metric([f"{member:x}", ALARM_NAMES.get(alarm, str(alarm))], 1)
        yield alarms

        leader_id = getattr(eng, "leader_id", eng.member_id)
        is_leader = getattr(eng, "is_leader", True)
        yield _gauge("etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.",
                     1 if leader_id else 0)
        yield _gauge("etcd_server_is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise.",
                     1 if is_leader else 0)
        yield _counter("etcd_server_leader_changes_seen_total", "The number of leader changes seen.",
                       getattr(eng, "leader_changes", 1))
        if getattr(eng, "cluster", None) is not None:
            yield from _cluster_metrics(eng, st)
        yield _gauge("etcd_server_is_learner", "Whether or not this member is a learner. 1 if is, 0 otherwise.", 0)
        yield _info("etcd_server_version", "Which version is running. 1 for 'server_version' label with "
                    "current version.", "server_version", ETCD_VERSION)
        yield _info("etcd_cluster_version", "Which version is running. 1 for 'cluster_version' label with "
                    "current cluster version", "cluster_version", major_minor(ETCD_CLUSTER_VERSION))
        yield _info("etcd_server_id", "Server or member ID in hexadecimal format. 1 for 'server_id' label "
                    "with current ID.", "server_id", f"{eng.member_id:x}")

        yield _counter("brain_engine_batches_total", "Write batches committed (one journal record and "
                       "fdatasync each).", st.batches)
        yield _counter("brain_engine_requests_total", "Write requests committed in those batches.", st.requests)
        yield _counter("brain_checkpoints_total", "Checkpoints written to the value store.", st.checkpoints)
        yield _gauge("brain_checkpoint_last_duration_seconds", "Duration of the last checkpoint write.",
                     st.last_checkpoint_seconds)
        yield _gauge("brain_journal_bytes_since_checkpoint", "Journal payload bytes not yet in the value store.",
                     journal)
        yield _gauge("brain_backend_size_bytes", "Value store file size.", st.backend_size_bytes)
        yield _gauge("brain_backend_in_use_bytes", "Value store bytes in pages holding data.",
                     st.backend_in_use_bytes)
        yield _gauge("brain_memtable_records", "Records held in memory, not yet checkpointed.", st.memtable_records)
        yield _gauge("brain_index_keys", "Keys in the key index (deleted ones awaiting compaction included).",
                     st.keys_total)
        yield _gauge("brain_leases", "Leases granted and not yet revoked or expired.", st.leases)
        yield _gauge("brain_engine_failed", "1 when a journal failure made the engine refuse writes until "
                     "restarted.", 1 if st.failed else 0)

        if self.grpc_stats is not None:
            yield from self._grpc()

    def _grpc(self):
        started, handled, received, sent = self.grpc_stats.snapshot()
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        fam = CounterMetricFamily("grpc_server_started_total", "Total number of RPCs started on the server.",
                                  labels=labels)
        for key, n in sorted(started.items()):
            fam.add_metric(list(key), n)
        yield fam
        fam = CounterMetricFamily("grpc_server_handled_total", "Total number of RPCs completed on the server, "
                                  "regardless of success or failure.", labels=[*labels, "grpc_code"])
        for key, n in sorted(handled.items()):
            fam.add_metric(list(key), n)
        yield fam
        fam = CounterMetricFamily("grpc_server_msg_received_total", "Total number of RPC stream messages "
                                  "received on the server.", labels=labels)
        for key, n in sorted(received.items()):
            fam.add_metric(list(key), n)
        yield fam
        fam = CounterMetricFamily("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent "
                                  "by the server.", labels=labels)
        for key, n in sorted(sent.items()):
            fam.add_metric(list(key), n)
        yield fam


def _watch_limits(eng) -> dict:
    watches = getattr(eng, "watches", None)
    if watches is None or not hasattr(watches, "limit_statistics"):
        return {}
    try:
        return watches.limit_statistics()
    except Exception:  # noqa: BLE001 - a scrape must not fail on this
        log.debug("watch statistics unavailable", exc_info=True)
        return {}


class LimitsCollector:
    """brain_limit_hits_total{limit}: how often each bound on what clients
    can make the server hold was reached, labelled by its flag (or, for
    etcd's fixed ones, its error):

      max-connections           a connection closed at once, that many being open
      max-concurrent-streams    a connection reached it (h2 refuses the streams beyond)
      max-connection-bytes      a connection's requests waited for its budget, or its
                                streams were reported full because of it
      max-watchers-per-stream   a watch create canceled ('mvcc: too many watchers on the WatchStream')
      watch-queue-events        a watcher moved to catch-up reads: its stream held too many
                                events, or its client did not read
      max-leases                a grant refused ('etcdserver: too many leases')
      too-many-requests         a write refused ('etcdserver: too many requests'), etcd's
                                5000 writes waiting

    The transport's are missing on grpcio.  etcd's request limits
    (--max-request-bytes, --max-txn-ops) are counted as etcd counts them,
    in grpc_server_handled_total by status code."""

    def __init__(self, engine, transport_stats=None) -> None:
        self.engine = engine
        self.transport_stats = transport_stats

    def describe(self):
        return []

    def collect(self):
        fam = CounterMetricFamily("brain_limit_hits_total", "Times a bound on what clients can make the server "
                                  "hold was reached, by the flag that sets it.", labels=["limit"])
        st = self.transport_stats() if self.transport_stats is not None else {}
        if "connections_refused" in st:
            fam.add_metric(["max-connections"], st["connections_refused"])
            fam.add_metric(["max-concurrent-streams"], st["streams_at_limit"])
            fam.add_metric(["max-connection-bytes"], st["received_full"] + st["queued_full"])
        watch = _watch_limits(self.engine)
        if watch:
            fam.add_metric(["max-watchers-per-stream"], watch["creates_refused"])
            fam.add_metric(["watch-queue-events"], watch["moved_to_catch_up"])
        es = self.engine.statistics()
        fam.add_metric(["max-leases"], getattr(es, "grants_refused", 0))
        fam.add_metric(["too-many-requests"], getattr(es, "writes_refused", 0))
        yield fam


class TransportCollector:
    """The API server's connection-level counters, read at scrape time from
    ``stats()`` (a dict; the transport's keys are missing when grpcio serves):

      brain_require_leader_streams, brain_require_leader_streams_ended_total
          (streams carrying etcd's hasleader metadata: open, and ended for
          want of a leader; brain.api.require_leader),

      brain_transport_connections_accepted_total, brain_transport_connections_open,
      brain_transport_http_requests_total, brain_transport_bad_requests_total
          (malformed HTTP/1.1 or garbage on the client port),
      brain_transport_keepalive_timeouts_total (connections closed for an
          unanswered keepalive ping),
      brain_transport_too_many_pings_total (clients pinging more often than
          --grpc-keepalive-min-time, sent away),
      brain_transport_connections_refused_total (closed at once: --max-connections
          were open), brain_transport_streams_open (calls and streams open, every
          connection), brain_transport_received_bytes and brain_transport_queued_bytes
          (what --max-connection-bytes counts, summed over connections: requests
          received and not yet answered, answers queued on streams and not yet written),
      brain_tls_handshake_failures_total{reason} (no_client_certificate,
          bad_certificate: e.g. signed by another CA, not_allowed: refused
          by --client-cert-allowed-cn/-hostname, revoked and crl_unusable:
          closed after the handshake by --client-crl-file, not_tls:
          plaintext on a TLS port, incompatible, alert_received, closed,
          timeout, other).
    """

    def __init__(self, stats) -> None:
        self.stats = stats

    def describe(self):
        return []

    def collect(self):
        st = self.stats()
        if not st:
            return
        if "require_leader_streams" in st:
            yield _gauge("brain_require_leader_streams", "Open streams (Watch, LeaseKeepAlive) whose client "
                         "set etcd's require-leader metadata (hasleader).", st["require_leader_streams"])
            yield _counter("brain_require_leader_streams_ended_total", "Require-leader streams ended with "
                           "'etcdserver: no leader' after three election timeouts without a leader.",
                           st["require_leader_ended"])
        if "connections_accepted" not in st:
            return  # grpcio: no transport counters
        yield _counter("brain_transport_connections_accepted_total", "Client connections accepted.",
                       st["connections_accepted"])
        yield _gauge("brain_transport_connections_open", "Client connections open.", st["connections_open"])
        yield _counter("brain_transport_http_requests_total", "Plain HTTP requests on the client port.",
                       st["http_requests"])
        yield _counter("brain_transport_bad_requests_total", "Malformed HTTP requests (or garbage) on the "
                       "client port, answered with an HTTP error and closed.", st["bad_requests"])
        yield _counter("brain_transport_keepalive_timeouts_total", "Connections closed because a keepalive "
                       "ping went unanswered.", st["keepalive_timeouts"])
        yield _counter("brain_transport_too_many_pings_total", "Connections sent away (GOAWAY "
                       "ENHANCE_YOUR_CALM) for pinging more often than --grpc-keepalive-min-time.",
                       st["too_many_pings"])
        yield _counter("brain_transport_connections_refused_total", "Client connections closed as soon as they "
                       "were accepted, --max-connections being open.", st["connections_refused"])
        yield _gauge("brain_transport_streams_open", "Calls and streams open, on every client connection.",
                     st["streams_open"])
        yield _gauge("brain_transport_received_bytes", "Request bytes received and not yet answered (or taken "
                     "by the server), every connection: what --max-connection-bytes bounds per connection.",
                     st["received_bytes"])
        yield _gauge("brain_transport_queued_bytes", "Response bytes queued on streams and not yet written, "
                     "every connection: what --max-connection-bytes bounds per connection.", st["queued_bytes"])
        fam = CounterMetricFamily("brain_tls_handshake_failures_total", "TLS handshakes refused or failed, "
                                  "by reason.", labels=["reason"])
        for reason, n in sorted(st["tls_handshake_failures"].items()):
            fam.add_metric([reason], n)
        yield fam


class Registry:
    """A registry of one engine's metrics, with its duration histograms
    attached to the engine's hooks until detach()."""

    def __init__(self, engine, grpc_stats=None, transport_stats=None) -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrainCollector(engine, grpc_stats))
        if transport_stats is not None:
            self.registry.register(TransportCollector(transport_stats))
        self.registry.register(LimitsCollector(engine, transport_stats))
        self.wal_fsync = Histogram("etcd_disk_wal_fsync_duration_seconds",
                                   "The latency distributions of fsync called by WAL.",
                                   buckets=DISK_BUCKETS, registry=self.registry)
        self.backend_commit = Histogram("etcd_disk_backend_commit_duration_seconds",
                                        "The latency distributions of commit called by backend.",
                                        buckets=DISK_BUCKETS, registry=self.registry)
        for c in (ProcessCollector, PlatformCollector, GCCollector):
            try:
                c(registry=self.registry)
            except Exception:  # noqa: BLE001 - e.g. no /proc: skip those metrics
                log.debug("%s unavailable", c.__name__, exc_info=True)
        getattr(engine, "journal_sync_hooks", []).append(self.wal_fsync.observe)
        getattr(engine, "checkpoint_hooks", []).append(self.backend_commit.observe)

    def detach(self) -> None:
        for hooks, fn in ((getattr(self.engine, "journal_sync_hooks", []), self.wal_fsync.observe),
                          (getattr(self.engine, "checkpoint_hooks", []), self.backend_commit.observe)):
            try:
                hooks.remove(fn)
            except ValueError:
                pass


def build_registry(engine, grpc_stats=None, transport_stats=None) -> Registry:
    return Registry(engine, grpc_stats, transport_stats)


def _cluster_metrics(eng, st):
    """A replica's view of its cluster (brain.cluster)."""
    yield _gauge("brain_cluster_term", "The term (epoch) of the journal's current leader.", eng.term)
    yield _gauge("brain_journal_applied_index", "Index of the last journal record this replica applied.",
                 st.applied_index)
    fwd = eng.forwarder
    yield _counter("brain_cluster_forwarded_writes_total", "Writes this replica forwarded to the leader.",
                   getattr(fwd, "forwarded", 0))
    yield _counter("brain_cluster_forwarded_txn_bytes_total", "Forwarded Txns sent as the bytes their "
                   "client sent rather than re-encoded.", getattr(fwd, "forwarded_as_bytes", 0))
    yield _counter("brain_cluster_forward_retries_total", "Forwarded batches sent again (no leader, or "
                   "the replica asked was not the leader).", getattr(fwd, "retried", 0))
    yield _counter("brain_read_index_round_trips_total", "Read-index round trips made for linearizable reads "
                   "(answered by the leader's lease or by a barrier record).",
                   getattr(eng, "read_index_round_trips", 0))
