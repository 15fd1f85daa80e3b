"""Publishing results and dead letters with an idempotent producer.

Each batch gets one ``DeliveryTracker`` whose bound method is the delivery callback of
all its records, so per-record bookkeeping is a counter. A failure that is about one
record (too large, refused as invalid) is that record's: ``send`` says so for a record
the producer refuses at once, and the tracker keeps those the broker refuses for the
worker to dead-letter, so the batch is committed once they are. A keyless record for a
compacted topic is never produced (the broker would refuse its whole produce batch,
keyed batch-mates included): ``send`` counts it refused, and the pipeline dead-letters
a keyless result before it gets here. Any other failure (an
unknown topic, the broker unreachable past the delivery timeout) counts as a failed
delivery: the batch is then never committed, and the failure is never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from worker.config import KafkaSettings
from worker.core import RESENDS_PER_RECORD, DeliveryTracker
from worker.kafka.client_logs import KAFKA_LOG
from worker.kafka.limits import NEEDS_A_KEY, RecordLimits, cap_batch_size

__all__ = ["LINGER_MS", "LOW_LATENCY_LINGER_MS", "Headers", "Sink", "producer_config"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]


LINGER_MS = 1
"""The producer's default ``linger.ms``: a batch's results are produced in one go, so
one millisecond lets them leave in one request, and the batch window has already done
the waiting that batching needs. librdkafka's own 5 ms also merged consecutive full
batches under a backlog (5-15% more records/s draining one) at the price of 4-5 ms on
every result at a steady rate; ``producer_options`` can set it back."""
LOW_LATENCY_LINGER_MS = 0
"""The default for a worker with an adaptive pipeline: its batch is handed over the
moment the model is idle, so waiting again before producing its results gains nothing
that is worth their latency (records queued while a request is in flight still travel
together)."""


def producer_config(
    settings: KafkaSettings, limits: RecordLimits | None = None, *, linger_ms: int = LINGER_MS
) -> dict[str, Any]:
    """Idempotent, acks=all, ``linger_ms``; user options may add security settings and
    tuning (a ``linger.ms`` of theirs wins). With ``limits``, batches stay under the
    smallest topic limit."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "compression.type": "lz4",
        "error_cb": _log_error,
        "logger": KAFKA_LOG,
    }
    conf.update(settings.client_options())
    conf.update(settings.producer_options)
    if limits is not None:
        cap_batch_size(conf, limits)
    return conf


def _log_error(err: KafkaError) -> None:
    KAFKA_LOG.error("producer error: %s", err.str())


Queued = Callable[[DeliveryTracker, str], object]
"""Hears each record ``Sink.send`` queued (or counted refused): its tracker and topic."""


class Sink:
    """Thin wrapper over ``confluent_kafka.Producer`` that never loses a refusal.

    The seam every publisher sends through: ``producer`` is whatever takes the records
    (a ``Producer``; ``streamfer check`` hands one that keeps them), ``stamp`` a header
    added to every record and ``on_queued`` what hears each one queued (a replay marks
    its records and counts each batch's results and dead letters), so no caller
    writes its own ``send``."""

    def __init__(
        self,
        producer: Producer,
        limits: RecordLimits | None = None,
        *,
        stamp: tuple[str, bytes] | None = None,
        on_queued: Queued | None = None,
    ) -> None:
        self.limit = limits or RecordLimits.unread()
        """The largest record (value, key and headers) a topic takes: ``limit(topic)``."""
        self.producer = producer
        self._producer = producer
        self._produce = producer.produce
        self._poll = producer.poll
        self._stamp = stamp
        self._on_queued = on_queued

    @classmethod
    def from_settings(
        cls,
        settings: KafkaSettings,
        limits: RecordLimits | None = None,
        *,
        linger_ms: int = LINGER_MS,
    ) -> Sink:
        return cls(Producer(producer_config(settings, limits, linger_ms=linger_ms)), limits)

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        """Queue one record; blocks only while the local queue is full. False: the
        producer refused this record for its size, and the caller dead-letters it. A
        keyless record for a compacted topic (``limit.compacted``) is counted refused
        by the producer, never produced."""
        if self._stamp is not None:
            headers = [*(headers or ()), self._stamp]
        return self._queue(tracker, topic, value, key, headers)

    def _queue(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        """``send`` of a record whose headers are final (stamped once already)."""
        if key is None and topic in self.limit.compacted:
            tracker.sent += 1
            tracker.refused_by_producer(topic, f"{NEEDS_A_KEY}, and this record has none")
        else:
            while True:
                try:
                    self._produce(
                        topic, value, key, headers=headers, on_delivery=tracker.on_delivery
                    )
                    tracker.sent += 1
                    break
                except BufferError:
                    self._poll(0.05)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    if isinstance(err, KafkaError) and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                        return False
                    tracker.sent += 1
                    tracker.refused_by_producer(topic, str(exc))
                    break
        if self._on_queued is not None:
            self._on_queued(tracker, topic)
        return True

    def resend(self, tracker: DeliveryTracker, record: Message) -> None:
        """Send ``record`` again, as it was (a batch-mate's refusal failed it). Past
        ``RESENDS_PER_RECORD`` per record of the batch, the batch fails instead."""
        if tracker.resent >= RESENDS_PER_RECORD * max(1, tracker.sent - tracker.resent):
            tracker.fail(f"{record.topic()}: refused with its batch-mates again and again")
            return
        tracker.resent += 1
        headers = cast("Headers | None", record.headers())  # stamped when first sent
        self._queue(tracker, str(record.topic()), record.value() or b"", record.key(), headers)

    def warm_up(self, topics: list[str], timeout: float = 10.0) -> None:
        """Fetch the topics' metadata now, so the first batch does not wait for it (about
        a quarter of a second per new topic on the local broker). A topic the broker
        reports an error for is logged; its first delivery will fail loudly."""
        for topic in dict.fromkeys(topics):
            try:
                meta = self._producer.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException as exc:
                log.warning("no metadata for topic %s yet: %s", topic, exc)
                continue
            if meta is None or meta.error is not None:
                log.warning("topic %s: %s", topic, meta.error.str() if meta else "not in metadata")

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks."""
        return int(self._poll(timeout))

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; returns how many are still outstanding."""
        return int(self._producer.flush(timeout))

    def __len__(self) -> int:
        return len(self._producer)
