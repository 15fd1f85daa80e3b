"""Batches in flight without records of their own, and their deliveries, for the tests
of what commits them."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from worker.core.job import Job
from worker.core.tracker import DeliveryTracker
from worker.core.types import PartitionKey


def sent(n: int) -> DeliveryTracker:
    """A tracker with ``n`` deliveries outstanding, as ``Sink.send`` leaves it."""
    tracker = DeliveryTracker()
    tracker.sent = n
    tracker.seal()
    return tracker


def job(
    tracker: DeliveryTracker,
    offsets: dict[PartitionKey, int],
    counts: dict[PartitionKey, int] | None = None,
) -> Job:
    """A batch in flight without records of its own (``counts`` are what it counts)."""
    return Job("p", [], tracker, offsets, counts=dict(counts or {}))


def deliver(tracker: DeliveryTracker, n: int = 1, err: KafkaError | None = None) -> None:
    for _ in range(n):
        tracker.on_delivery(err, Message(topic="res", partition=0))
