"""A brain cluster: replicas of one engine on a shared JetStream journal.

codec.py (bytes between replicas), forwarding.py (followers' writes to the
leader), election.py (who tries to lead), membership.py (who is in the
cluster, their client URLs and checkpoints), replica.py (the wiring that
`brain serve --journal-url` adds).  The engine's own part, following and
taking the lead, is brain/engine/replication.py; the journal is
brain/journal/jetstream.py.
"""

from .replica import ClusterOptions, Replica, jetstream_streams

__all__ = ["ClusterOptions", "Replica", "jetstream_streams"]
