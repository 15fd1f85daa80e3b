"""The loop's metrics: priority lanes and the in-flight bound, the partitions owned,
paused and behind, rebalances, and a share group's acknowledgements; with the children
of one pipeline in a share group (``for_share``), bound once."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from worker.ops import Families, counter, gauge, histogram

__all__ = ["THREAD_STAGES", "LoopFamilies", "ShareMetrics"]

THREAD_STAGES = ("decode", "infer", "publish")
"""The processing threads' stages, by index, as ``streamfer_stage_wait_seconds`` names
them (the first thread decodes and enriches)."""


@dataclass(frozen=True, slots=True)
class ShareMetrics:
    """Pre-bound children of one pipeline in a share group (``worker.loop.share_group``)."""

    accepted: Counter
    released: Counter
    redeliveries: Counter
    lock_overruns: Counter
    acknowledgement_errors: Counter


class LoopFamilies(Families):
    """The families the loop, its lanes, its membership and its consumer's events update."""

    stage_wait_seconds = histogram(
        "streamfer_stage_wait_seconds",
        "Seconds a batch waited for a processing thread (decode: the first, which also "
        "enriches; infer; publish): where a priority lane goes ahead",
        "pipeline",
        "stage",
    )
    aged_batches = counter(
        "streamfer_aged_batches",
        "Batches a processing thread took ahead of higher-priority ones because those had "
        "overtaken them for max_overtaken_ms (the higher priority is overloaded)",
        "pipeline",
        "stage",
    )
    pipeline_priority = gauge(
        "streamfer_pipeline_priority",
        "Each pipeline's priority as an integer (higher goes to the model first)",
        "pipeline",
    )
    in_flight_records = gauge(
        "streamfer_in_flight_records",
        "Records of each pipeline's uncommitted batches, counted against the in-flight bound",
        "pipeline",
    )
    in_flight_share_held = gauge(
        "streamfer_in_flight_share_held",
        "1 while a pipeline holds its share of the in-flight bound and only its "
        "partitions are paused",
        "pipeline",
    )
    paused_partitions = gauge("streamfer_paused_partitions", "Partitions paused for backpressure")
    assigned_partitions = gauge("streamfer_assigned_partitions", "Partitions this worker owns")
    consumer_lag = gauge(
        "streamfer_consumer_lag",
        "Records behind the log end, per owned partition",
        "topic",
        "partition",
    )
    seconds_to_drain = gauge(
        "streamfer_seconds_to_drain", "Total lag of owned partitions divided by recent throughput"
    )
    rebalances = counter("streamfer_rebalances", "Partition assignment changes", "kind")
    group_rejoins = counter(
        "streamfer_group_rejoins", "Rejoins to make the group rebalance: partitions no member owned"
    )
    share_acknowledged = counter(
        "streamfer_share_acknowledged_records",
        "Share groups: records this worker acknowledged, by type (accept: its result or "
        "dead letter was delivered; release: not delivered, the broker delivers it again)",
        "pipeline",
        "type",
    )
    share_redeliveries = counter(
        "streamfer_share_redeliveries",
        "Share groups: records received on a second or later delivery (a lock expired, "
        "or a member released them or died holding them)",
        "pipeline",
    )
    share_lock_overruns = counter(
        "streamfer_share_lock_overruns",
        "Share groups: records still being processed when their acquisition lock "
        "expired; the broker may have delivered them to another member meanwhile",
        "pipeline",
    )
    share_acknowledgement_errors = counter(
        "streamfer_share_acknowledgement_errors",
        "Share groups: records whose acknowledgement the broker answered with an error "
        "(they are delivered again)",
        "pipeline",
    )

    def for_share(self, name: str) -> ShareMetrics:
        acknowledged = self.share_acknowledged
        return ShareMetrics(
            accepted=acknowledged.labels(name, "accept"),
            released=acknowledged.labels(name, "release"),
            redeliveries=self.share_redeliveries.labels(name),
            lock_overruns=self.share_lock_overruns.labels(name),
            acknowledgement_errors=self.share_acknowledgement_errors.labels(name),
        )
