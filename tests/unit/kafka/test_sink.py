"""The sink never produces a record the broker would refuse with its whole batch."""

from __future__ import annotations

from typing import Any, cast

from worker.core.tracker import DeliveryTracker
from worker.kafka.limits import RecordLimits
from worker.kafka.sink import Sink


class Producer:
    """Keeps what it is asked to produce."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None, **_kw: Any) -> None:
        self.produced.append((topic, key))

    def poll(self, timeout: float) -> int:
        return 0


def test_a_keyless_record_for_a_compacted_topic_is_refused_without_producing_it() -> None:
    producer = Producer()
    sink = Sink(cast(Any, producer), RecordLimits(1_000_000, {}, compacted={"dlq"}))
    tracker = DeliveryTracker()
    assert sink.send(tracker, "dlq", b"{}", None, None)
    assert sink.send(tracker, "dlq", b"{}", b"k", None)
    assert sink.send(tracker, "res", b"{}", None, None)
    assert producer.produced == [("dlq", b"k"), ("res", None)]
    assert (tracker.sent, tracker.refused) == (3, 1)
    assert tracker.errors == [
        "dlq: refused by producer: compacted topic needs a key, and this record has none"
    ]


def test_linger_follows_the_batch_mode_unless_the_config_sets_it() -> None:
    from worker.compose import producer_linger_ms
    from worker.config import KafkaSettings, WorkerConfig
    from worker.kafka.sink import LINGER_MS, producer_config

    def config(mode: str, **kafka: Any) -> WorkerConfig:
        pipeline = {
            "name": "p",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": {"fields": ["a"]},
            "model": {"path": "m.onnx", "name": "m"},
            "batch": {"mode": mode},
        }
        return WorkerConfig.model_validate({"pipelines": [pipeline], "kafka": kafka})

    assert producer_linger_ms(config("fixed")) == LINGER_MS == 1
    assert producer_linger_ms(config("adaptive")) == 0
    chosen = config("adaptive", producer_options={"linger.ms": 2})
    conf = producer_config(chosen.kafka, linger_ms=producer_linger_ms(chosen))
    assert conf["linger.ms"] == 2, "the user's setting wins"
    assert producer_config(KafkaSettings(), linger_ms=0)["linger.ms"] == 0
