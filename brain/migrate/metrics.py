"""The metrics of `brain mirror`, read from Mirror.statistics() at scrape
time (next to the engine's own on the same /metrics):

  brain_mirror_source_revision        etcd's newest revision the mirror knows of
  brain_mirror_applied_revision       the newest revision durable in brain
  brain_mirror_lag_revisions          the difference
  brain_mirror_lag_seconds            how long ago etcd reached the oldest revision not yet applied
  brain_mirror_revisions_total        revisions applied since the copy
  brain_mirror_events_total           events (puts and deletes) applied since the copy
  brain_mirror_leases                 leases held (as etcd's)
  brain_mirror_lease_grants_total / brain_mirror_lease_revokes_total
  brain_mirror_compact_revision       etcd's compaction revision, as applied
  brain_mirror_following              1 while following etcd, 0 while copying, draining or stopped
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class MirrorCollector:
    def __init__(self, mirror) -> None:
        self.mirror = mirror

    def describe(self):
        return []

    def collect(self):
        st = self.mirror.statistics()

        def gauge(name, doc, value):
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name, doc, value):
            return CounterMetricFamily(name, doc, value=value)

        yield gauge("brain_mirror_source_revision", "etcd's newest revision known to the mirror.",
                    st.source_revision)
        yield gauge("brain_mirror_applied_revision", "The newest revision durable in brain.", st.applied_revision)
        yield gauge("brain_mirror_lag_revisions", "Revisions etcd has that brain has not applied yet.",
                    st.lag_revisions)
        yield gauge("brain_mirror_lag_seconds", "Seconds since etcd reached the oldest revision not yet "
                    "applied (0 when caught up).", st.lag_seconds)
        yield counter("brain_mirror_revisions_total", "Revisions applied since the copy.", st.revisions_applied)
        yield counter("brain_mirror_events_total", "Events applied since the copy.", st.events_applied)
        yield gauge("brain_mirror_leases", "Leases held, as etcd's.", st.leases)
        yield counter("brain_mirror_lease_grants_total", "Lease grants copied from etcd.", st.leases_granted)
        yield counter("brain_mirror_lease_revokes_total", "Lease revokes and expiries copied from etcd.",
                      st.leases_revoked)
        yield gauge("brain_mirror_compact_revision", "etcd's compaction revision, as applied.", st.compact_revision)
        yield gauge("brain_mirror_following", "1 while following etcd.", 1 if st.phase == "following" else 0)
