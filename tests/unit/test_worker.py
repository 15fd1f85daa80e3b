"""The worker's loop, turn by turn, against a fake consumer and sink (no Kafka): batches
publish and commit, and the bound of records in flight always releases, whatever order
commit answers and rebalances come in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.unit.conftest import StoreFactory
from worker.app import Worker
from worker.commit import STALLED_COMMIT_S, PartitionKey
from worker.config import BatchPolicy, FeatureSpec, ModelSpec, PipelineConfig, WorkerConfig
from worker.engines import OnnxEngine
from worker.limits import RecordLimits
from worker.metrics import Metrics
from worker.pipeline import Pipeline
from worker.sink import DeliveryTracker, Headers, Sink

TOPIC = "req"
Event = Callable[["FakeConsumer"], None]


@dataclass
class FakeConsumer:
    """Behaves like ``confluent_kafka.Consumer`` where the worker can tell: rebalance
    callbacks and scripted events run inside ``consume``; a paused partition is not
    fetched and stays paused whoever owns it; an asynchronous commit is answered only
    when the test answers it, a synchronous one by its return value."""

    backlog: dict[PartitionKey, list[Message]] = field(default_factory=dict)
    owned: set[PartitionKey] = field(default_factory=set)
    paused: set[PartitionKey] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    async_commits: list[list[TopicPartition]] = field(default_factory=list)
    sync_commits: list[list[tuple[str, int, int]]] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def assign(self, *keys: PartitionKey) -> None:
        self.owned |= set(keys)
        self.callbacks["on_assign"](self, [TopicPartition(t, p) for t, p in keys])

    def revoke(self, *keys: PartitionKey) -> None:
        self.callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in keys])
        self.owned -= set(keys)

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        while self.events:
            self.events.pop(0)(self)
        out: list[Message] = []
        for key in sorted(self.owned - self.paused):
            queue = self.backlog.get(key, [])
            take = min(len(queue), num_messages - len(out))
            out += queue[:take]
            del queue[:take]
        if not out:
            time.sleep(min(timeout, 0.002))
        return out

    def poll(self, timeout: float) -> Message | None:
        got = self.consume(1, timeout)
        return got[0] if got else None

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def store_offsets(self, *, offsets: list[TopicPartition]) -> None:
        return None

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None:
        if asynchronous:
            self.async_commits.append(offsets)
            return None
        self.sync_commits.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets))
        return [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None:
        return None


@dataclass
class FakeSink:
    """Takes records like ``Sink``; each is acknowledged at the next poll or flush."""

    limit: RecordLimits = field(default_factory=RecordLimits.unread)
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    unacked: list[DeliveryTracker] = field(default_factory=list)

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        tracker.sent += 1
        self.sent.append((topic, value))
        self.unacked.append(tracker)
        return True

    def poll(self, timeout: float = 0.0) -> int:
        acked, self.unacked = self.unacked, []
        for tracker in acked:
            tracker.acked += 1
        return len(acked)

    def flush(self, timeout: float) -> int:
        self.poll()
        return 0


@pytest.fixture
def make_worker(
    classifier: DemoModel, make_store: StoreFactory
) -> Callable[..., tuple[Worker, FakeConsumer, FakeSink]]:
    data = {
        f"e{i}": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}
        for i, row in enumerate(classifier.features[:20].tolist())
    }

    def make(batch: int = 4, in_flight: int = 2) -> tuple[Worker, FakeConsumer, FakeSink]:
        pipeline_config = PipelineConfig(
            name="p",
            request_topics=[TOPIC],
            result_topic="res",
            dead_letter_topic="dlq",
            features=FeatureSpec(fields=classifier.fields),
            model=ModelSpec(path=classifier.path, name="demo"),
            batch=BatchPolicy(max_batch_size=batch, max_wait_ms=1),
        )
        config = WorkerConfig(
            pipelines=[pipeline_config], max_in_flight_batches=in_flight, poll_timeout_ms=5
        )
        metrics = Metrics(CollectorRegistry())
        pipeline = Pipeline(
            pipeline_config,
            store=make_store(data, classifier.fields),
            engine=OnnxEngine(pipeline_config.model),
            metrics=metrics.for_pipeline("p"),
        )
        consumer, sink = FakeConsumer(), FakeSink()
        worker = Worker(
            config=config,
            consumer=cast(Consumer, consumer),
            sink=cast(Sink, sink),
            pipelines=[pipeline],
            metrics=metrics,
        )
        worker._source.subscribe()
        return worker, consumer, sink

    return make


def requests(partition: int, n: int, start: int = 0) -> list[Message]:
    return [
        Message(
            topic=TOPIC,
            partition=partition,
            offset=start + i,
            key=b"k",
            value=orjson.dumps({"id": f"r{partition}-{start + i}", "entity": f"e{i % 20}"}),
            timestamp=(1, int(time.time() * 1000)),
        )
        for i in range(n)
    ]


def turn_until(worker: Worker, done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the worker did not get there"
        worker.run_once()


def answer_all(consumer: FakeConsumer, worker: Worker, err: KafkaError | None) -> None:
    answers, consumer.async_commits = consumer.async_commits, []
    for offsets in answers:
        worker.on_commit(err, offsets)


ILLEGAL_GENERATION = KafkaError(KafkaError.ILLEGAL_GENERATION)


def test_a_batch_is_published_then_committed(make_worker: Callable[..., Any]) -> None:
    worker, consumer, sink = make_worker()
    consumer.assign((TOPIC, 0))
    consumer.backlog[(TOPIC, 0)] = requests(0, 10)
    turn_until(worker, lambda: len(sink.sent) == 10)
    turn_until(worker, lambda: any(o[0].offset == 10 for o in consumer.async_commits))
    assert [orjson.loads(v)["id"] for _, v in sink.sent] == [f"r0-{i}" for i in range(10)]
    answer_all(consumer, worker, None)
    assert worker._delivery.records_in_flight() == 0


def test_the_kept_partition_resumes_when_a_revoke_commits_its_rejected_offsets(
    make_worker: Callable[..., Any],
) -> None:
    """The post-kill stall: while the group rebalances, commits go unanswered and the
    worker pauses at its bound; then, inside one consume, they are all rejected and the
    revoke of another partition commits synchronously, the kept partition's retry
    included. That answer must release the kept partition's records."""
    worker, consumer, sink = make_worker(batch=4, in_flight=2)  # bound 8, resume at 4
    p2, p3 = (TOPIC, 2), (TOPIC, 3)
    consumer.assign(p2, p3)
    consumer.backlog[p2], consumer.backlog[p3] = requests(2, 4), requests(3, 8)
    turn_until(worker, lambda: len(sink.sent) == 12)
    turn_until(worker, lambda: not len(worker._committer))
    time.sleep(STALLED_COMMIT_S)  # unanswered that long, the commits count again
    turn_until(worker, lambda: consumer.paused == {p2, p3})
    consumer.backlog[p3] += requests(3, 4, start=8)  # more work waits on the kept one
    consumer.events += [
        lambda c: answer_all(c, worker, ILLEGAL_GENERATION),
        lambda c: c.revoke(p2),
    ]
    worker.run_once()
    assert consumer.sync_commits[-1] == [(TOPIC, 2, 4), (TOPIC, 3, 8)]
    assert worker._delivery.records_in_flight() == 0
    turn_until(worker, lambda: p3 not in consumer.paused)
    turn_until(worker, lambda: len(sink.sent) == 16)


def test_a_partition_paused_revoked_and_assigned_again_is_fetched(
    make_worker: Callable[..., Any],
) -> None:
    worker, consumer, sink = make_worker(batch=4, in_flight=1)  # bound: 4 records
    p0, p1 = (TOPIC, 0), (TOPIC, 1)
    consumer.assign(p0, p1)
    consumer.backlog[p0] = requests(0, 4)
    turn_until(worker, lambda: len(sink.sent) == 4)
    turn_until(worker, lambda: not len(worker._committer))
    answer_all(consumer, worker, ILLEGAL_GENERATION)
    turn_until(worker, lambda: consumer.paused == {p0, p1})
    consumer.revoke(p1)  # its pause stays with the partition, as in librdkafka
    turn_until(worker, lambda: len(consumer.async_commits) > 0)  # p0's retry
    answer_all(consumer, worker, None)
    turn_until(worker, lambda: p0 not in consumer.paused)  # the worker is not paused now
    assert consumer.paused == {p1}
    consumer.backlog[p1] = requests(1, 3)
    consumer.events.append(lambda c: c.assign(p1))
    turn_until(worker, lambda: len(sink.sent) == 7)
    assert consumer.paused == set()
