"""What librdkafka's consumer callbacks report: commit answers, client errors, statistics.

librdkafka takes these callbacks in the consumer's configuration, before the consumer
exists, so what they write is made first: ``ConsumerEvents`` holds the owned partitions,
the lag statistics and the queue of commit answers that the rest of the loop is then
built around. Every callback runs on the loop thread, inside ``consume``.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from worker.core import Assignment, Clock, DeliveryTracker, monotonic_clock, wall_clock
from worker.delivery import CommitAnswers
from worker.kafka import KAFKA_LOG, LagStats, fatal_error, is_fatal
from worker.loop.metrics import LoopFamilies
from worker.ops import HealthState
from worker.pipeline import PipelineMetrics

__all__ = ["ConsumerEvents", "RetiredBatches"]

_BROKERS_UNUSABLE = frozenset(
    {KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION, KafkaError._SSL}
)
"""Client errors after which no broker can be used until something changes."""


class ConsumerEvents:
    """The consumer's ``on_commit``, ``error_cb`` and ``stats_cb``, and what they write."""

    def __init__(self, health: HealthState, metrics: LoopFamilies) -> None:
        self.owned = Assignment()
        self.lag = LagStats(metrics.consumer_lag, metrics.seconds_to_drain)
        self.on_commit = CommitAnswers()
        """Settled by the committer the next time it looks (``Committer``)."""
        self.fatal: KafkaError | None = None
        """The first fatal error ``error_cb`` reported: the consumer cannot go on."""
        self._health = health

    def on_error(self, err: KafkaError) -> None:
        """Client errors; a fatal one (librdkafka reports some only here, never in
        ``consume``) is kept for the loop thread, which stops the worker on its next turn:
        the consumer can do nothing more, and a worker left running would own nothing."""
        if err.code() in _BROKERS_UNUSABLE:
            self._health.broker(False, err.str())
        if is_fatal(err) and self.fatal is None:
            self.fatal = err
        KAFKA_LOG.error("kafka: %s", err.str())

    def raise_fatal(self) -> None:
        """Raise ``SourceError`` for a fatal client error reported since start-up."""
        if self.fatal is not None:
            raise fatal_error(self.fatal)

    def on_stats(self, raw: str) -> None:
        """librdkafka statistics: consumer lag per owned partition and seconds to drain."""
        health = self._health
        if self.lag.update(raw, self.owned.partitions):
            health.broker(True)
        elif health.broker_ok:
            health.broker(False, "no broker is up in librdkafka's statistics")


class RetiredBatches:
    """A committed batch's publish and end-to-end times (the committer's ``on_done``)."""

    def __init__(
        self,
        pipelines: dict[str, PipelineMetrics],
        clock: Clock = monotonic_clock,
        wall: Clock = wall_clock,
    ) -> None:
        """``clock`` is the one the trackers were sealed by; ``wall`` ages the records."""
        self._pipelines = pipelines
        self._clock = clock
        self._wall = wall

    def __call__(self, tracker: DeliveryTracker) -> None:
        m = self._pipelines.get(tracker.pipeline)
        if m is None:
            return
        if tracker.sealed_at:
            m.publish_seconds.observe(max(0.0, self._clock() - tracker.sealed_at))
        if tracker.oldest_ts_ms:
            m.end_to_end_seconds.observe(max(0.0, self._wall() - tracker.oldest_ts_ms / 1000.0))
