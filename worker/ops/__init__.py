"""Running the worker in production: how a unit declares its metrics, merged metrics,
health, logs, the process supervisor, the recovery in place and the process's garbage collector."""

from __future__ import annotations

from worker.ops.health import HealthServer, HealthState, HttpEndpoint, reload_response
from worker.ops.heap import settle_heap
from worker.ops.logs import setup_logging
from worker.ops.metrics import (
    METRIC_NAMES,
    SECONDS_BUCKETS,
    Declared,
    Families,
    OpsFamilies,
    counter,
    gauge,
    histogram,
)
from worker.ops.metrics_merge import MergedEndpoints
from worker.ops.recovery import RECOVERY_ENV, Recoveries
from worker.ops.supervisor import (
    PROCESSES_ENV,
    Supervisor,
    follow_supervisor,
    parse_processes,
    plan_for,
    supervised_index,
)

__all__ = [
    "METRIC_NAMES",
    "PROCESSES_ENV",
    "RECOVERY_ENV",
    "SECONDS_BUCKETS",
    "Declared",
    "Families",
    "HealthServer",
    "HealthState",
    "HttpEndpoint",
    "MergedEndpoints",
    "OpsFamilies",
    "Recoveries",
    "Supervisor",
    "counter",
    "follow_supervisor",
    "gauge",
    "histogram",
    "parse_processes",
    "plan_for",
    "reload_response",
    "settle_heap",
    "setup_logging",
    "supervised_index",
]
