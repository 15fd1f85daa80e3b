"""The share loop at its edges: acceptances on their way when a record is served alone,
a last-delivery dead letter the broker refuses, a lock budget after one slow poll, and
the settings the at-least-once promise rests on. Each failed before its fix."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from streamfer_dev.modelgen import DemoModel
from tests.fakes.clock import FakeClock
from tests.fakes.share import FakeShareConsumer, request, share_worker
from tests.fakes.sink import FakeSink
from tests.fakes.worker import TOPIC
from worker.config import KafkaSettings
from worker.kafka.share_group import _limits


@dataclass
class AsyncAckConsumer(FakeShareConsumer):
    """librdkafka's split (rdkafka_share_acknowledgement.c): commit_async moves the acks
    out of the in-flight map into the leader's async list, sent and answered later;
    commit_sync sends (and waits for) only the acks still in the in-flight map."""

    on_the_way: list[list[tuple[Any, str]]] = field(default_factory=list)

    def commit_async(self) -> None:
        with self._lock:
            batch, self._unsent = self._unsent, []
            if batch:
                self.on_the_way.append(batch)

    def commit_sync(self, timeout: float = 60) -> dict[TopicPartition, KafkaException | None]:
        with self._lock:
            self._send()  # only what commit_async has not taken
        return {}

    def poll(self, timeout: float = -1) -> list[Message]:
        with self._lock:
            self.sent += self.on_the_way  # answered by now
            self.on_the_way = []
        return super().poll(timeout)


def test_a_single_starts_only_once_every_earlier_accept_is_answered(
    classifier: DemoModel,
) -> None:
    consumer = AsyncAckConsumer(max_poll=8)
    rig = share_worker(classifier, limit=5, batch=4, consumer=consumer)
    consumer.waiting += [request(i, count=3) for i in range(3)]
    consumer.waiting += [request(3), request(4)]
    unanswered_at_submit: list[int] = []
    submit = rig.worker._threads.submit

    def watching(job: Any) -> None:
        if len(job.batch) == 1 and (job.batch[0].delivery_count() or 1) >= 3:
            unanswered_at_submit.append(sum(len(b) for b in consumer.on_the_way))
        submit(job)

    rig.worker._threads.submit = watching  # type: ignore[method-assign]
    rig.worker.run_once()
    # every single must start with all earlier ACCEPTs answered by the broker
    assert unanswered_at_submit == [0, 0, 0]


@dataclass
class SmallDlqSink(FakeSink):
    """The broker refuses dead letters over ``max_dlq`` bytes (the dead-letter topic's
    max.message.bytes, lower than the limit the worker knows)."""

    max_dlq: int = 1500

    def poll(self, timeout: float = 0.0) -> int:
        acked, self.unacked = self.unacked, []
        for tracker, msg in acked:
            if msg.topic() == "dlq" and len(msg.value() or b"") > self.max_dlq:
                err = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")
                tracker.on_delivery(err, msg)
            else:
                self.delivered.append(msg)
                tracker.on_delivery(None, msg)
        return len(acked)


def big(offset: int, count: int, rid: str) -> Message:
    value = orjson.dumps({"id": rid, "entity": "e1", "pad": "x" * 3000})
    return Message(
        topic=TOPIC,
        partition=0,
        offset=offset,
        key=b"k",
        value=value,
        timestamp=(1, int(time.time() * 1000)),
        delivery_count=count,
    )


def test_control_a_decode_dead_letter_refused_for_size_is_sent_bare(
    classifier: DemoModel,
) -> None:
    sink = SmallDlqSink()
    rig = share_worker(classifier, sink=sink, limit=5)
    bad = Message(
        topic=TOPIC,
        partition=0,
        offset=0,
        key=b"k",
        value=b"{not json" + b"x" * 3000,
        timestamp=(1, 1),
        delivery_count=1,
    )
    rig.consumer.waiting.append(bad)
    rig.worker.run_once()
    assert rig.consumer.accepted() == [0]
    assert len(sink.delivered_to("dlq")) == 1


def test_a_redelivered_dead_letter_refused_for_size_is_sent_bare(
    classifier: DemoModel,
) -> None:
    sink = SmallDlqSink()
    rig = share_worker(classifier, sink=sink, limit=5)
    rig.consumer.waiting.append(big(0, 5, "poison"))  # its last delivery
    rig.worker.run_once()  # raises SinkError: "... refused ... and its batch is unknown"
    assert rig.consumer.accepted() == [0]
    (letter,) = sink.delivered_to("dlq")
    assert letter["code"] == "redelivered"


def test_share_group_refuses_settings_the_worker_sets() -> None:
    for name, value in (("share.acknowledgement.mode", "implicit"), ("max.poll.records", 5)):
        with pytest.raises(ValueError) as refused:
            KafkaSettings(share_group=True, consumer_options={name: value})
        assert name in str(refused.value) and "the worker sets it" in str(refused.value)


def test_share_group_refuses_statistics_off(classifier: DemoModel) -> None:
    with pytest.raises(ValueError) as refused:
        share_worker(classifier, statistics_interval_ms=0)
    assert "statistics_interval_ms = 0" in str(refused.value)


def test_a_given_delivery_limit_is_kept_when_the_group_does_not_report_one() -> None:
    settings = KafkaSettings(share_group=True, share_delivery_count_limit=3)
    described = {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "30000"}
    assert _limits(settings, described).delivery_count_limit == 3


def test_a_healthy_worker_does_not_push_records_towards_their_last_delivery(
    classifier: DemoModel,
) -> None:
    """One slow poll earlier (8 records in 3 s), then fast polls only: the budget learns
    the fast rate, so the broker's whole batches are not released again and again (each
    release is one delivery more, towards the last)."""
    clock = FakeClock(1000.0)
    consumer = FakeShareConsumer(whole=True)
    rig = share_worker(classifier, batch=4, in_flight=2, limit=5, clock=clock, consumer=consumer)
    rig.worker.group._budget.observe(8, clock.now - 3.0)
    consumer.produce(200)
    for _ in range(3):
        rig.worker.run_once()
    # the first poll keeps 64 (the slow rate) and releases 136; the second, measured
    # fast, keeps all 136: no record is released twice
    assert consumer.polls == [200, 136]
    assert len(consumer.released()) == 136
    assert sorted(consumer.accepted()) == list(range(200))
    assert rig.worker.group._budget.room(4) > 200, rig.worker.group._budget.room(4)


@dataclass
class LeftTheGroupConsumer(FakeShareConsumer):
    """librdkafka after a poll held past max.poll.interval.ms: the next poll raises
    _MAX_POLL_EXCEEDED once (the member left the group), then joins again."""

    exceeded: bool = False

    def poll(self, timeout: float = -1) -> list[Message]:
        if self.exceeded:
            self.exceeded = False
            raise KafkaException(KafkaError(KafkaError._MAX_POLL_EXCEEDED, "exceeded by 5ms"))
        return super().poll(timeout)


def test_a_poll_held_past_the_poll_interval_does_not_stop_the_worker(
    classifier: DemoModel, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = LeftTheGroupConsumer(max_poll=8)
    rig = share_worker(classifier, limit=5, consumer=consumer)
    consumer.produce(4)
    rig.worker.run_once()
    consumer.exceeded = True
    consumer.produce(4, start=4)
    rig.worker.run_once()  # the member left: no records this time, no error
    assert "max_poll_interval_ms" in caplog.text
    rig.worker.run_once()
    assert consumer.accepted() == list(range(8))
    assert len(rig.sink.delivered_to("res")) == 8


def test_other_poll_errors_still_raise(classifier: DemoModel) -> None:
    @dataclass
    class Broken(FakeShareConsumer):
        def poll(self, timeout: float = -1) -> list[Message]:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))

    rig = share_worker(classifier, limit=5, consumer=Broken())
    with pytest.raises(KafkaException):
        rig.worker.run_once()
