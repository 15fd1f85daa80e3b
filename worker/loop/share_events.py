"""What a share consumer's callbacks report: client errors, statistics, and the broker's
answers to acknowledgements.

A share group has no rebalance callbacks and no offsets: membership shows only in
librdkafka's statistics (``cgrp``: its join state and how many partitions the broker
assigned this member, shared with the others), and every acknowledgement gets an answer
through the acknowledgement-commit callback. Like ``ConsumerEvents``, whose error and
broker-health handling this reuses, every callback runs on the loop thread, inside the
consumer's poll or commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import orjson
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import Counter

from worker.loop.consumer_events import ConsumerEvents
from worker.loop.metrics import LoopFamilies
from worker.ops import HealthState

__all__ = ["ShareEvents"]

log = logging.getLogger(__name__)

_QUIET_S = 60.0
"""A refused acknowledgement is logged at most this often; the metric counts each."""


class ShareEvents:
    """The share consumer's ``error_cb``, ``stats_cb`` and acknowledgement answers."""

    def __init__(
        self,
        health: HealthState,
        metrics: LoopFamilies,
        group: str,
        route: Mapping[str, str],
    ) -> None:
        """``route``: each request topic's pipeline, whose metrics count the refused
        acknowledgements of its records."""
        self._events = ConsumerEvents(health, metrics)
        self._health = health
        self._metrics = metrics
        self._group = group
        self._errors: dict[str, Counter] = {
            topic: metrics.for_share(name).acknowledgement_errors for topic, name in route.items()
        }
        self._logged_at = -_QUIET_S
        self.assigned = 0
        """Partitions the broker assigned this member (every member may share them)."""

    def on_error(self, err: KafkaError) -> None:
        """Client errors, as ``ConsumerEvents.on_error``: a fatal one is kept."""
        self._events.on_error(err)

    def raise_fatal(self) -> None:
        """Raise ``SourceError`` for a fatal client error reported since start-up."""
        self._events.raise_fatal()

    def on_stats(self, raw: str) -> None:
        """librdkafka statistics: whether a broker is up, and the group membership."""
        self._events.on_stats(raw)
        group = orjson.loads(raw).get("cgrp") or {}
        assigned = int(group.get("assignment_size", 0) or 0)
        if group.get("join_state") == "steady" or assigned:
            self.joined()
        if assigned != self.assigned:
            self.assigned = assigned
            self._metrics.assigned_partitions.set(assigned)
            log.info(
                "share group %s: assigned %d partitions; owning %d partitions, shared with "
                "the group's other members",
                self._group,
                assigned,
                assigned,
            )

    @property
    def member(self) -> bool:
        """Joined the group (by statistics, or because records came)."""
        return self._health.joined

    def joined(self) -> None:
        """A member of the group: by statistics, or because records came."""
        if not self._health.joined:
            self._health.joined = True
            self._health.broker(True)

    def on_acknowledged(
        self, offsets: dict[TopicPartition, set[int]], error: KafkaException | None
    ) -> None:
        """The broker's answer to acknowledgements (the ShareSource's callback). A
        refused one leaves its records to the broker, which delivers them again."""
        failed = [(tp, records) for tp, records in offsets.items() if error or tp.error]
        if not failed:
            return
        for tp, records in failed:
            counter = self._errors.get(tp.topic)
            if counter is not None:
                counter.inc(len(records))
        now = time.monotonic()
        if now - self._logged_at >= _QUIET_S:
            self._logged_at = now
            log.warning(
                "share group %s refused acknowledgements of %d records (%s); the broker "
                "delivers them again",
                self._group,
                sum(len(r) for _, r in failed),
                error or "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp, _ in failed),
            )
