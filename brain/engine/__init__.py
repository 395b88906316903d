"""The engine ties the MVCC store to the journal and the value store:
group commit, recovery, checkpoints, compaction scheduling."""

from .config import EngineConfig
from .engine import DataDirLocked, Engine, EngineStatistics
from .hooks import ClusterHooks
from .replication import JOURNAL_SHORT_FOR

__all__ = ["ClusterHooks", "Engine", "EngineConfig", "EngineStatistics", "DataDirLocked", "JOURNAL_SHORT_FOR"]
