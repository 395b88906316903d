"""etcd's database: its schema (buckets, revision keys, meta), the protobuf
messages it stores, and reading and writing whole databases and snapshots
on top of brain.migrate.bbolt.  Knows nothing of brain's own storage."""

from .proto import KeyValue, Lease
from .reader import DbStatus, DigestMismatch, EtcdDb, EtcdDbError, EtcdMeta, EtcdRunning, KeyRevision, data_dir_db, is_etcd_data_dir

__all__ = ["DbStatus", "DigestMismatch", "EtcdDb", "EtcdDbError", "EtcdMeta", "EtcdRunning", "KeyRevision", "KeyValue", "Lease",
           "data_dir_db", "is_etcd_data_dir"]
