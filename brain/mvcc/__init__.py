"""The MVCC core: revisions, key index, shards, Txn, compaction, leases.

Pure logic: the only I/O is through the value store object handed to Store.
"""

from .errors import EtcdError
from .checkpoint import CheckpointCut
from .store import Store

__all__ = ["EtcdError", "Store", "CheckpointCut"]
