"""The etcd version brain presents itself as: the one place to change it.

Every place that names an etcd version reads it from here: Status, the
metrics and /version, `brain --version`, and the etcd databases brain
writes (snapshots).

brain behaves as etcd 3.7.3 (ETCD_VERSION): it serves KV.RangeStream, which
only 3.7 has and kube-apiserver 1.37 lists with, and answers a keys_only
Range from its index without leases, as 3.7 does (brain.mvcc.reads.index_only;
what else differs from 3.6: tests/differential/ETCD_BEHAVIOUR.md).
kube-apiserver reads Status ``version`` and turns off RequestWatchProgress
(and with it consistent reads from the watch cache) only below 3.4.31 and
on 3.5.0-3.5.12, so 3.7.3 keeps them on.

The cluster and storage versions stay 3.6: brain reports itself as an etcd
3.7.3 member of a cluster whose version is still 3.6, which is what such a
member reports during a rolling upgrade from 3.6 (Status storageVersion,
SnapshotResponse version, /version's etcdcluster and storage, the
cluster_version metric all 3.6).  Those are the versions written into the
etcd databases brain exports (snapshots), and etcd 3.6 refuses a database
of either version 3.7: a storage version 3.7.0 fails its schema check
("version \"3.7.0\" is not supported") and a cluster version 3.7 in the
cluster bucket its downgrade check; with both at 3.6, etcdutl and etcd
3.6 restore brain's snapshots, and etcd 3.7 too (it upgrades the storage
version itself).  tests/migrate/test_export_to_etcd.py restores them into
both.
"""

ETCD_VERSION = "3.7.3"  # Status.version, etcd_server_version{server_version}, /version's etcdserver
ETCD_CLUSTER_VERSION = "3.6.0"  # etcd_cluster_version{cluster_version}, a written db's cluster bucket
STORAGE_VERSION = "3.6.0"  # Status.storageVersion, SnapshotResponse.version, a written db's meta


def major_minor(version: str) -> str:
    """Major and minor ("3.7.3" -> "3.7"): how etcd names an API or a
    cluster version in its version output and metrics."""
    return ".".join(version.split(".")[:2])


# etcd derives its API version from its own (version.APIVersion).
ETCD_API_VERSION = major_minor(ETCD_VERSION)  # `brain --version`
