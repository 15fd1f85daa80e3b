"""Publishing results and dead letters with an idempotent producer.

Each batch gets one ``DeliveryTracker`` whose bound method is the delivery callback of
all its records, so per-record bookkeeping is a counter. A record the producer refuses
outright (too large, bad topic) counts as a failed delivery: the batch is then never
committed, and the failure is never dropped silently.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from worker.config import KafkaSettings

__all__ = ["DeliveryTracker", "Headers", "Sink", "producer_config"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]


class DeliveryTracker:
    """Counts outstanding deliveries of one batch and keeps the first errors."""

    __slots__ = ("errors", "pending", "sent")

    def __init__(self) -> None:
        self.pending = 0
        self.sent = 0
        self.errors: list[str] = []

    @property
    def done(self) -> bool:
        return self.pending == 0

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None and len(self.errors) < 10:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def refused(self, topic: str, reason: str) -> None:
        self.pending -= 1
        if len(self.errors) < 10:
            self.errors.append(f"{topic}: refused by producer: {reason}")


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """Idempotent, acks=all; user options may add security settings and tuning."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "error_cb": _log_error,
    }
    conf.update(settings.options)
    conf.update(settings.producer_options)
    return conf


def _log_error(err: KafkaError) -> None:
    log.error("producer error: %s", err.str())


class Sink:
    """Thin wrapper over ``confluent_kafka.Producer`` that never loses a refusal."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._produce = producer.produce
        self._poll = producer.poll

    @classmethod
    def from_settings(cls, settings: KafkaSettings) -> Sink:
        return cls(Producer(producer_config(settings)))

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers,
    ) -> None:
        """Queue one record; blocks only while the local queue is full."""
        tracker.pending += 1
        tracker.sent += 1
        while True:
            try:
                self._produce(topic, value, key, headers=headers, on_delivery=tracker.on_delivery)
                return
            except BufferError:
                self._poll(0.05)
            except KafkaException as exc:
                tracker.refused(topic, str(exc))
                return

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks."""
        return int(self._poll(timeout))

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; returns how many are still outstanding."""
        return int(self._producer.flush(timeout))

    def __len__(self) -> int:
        return len(self._producer)
