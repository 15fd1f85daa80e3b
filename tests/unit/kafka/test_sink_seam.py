"""The sink seam: ``Sink`` stamps every record with the header it was given and tells
``on_queued`` of each record it queued or counted refused, so a replay needs no ``send``
of its own; ``streamfer check`` sends through it with a producer that keeps records."""

from __future__ import annotations

from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Producer

from worker.core import DeliveryTracker
from worker.kafka import RecordLimits, Sink
from worker.replay import ReplaySink
from worker.tools.check import KeepingProducer


class Recording:
    """Takes every record, or refuses the ones ``too_large`` names for their size."""

    def __init__(self, too_large: frozenset[bytes] = frozenset()) -> None:
        self.produced: list[tuple[str, bytes, Any]] = []
        self._too_large = too_large

    def produce(self, topic: str, value: bytes, key: bytes | None, **kw: Any) -> None:
        if value in self._too_large:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.produced.append((topic, value, kw["headers"]))

    def poll(self, timeout: float = 0.0) -> int:
        return 0


def test_every_record_is_stamped_and_heard_once_queued() -> None:
    producer = Recording(too_large=frozenset({b"huge"}))
    heard: list[tuple[int, str]] = []
    limits = RecordLimits(1_000_000, {}, compacted=["compact"])
    sink = Sink(
        cast(Producer, producer),
        limits,
        stamp=("mark", b"1"),
        on_queued=lambda tracker, topic: heard.append((id(tracker), topic)),
    )
    tracker = DeliveryTracker("p")
    assert sink.send(tracker, "out", b"v", b"k", [("h", b"x")])
    assert sink.send(tracker, "compact", b"v", None, None)  # keyless: counted refused
    assert not sink.send(tracker, "out", b"huge", b"k", None)  # the caller dead-letters it
    assert producer.produced == [("out", b"v", [("h", b"x"), ("mark", b"1")])]
    assert heard == [(id(tracker), "out"), (id(tracker), "compact")]
    assert tracker.sent == 2


def test_a_replay_counts_results_and_dead_letters_through_the_seam() -> None:
    producer = Recording()
    sink = ReplaySink(cast(Producer, producer), "r1", "dlq")
    tracker = DeliveryTracker("p")
    sink.send(tracker, "out", b"a", b"k", None)
    sink.send(tracker, "dlq", b"b", b"k", None)
    assert sink.outcomes[id(tracker)] == [1, 1]
    assert all(headers == [("streamfer.replay_id", b"r1")] for *_, headers in producer.produced)


def test_check_keeps_what_the_pipeline_sends_and_sees_it_delivered() -> None:
    kept = KeepingProducer()
    tracker = DeliveryTracker("p")
    Sink(cast(Producer, kept)).send(tracker, "out", b"v", b"k", None)
    tracker.seal()
    assert kept.records == [("out", b"v", b"k")]
    assert tracker.acked == tracker.sent == 1
