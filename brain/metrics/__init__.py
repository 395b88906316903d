"""Prometheus metrics and health endpoints (--listen-metrics-urls).

Nothing in the core imports this package: it reads the statistics the
engine, its alarm set, its watch manager and the gRPC interceptor already
keep, at scrape time, and hangs two duration observers on the engine's hooks
(journal fdatasync, checkpoint write).  Metric names are etcd's where the
meaning matches, so etcd dashboards and alerts work; brain-only numbers are
named brain_*.
"""

from .collector import BrainCollector, build_registry
from .health import Health, check_health
from .server import MetricsServer

__all__ = ["BrainCollector", "Health", "MetricsServer", "build_registry", "check_health"]
