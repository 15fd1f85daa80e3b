"""The commands beside serving: ``check``, ``offsets`` and offset ranges, feature loading,
progress lines, and ``model inspect / optimize / compare``.

Each command loads only what it needs (``streamfer model inspect`` no Kafka client,
``offsets`` no numpy), so every name here is read from its module on first use
(``worker.core.lazy``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names

if TYPE_CHECKING:
    from worker.tools.check import check_pipeline
    from worker.tools.feature_loader import load_features
    from worker.tools.kafka_check import CheckLine, check_kafka
    from worker.tools.model_inspect import inspect_model
    from worker.tools.model_optimize import OptimizeOptions, convert_fp16, optimize_model
    from worker.tools.offsets import (
        KafkaOffsets,
        ResetTarget,
        lookup_consumer_config,
        parse_partitions,
        parse_time,
        reset_command,
        show_command,
    )
    from worker.tools.progress import ProgressLine
    from worker.tools.ranges import (
        Bounds,
        OffsetLookup,
        PartitionRange,
        parse_offset_bound,
        resolve_ranges,
    )
    from worker.tools.redis_check import check_sentinel
    from worker.tools.registry_check import check_registry

__all__ = [
    "Bounds",
    "CheckLine",
    "KafkaOffsets",
    "OffsetLookup",
    "OptimizeOptions",
    "PartitionRange",
    "ProgressLine",
    "ResetTarget",
    "check_kafka",
    "check_pipeline",
    "check_registry",
    "check_sentinel",
    "convert_fp16",
    "inspect_model",
    "load_features",
    "lookup_consumer_config",
    "optimize_model",
    "parse_offset_bound",
    "parse_partitions",
    "parse_time",
    "reset_command",
    "resolve_ranges",
    "show_command",
]

__getattr__ = lazy_names(
    __name__,
    {
        "check_pipeline": "check",
        "load_features": "feature_loader",
        "CheckLine": "kafka_check",
        "check_kafka": "kafka_check",
        "inspect_model": "model_inspect",
        "OptimizeOptions": "model_optimize",
        "optimize_model": "model_optimize",
        "convert_fp16": "model_optimize",
        "KafkaOffsets": "offsets",
        "ResetTarget": "offsets",
        "lookup_consumer_config": "offsets",
        "parse_partitions": "offsets",
        "parse_time": "offsets",
        "reset_command": "offsets",
        "show_command": "offsets",
        "ProgressLine": "progress",
        "check_registry": "registry_check",
        "check_sentinel": "redis_check",
        "Bounds": "ranges",
        "OffsetLookup": "ranges",
        "PartitionRange": "ranges",
        "parse_offset_bound": "ranges",
        "resolve_ranges": "ranges",
    },
)
