"""The etcd version brain presents itself as: the one place to change it.

kube-apiserver turns on consistent reads from the watch cache and
RequestWatchProgress only for etcd servers reporting 3.6 or later
(Maintenance.Status ``version``), and brain implements what those need.
"""

ETCD_VERSION = "3.6.5"  # Status.version, etcd_server_version{server_version}
ETCD_CLUSTER_VERSION = "3.6.0"  # etcd_cluster_version{cluster_version}
STORAGE_VERSION = "3.6.0"  # Status.storageVersion, SnapshotResponse.version
