"""Everything that talks to Kafka: the consumer (source), the producer (sink), the admin
client, topics, record limits, headers, client logs, transactions, lag, stalled calls,
group coverage, and a share group's consumer and configuration.

``ChildGroupReader`` and ``child_settings`` are read from ``group_reads`` on first use
(``worker.core.lazy``): that module is also a child process's entry point, ``python -m
worker.kafka.group_reads``, which imports this package first and must not find itself
imported already."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names
from worker.kafka.admin import COORDINATOR_WAIT_S, admin_client, coordinator_settling
from worker.kafka.call_watch import CALL_TIMEOUT_S, STALL_MARGIN_S, CallWatch
from worker.kafka.client_logs import KAFKA_LOG
from worker.kafka.group_coverage import GroupCoverage
from worker.kafka.headers import (
    MAX_RESULT_HEADERS_BYTES,
    SourceHeaders,
    reason_header,
    trace_headers,
)
from worker.kafka.lag import LagStats
from worker.kafka.limits import (
    DEFAULT_MESSAGE_MAX_BYTES,
    NEEDS_A_KEY,
    RECORD_OVERHEAD,
    RecordLimits,
    headers_size,
    record_size,
)
from worker.kafka.share_group import (
    ShareGroupSettings,
    describe_share_group,
    prepare_share_group,
)
from worker.kafka.share_source import ShareSource, share_consumer_config
from worker.kafka.sink import LINGER_MS, LOW_LATENCY_LINGER_MS, Headers, Sink, producer_config
from worker.kafka.source import (
    Source,
    consumer_config,
    end_of_partition,
    fatal_error,
    is_fatal,
    position,
)
from worker.kafka.topics import create_missing, ensure_topics
from worker.kafka.transactions import (
    transactional_id,
    transactional_producer,
    verify_isolation,
)

if TYPE_CHECKING:
    from worker.kafka.group_reads import ChildGroupReader, child_settings

__all__ = [
    "CALL_TIMEOUT_S",
    "COORDINATOR_WAIT_S",
    "DEFAULT_MESSAGE_MAX_BYTES",
    "KAFKA_LOG",
    "LINGER_MS",
    "LOW_LATENCY_LINGER_MS",
    "MAX_RESULT_HEADERS_BYTES",
    "NEEDS_A_KEY",
    "RECORD_OVERHEAD",
    "STALL_MARGIN_S",
    "CallWatch",
    "ChildGroupReader",
    "GroupCoverage",
    "Headers",
    "LagStats",
    "RecordLimits",
    "ShareGroupSettings",
    "ShareSource",
    "Sink",
    "Source",
    "SourceHeaders",
    "admin_client",
    "child_settings",
    "consumer_config",
    "coordinator_settling",
    "create_missing",
    "describe_share_group",
    "end_of_partition",
    "ensure_topics",
    "fatal_error",
    "headers_size",
    "is_fatal",
    "position",
    "prepare_share_group",
    "producer_config",
    "reason_header",
    "record_size",
    "share_consumer_config",
    "trace_headers",
    "transactional_id",
    "transactional_producer",
    "verify_isolation",
]

__getattr__ = lazy_names(
    __name__, {"ChildGroupReader": "group_reads", "child_settings": "group_reads"}
)
