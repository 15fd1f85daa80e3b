"""Consumer lag and the time to drain it, from librdkafka's statistics.

librdkafka reports each owned partition's lag every ``statistics.interval.ms``;
``LagStats`` turns that into the per-partition lag gauge and ``seconds_to_drain`` (total
lag over the recent consume rate), the signal lag-based autoscaling watches. The rate is
smoothed over the statistics intervals, so one slow interval does not double the
estimate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

import orjson

from worker.core import Clock, PartitionKey, monotonic_clock
from worker.kafka.client_logs import BROKER_OUTAGES

__all__ = ["LagStats"]


class LagStats:
    """Loop thread only: ``consumed`` counts records, ``update`` reads a statistics JSON."""

    def __init__(
        self,
        lag_gauge: Any,
        drain_gauge: Any,
        clock: Clock = monotonic_clock,
    ) -> None:
        """``lag_gauge``: labelled (topic, partition); ``drain_gauge``: seconds to drain."""
        self._lag = lag_gauge
        self._drain = drain_gauge
        self._clock = clock
        self._consumed = 0
        self._rate = 0.0
        self._rate_at = (clock(), 0)

    def consumed(self, records: int) -> None:
        self._consumed += records

    def update(self, raw: str, owned: Collection[PartitionKey]) -> bool:
        """Take one statistics report; returns whether any broker is up."""
        stats = orjson.loads(raw)
        total = 0
        for topic, tstats in stats.get("topics", {}).items():
            for part, pstats in tstats.get("partitions", {}).items():
                if (topic, int(part)) not in owned:
                    continue
                lag = pstats.get("consumer_lag", -1)
                if lag >= 0:
                    self._lag.labels(topic, part).set(lag)
                    total += lag
        now = self._clock()
        then, count = self._rate_at
        if now > then:
            recent = (self._consumed - count) / (now - then)
            self._rate = recent if self._rate == 0 else 0.5 * self._rate + 0.5 * recent
        self._rate_at = (now, self._consumed)
        drain = 0.0 if total == 0 else (total / self._rate if self._rate > 0 else float("inf"))
        self._drain.set(drain)
        brokers = stats.get("brokers", {})
        BROKER_OUTAGES.seen(brokers)
        return any(b.get("state") == "UP" for b in brokers.values())

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Partitions no longer owned export no lag."""
        for topic, partition in partitions:
            with contextlib.suppress(KeyError):
                self._lag.remove(topic, str(partition))
