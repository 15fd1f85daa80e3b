"""The one fake of ``worker.kafka.Sink``: it records what it is handed, refuses a record
over the producer's limit as librdkafka does, and acknowledges at the next poll or
flush as a broker does, refusing what a compacted topic refuses."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from confluent_kafka import KafkaError, Message

from worker.core.tracker import DeliveryTracker
from worker.kafka.limits import RecordLimits, record_size
from worker.kafka.sink import Headers, Sink


def refused_batch(
    records: Sequence[tuple[str, bytes | None]], compacted: set[str] | frozenset[str]
) -> dict[int, KafkaError]:
    """Which of one produce batch's ``(topic, key)`` records a broker refuses when
    ``compacted`` topics compact, and with what: once one record of such a topic has no
    key, Apache Kafka refuses that topic's whole batch; librdkafka reports INVALID_RECORD
    on the keyless records and ``_INVALID_DIFFERENT_RECORD`` on their batch-mates."""
    keyless = {topic for topic, key in records if key is None and topic in compacted}
    return {
        i: INVALID_RECORD if key is None else INVALID_DIFFERENT_RECORD
        for i, (topic, key) in enumerate(records)
        if topic in keyless
    }


INVALID_RECORD = KafkaError(KafkaError.INVALID_RECORD, "Broker: Invalid record")
INVALID_DIFFERENT_RECORD = KafkaError(
    KafkaError._INVALID_DIFFERENT_RECORD,
    "Local: an invalid record in the same batch caused the failure of this message too",
)


@dataclass
class Sent:
    """One record handed to the sink; unpacks as ``(topic, value)``."""

    topic: str
    value: bytes
    key: bytes | None
    headers: Headers

    @property
    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(self.value)
        return doc

    def header(self, name: str) -> str | bytes | None:
        values = [v for k, v in self.headers if k == name]
        assert len(values) == 1, f"header {name} appears {len(values)} times"
        return values[0]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.topic, self.value))


@dataclass
class FakeSink:
    """Takes records like ``Sink``: counts them on the tracker, refuses one over the
    producer's limit; each is acknowledged at the next poll or flush, where the records
    queued since the last one are one produce batch: on a topic in ``compacted`` (the
    broker's side; the worker knows what ``limit`` says) a keyless record has the broker
    refuse that topic's whole batch."""

    limit: RecordLimits = field(default_factory=RecordLimits.unread)
    sent: list[Sent] = field(default_factory=list)
    unacked: list[tuple[DeliveryTracker, Message]] = field(default_factory=list)
    compacted: set[str] = field(default_factory=set)
    delivered: list[Message] = field(default_factory=list)
    """Every record the broker took, in order."""

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        if record_size(value, key, headers) > self.limit.message_max_bytes:
            return False
        tracker.sent += 1
        self.sent.append(Sent(topic, value, key, list(headers or ())))
        report = Message(
            topic=topic, partition=0, offset=len(self.sent), value=value, key=key, headers=headers
        )
        self.unacked.append((tracker, report))
        return True

    _queue = send  # no stamp here: the headers given are the record's
    resend = Sink.resend  # the real one, sending through ``send`` above

    def poll(self, timeout: float = 0.0) -> int:
        acked, self.unacked = self.unacked, []
        records = [(cast(str, msg.topic()), msg.key()) for _, msg in acked]
        refused = refused_batch(records, self.compacted)
        for i, (tracker, msg) in enumerate(acked):
            if i not in refused:
                self.delivered.append(msg)
            tracker.on_delivery(refused.get(i), msg)
        return len(acked)

    def flush(self, timeout: float) -> int:
        self.poll()
        return 0

    def delivered_to(self, topic: str) -> list[dict[str, Any]]:
        """The bodies of what the broker took on ``topic``."""
        return [orjson.loads(m.value() or b"") for m in self.delivered if m.topic() == topic]

    def to(self, topic: str) -> list[Sent]:
        """What was handed over for ``topic``."""
        return [s for s in self.sent if s.topic == topic]

    def by_offset(self) -> dict[int, Sent]:
        """What was handed over, by its source record's offset (one record each)."""
        out: dict[int, Sent] = {}
        for s in self.sent:
            offset = int(s.header("streamfer.source_offset") or b"-1")
            assert offset not in out, f"offset {offset} got two records"
            out[offset] = s
        return out
