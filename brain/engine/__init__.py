"""The engine ties the MVCC store to the journal and the value store:
group commit, recovery, checkpoints, compaction scheduling."""

from .config import EngineConfig
from .engine import DataDirLocked, Engine, EngineStatistics

__all__ = ["Engine", "EngineConfig", "EngineStatistics", "DataDirLocked"]
