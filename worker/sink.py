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
import threading
import time
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from worker.config import KafkaSettings
from worker.kafka_logs import KAFKA_LOG
from worker.limits import NEEDS_A_KEY, RecordLimits, cap_batch_size
from worker.types import Refusal, Source

__all__ = ["RECORD_ERRORS", "DeliveryTracker", "Headers", "Sink", "producer_config"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]

RECORD_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
    }
)
"""Delivery errors about one record, not about the broker or the producer."""

INNOCENT = KafkaError._INVALID_DIFFERENT_RECORD
"""A record refused only because another record of its produce batch was: sent again."""

RESENDS_PER_RECORD = 3
"""How often, on average, a batch's records may be sent again before the batch fails."""

NO_REFUSALS: Mapping[Source, Refusal] = MappingProxyType({})


class DeliveryTracker:
    """Counts the deliveries of one batch and keeps the first errors.

    The batch is ``done`` once it is ``sealed`` (every record was handed to the producer)
    and every record was acknowledged or refused. Records are sent from the processing
    thread while delivery reports may arrive on any thread that polls the producer, so
    the acknowledgement count is guarded by a lock, and so are ``undeliverable`` and the
    decision to queue the tracker for dead-lettering: a report may arrive on a processing
    thread while the loop thread takes the batch's earlier refusals.
    """

    __slots__ = (
        "_keep_refused",
        "_lock",
        "_notify",
        "acked",
        "context",
        "errors",
        "oldest_ts_ms",
        "pipeline",
        "refusals",
        "refused",
        "resend",
        "resent",
        "sealed",
        "sealed_at",
        "sent",
        "undeliverable",
    )

    def __init__(
        self,
        pipeline: str = "",
        oldest_ts_ms: int = 0,
        reroute: deque[DeliveryTracker] | None = None,
        *,
        keep_refused: bool = False,
        refusals: Mapping[Source, Refusal] = NO_REFUSALS,
    ) -> None:
        """With ``reroute``, a record the broker refuses for itself (``RECORD_ERRORS``) is
        kept in ``undeliverable``, one refused only for a batch-mate (``INNOCENT``) in
        ``resend``, and the tracker queued there for whoever dead-letters or re-sends
        them; the batch is not done until that is handled. Without, it is a failure;
        ``keep_refused`` (exactly-once, whose transaction must then abort) keeps it in
        ``undeliverable`` as well, for the next try to dead-letter. ``refusals``: the
        requests the broker refused a record of on an earlier try, by source; the
        publisher sends their dead letters instead."""
        self._lock = threading.Lock()
        self._notify = reroute
        self._keep_refused = keep_refused
        self.refusals = refusals
        self.pipeline = pipeline
        self.oldest_ts_ms = oldest_ts_ms
        self.sent = 0
        self.acked = 0
        self.refused = 0
        self.sealed = False
        self.sealed_at = 0.0
        self.errors: list[str] = []
        self.undeliverable: list[tuple[Message, str]] = []
        self.resend: list[Message] = []
        """With ``reroute``: records refused only for a batch-mate (``INNOCENT``)."""
        self.resent = 0
        self.context: object = None
        """What the publisher needs to dead-letter an undeliverable record (its batch)."""

    @property
    def done(self) -> bool:
        return (
            self.sealed
            and self.acked + self.refused == self.sent
            and not self.undeliverable
            and not self.resend
        )

    @property
    def pending(self) -> int:
        return self.sent - self.acked - self.refused

    def seal(self) -> None:
        """No more records will be sent for this batch."""
        self.sealed_at = time.monotonic()
        self.sealed = True

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        # The error is recorded before the acknowledgement counts: the loop thread may see
        # the batch done the moment ``acked`` reaches ``sent``, and must see its errors then.
        with self._lock:
            if err is not None:
                code = err.code()
                refused = code in RECORD_ERRORS
                if (refused or code == INNOCENT) and self._notify is not None:
                    # queued when both lists were empty, that is when no one holds them to
                    # drain: ``take_undelivered`` empties them under this same lock
                    if not self.undeliverable and not self.resend:
                        self._notify.append(self)
                    if refused:
                        self.undeliverable.append((msg, err.str()))
                    else:
                        self.resend.append(msg)
                else:
                    if refused and self._keep_refused:
                        self.undeliverable.append((msg, err.str()))
                    if len(self.errors) < 10:
                        self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            self.acked += 1

    def take_undeliverable(self) -> tuple[Message, str] | None:
        """The next record the broker refused for itself and why, for its dead letter, or
        None when there is none left. Whoever took the tracker from the queue calls this
        until None: a refusal reported after that None queues the tracker again, one
        reported before it is returned here, so none is left in a tracker no one holds."""
        with self._lock:
            return self.undeliverable.pop() if self.undeliverable else None

    def take_undelivered(self) -> tuple[Message, str | None] | None:
        """Like ``take_undeliverable``, with the records to send again as well: ``(record,
        None)`` for one refused only for a batch-mate; None once both lists are empty."""
        with self._lock:
            if self.resend:
                return self.resend.pop(), None
            return self.undeliverable.pop() if self.undeliverable else None

    def refused_by_producer(self, topic: str, reason: str) -> None:
        self.refused += 1
        if len(self.errors) < 10:
            self.errors.append(f"{topic}: refused by producer: {reason}")

    def fail(self, reason: str) -> None:
        """The batch as a whole failed (an aborted transaction, say): never commit it."""
        self.errors.append(reason)


def producer_config(settings: KafkaSettings, limits: RecordLimits | None = None) -> dict[str, Any]:
    """Idempotent, acks=all; user options may add security settings and tuning. With
    ``limits``, batches stay under the smallest topic limit."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
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


class Sink:
    """Thin wrapper over ``confluent_kafka.Producer`` that never loses a refusal."""

    def __init__(self, producer: Producer, limits: RecordLimits | None = None) -> None:
        self.limit = limits or RecordLimits.unread()
        """The largest record (value, key and headers) a topic takes: ``limit(topic)``."""
        self.producer = producer
        self._producer = producer
        self._produce = producer.produce
        self._poll = producer.poll

    @classmethod
    def from_settings(cls, settings: KafkaSettings, limits: RecordLimits | None = None) -> Sink:
        return cls(Producer(producer_config(settings, limits)), limits)

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
        if key is None and topic in self.limit.compacted:
            tracker.sent += 1
            tracker.refused_by_producer(topic, f"{NEEDS_A_KEY}, and this record has none")
            return True
        while True:
            try:
                self._produce(topic, value, key, headers=headers, on_delivery=tracker.on_delivery)
                tracker.sent += 1
                return True
            except BufferError:
                self._poll(0.05)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    return False
                tracker.sent += 1
                tracker.refused_by_producer(topic, str(exc))
                return True

    def resend(self, tracker: DeliveryTracker, record: Message) -> None:
        """Send ``record`` again, as it was (a batch-mate's refusal failed it). Past
        ``RESENDS_PER_RECORD`` per record of the batch, the batch fails instead."""
        if tracker.resent >= RESENDS_PER_RECORD * max(1, tracker.sent - tracker.resent):
            tracker.fail(f"{record.topic()}: refused with its batch-mates again and again")
            return
        tracker.resent += 1
        headers = cast("Headers | None", record.headers())
        self.send(tracker, str(record.topic()), record.value() or b"", record.key(), headers)

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
