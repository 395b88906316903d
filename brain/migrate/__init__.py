"""Everything that reads or writes etcd's formats or follows a live etcd:
the way in to brain, the way back out, and snapshots (which are etcd
databases).

Inside, imports flow downward:

  mirror.py           `brain mirror`: import etcd's snapshot, then apply its Watch
  source.py           what the mirror asks of a live etcd, as plain values
                      (its gRPC client is brain.api.etcd_client: api alone speaks grpc)
  metrics.py          the mirror's Prometheus metrics, read from Mirror.statistics()
  snapshot.py         HashKV/Hash, taking, checking and restoring snapshots
  etcd_export.py      brain's history at a pinned revision as an etcd database
  etcd_import.py      an etcd database into a new brain data directory
  legacy_snapshot.py  reading brain's earlier snapshot format
  restore.py          DataDirBuilder: a new data directory, built aside and moved in whole
  etcddb/             etcd's database schema and codecs on top of bbolt (no brain storage)
  bbolt/              the bbolt file format: reader and writer (pure format)

Below the package: the engine (Engine.history() is the one way to read a
running engine's history), mvcc, backend.  Above it: the commands
(`brain import|mirror|snapshot`), api's Maintenance service and the
cluster's snapshots for new replicas.
"""
