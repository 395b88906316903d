"""The etcd version brain presents itself as: the one place to change it.

Every place that names an etcd version reads it from here: Status, the
metrics and /version, `brain --version`, and the etcd databases brain
writes (snapshots).

kube-apiserver turns on consistent reads from the watch cache and
RequestWatchProgress only for etcd servers reporting 3.6 or later
(Maintenance.Status ``version``), and brain implements what those need.
"""

ETCD_VERSION = "3.6.5"  # Status.version, etcd_server_version{server_version}
ETCD_CLUSTER_VERSION = "3.6.0"  # etcd_cluster_version{cluster_version}, a written db's cluster bucket
STORAGE_VERSION = "3.6.0"  # Status.storageVersion, SnapshotResponse.version, a written db's meta


def major_minor(version: str) -> str:
    """Major and minor ("3.6.5" -> "3.6"): how etcd names an API or a
    cluster version in its version output and metrics."""
    return ".".join(version.split(".")[:2])


# etcd derives its API version from its own (version.APIVersion).
ETCD_API_VERSION = major_minor(ETCD_VERSION)  # `brain --version`
