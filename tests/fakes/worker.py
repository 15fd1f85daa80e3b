"""Fakes of the Kafka clients for driving a real ``Worker`` (or its committer) without a
broker.

They behave like confluent-kafka where the worker can tell: rebalance callbacks and
scripted events run inside ``consume``; a paused partition is not fetched and stays
paused whoever owns it; an asynchronous commit is answered only when the test answers
it, a synchronous one by its return value; a transactional producer delivers its
records when the transaction commits and checks, at every commit, that the transaction
holds the offsets of every record it answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.sink import FakeSink, refused_batch
from tests.fakes.stores import MemoryStore
from worker.compose import ConsumerClient, Metrics, wire_worker
from worker.config import BatchPolicy, FeatureSpec, ModelSpec, PipelineConfig, WorkerConfig
from worker.core.types import PartitionKey
from worker.inference.engine import OnnxEngine
from worker.kafka.call_watch import CallWatch
from worker.kafka.limits import RecordLimits
from worker.kafka.sink import Headers, Sink
from worker.loop.consumer_events import ConsumerEvents
from worker.loop.worker import Worker
from worker.models import build_pipeline
from worker.ops.health import HealthState
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.steps import Pipeline

TOPIC = "req"
Event = Callable[["FakeConsumer"], None]


@dataclass
class FakeConsumer:
    """Partitions are logs with a fetch position; the group's committed offsets live here
    too (synchronous commits at once, asynchronous ones when answered without error)."""

    logs: dict[PartitionKey, list[Message]] = field(default_factory=dict)
    positions: dict[PartitionKey, int] = field(default_factory=dict)
    group_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    owned: set[PartitionKey] = field(default_factory=set)
    paused: set[PartitionKey] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    async_commits: list[list[TopicPartition]] = field(default_factory=list)
    sync_commits: list[list[tuple[str, int, int]]] = field(default_factory=list)
    seeks: list[tuple[PartitionKey, int]] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)
    refusals: list[KafkaError] = field(default_factory=list)
    """Errors the next synchronous commits raise, one each, as during a rebalance."""
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None] | None = None
    """librdkafka's ``on_commit`` from the consumer's configuration."""
    on_poll: Callable[[Message | None], None] | None = None
    """Told what each ``poll`` returns, before the caller sees it."""
    stored: list[list[tuple[str, int, int]]] = field(default_factory=list)
    """Every ``store_offsets`` call, sorted."""
    commits: list[tuple[list[tuple[str, int, int]], bool]] = field(default_factory=list)
    """Every commit asked for, sorted, with whether it was asynchronous."""
    fail_with: Exception | None = None
    """Raised by every commit, before it is recorded."""
    rejects: dict[PartitionKey, KafkaError] = field(default_factory=dict)
    """Partitions a synchronous commit answers with an error (as the broker would)."""
    timeouts: list[float] = field(default_factory=list)
    """The timeout of every ``consume`` and ``poll``: how long the loop would wait."""

    # -- the test's hands --------------------------------------------------------------

    def produce(self, partition: int, n: int) -> None:
        """Append ``n`` requests to a partition's log."""
        log = self.logs.setdefault((TOPIC, partition), [])
        log += requests(partition, n, start=len(log))

    def drop_key(self, partition: int, offset: int) -> None:
        """Make the request at ``offset`` keyless (so its result has no key either)."""
        log = self.logs[(TOPIC, partition)]
        was = log[offset]
        log[offset] = Message(
            topic=TOPIC, partition=partition, offset=offset, value=was.value(), timestamp=(1, 1)
        )

    def assign(self, *keys: PartitionKey) -> None:
        """Fetching starts at the committed offset, read after the callback (librdkafka
        fetches it once the assignment is in place); none committed: the log start."""
        self.owned |= set(keys)
        self.callbacks["on_assign"](self, [TopicPartition(t, p) for t, p in keys])
        for key in keys:
            self.positions[key] = self.group_offsets.get(key, 0)

    def revoke(self, *keys: PartitionKey) -> None:
        self.callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in keys])
        self.owned -= set(keys)

    def lose(self, *keys: PartitionKey) -> None:
        self.callbacks["on_lost"](self, [TopicPartition(t, p) for t, p in keys])
        self.owned -= set(keys)

    def answer(self, err: KafkaError | None) -> None:
        """Answer every asynchronous commit so far, as the broker would."""
        answers, self.async_commits = self.async_commits, []
        for offsets in answers:
            if err is None:
                for tp in offsets:
                    self.group_offsets[(tp.topic, tp.partition)] = tp.offset
            if self.on_commit is not None:
                self.on_commit(err, offsets)

    # -- confluent_kafka.Consumer ------------------------------------------------------

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.timeouts.append(timeout)
        while self.events:
            self.events.pop(0)(self)
        out: list[Message] = []
        for key in sorted(self.owned - self.paused):
            log, at = self.logs.get(key, []), self.positions.get(key, 0)
            take = log[at : at + num_messages - len(out)]
            self.positions[key] = at + len(take)
            out += take
        if not out:
            time.sleep(min(timeout, 0.002))
        return out

    def poll(self, timeout: float) -> Message | None:
        got = self.consume(1, timeout)
        msg = got[0] if got else None
        if self.on_poll is not None:
            self.on_poll(msg)
        return msg

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def store_offsets(self, *, offsets: list[TopicPartition]) -> None:
        self.stored.append(_plain(offsets))

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None:
        """Like confluent-kafka: an asynchronous commit returns None and is answered later
        through on_commit; a synchronous one returns its offsets, each with its error, and
        never reaches on_commit."""
        if self.fail_with is not None:
            raise self.fail_with
        self.commits.append((_plain(offsets), asynchronous))
        if asynchronous:
            self.async_commits.append(offsets)
            return None
        if self.refusals:
            raise KafkaException(self.refusals.pop(0))
        self.sync_commits.append(_plain(offsets))
        answers = [
            Answered(tp.topic, tp.partition, tp.offset, self.rejects.get((tp.topic, tp.partition)))
            for tp in offsets
        ]
        for answer in answers:
            if answer.error is None:
                self.group_offsets[(answer.topic, answer.partition)] = answer.offset
        return cast(list[TopicPartition], answers)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        offsets = self.group_offsets
        return [
            TopicPartition(tp.topic, tp.partition, offsets.get((tp.topic, tp.partition), -1001))
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float, cached: bool = False
    ) -> tuple[int, int]:
        return 0, len(self.logs.get((partition.topic, partition.partition), []))

    def seek(self, partition: TopicPartition) -> None:
        key = (partition.topic, partition.partition)
        end = len(self.logs.get(key, []))
        offset = {OFFSET_END: end, OFFSET_BEGINNING: 0}.get(partition.offset, partition.offset)
        self.seeks.append((key, offset))
        self.positions[key] = offset

    def consumer_group_metadata(self) -> object:
        return "group-metadata"

    def close(self) -> None:
        return None


@dataclass
class Answered:
    """A partition of a synchronous commit's answer (``TopicPartition.error`` is read-only)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None


def _plain(offsets: list[TopicPartition]) -> list[tuple[str, int, int]]:
    return sorted((tp.topic, tp.partition, tp.offset) for tp in offsets)


@dataclass
class Transaction:
    records: list[tuple[str, bytes, Headers, Any]] = field(default_factory=list)
    offsets: dict[PartitionKey, int] = field(default_factory=dict)
    refused: list[tuple[KafkaError, Message, Any]] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)


@dataclass
class FakeTransactionalProducer:
    """Records go into the open transaction and are delivered when it commits. Errors
    scripted in ``fail_commit`` are raised by the next commits, one each. A record that
    ``refuse(topic, value, key, headers)`` gives an error for fails as in librdkafka: its
    delivery report carries the error (and the record's value and key) and the commit
    raises an abortable error. Every committed transaction must hold, for each result
    and dead letter, its source partition's offset past the source record, and only for
    partitions ``owner`` owns at commit time."""

    owner: FakeConsumer
    open: Transaction | None = None
    committed: list[Transaction] = field(default_factory=list)
    aborted: list[Transaction] = field(default_factory=list)
    fail_commit: list[KafkaError] = field(default_factory=list)
    refuse: Callable[[str, bytes, bytes | None, Headers], KafkaError | None] | None = None
    compacted: set[str] = field(default_factory=set)
    """Topics the broker compacts: a transaction's records are one produce batch, refused
    whole on such a topic as ``refused_batch`` says."""
    init_calls: int = 0

    def init_transactions(self, timeout: float) -> None:
        self.init_calls += 1

    def begin_transaction(self) -> None:
        assert self.open is None, "a transaction is already open"
        self.open = Transaction()

    def produce(self, topic: str, value: bytes, key: bytes | None, **kw: Any) -> None:
        if self.open is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "no open transaction"))
        headers, on_delivery = kw.get("headers") or [], kw["on_delivery"]
        self.open.records.append((topic, value, headers, on_delivery))
        self.open.keys.append(key)
        err = self.refuse(topic, value, key, headers) if self.refuse else None
        if err is not None:
            report = Message(topic=topic, partition=0, offset=-1, value=value, key=key)
            self.open.refused.append((err, report, on_delivery))

    def send_offsets_to_transaction(
        self, offsets: Sequence[TopicPartition], metadata: object, timeout: float
    ) -> None:
        assert self.open is not None
        self.open.offsets.update({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def commit_transaction(self, timeout: float) -> None:
        txn = self.open
        assert txn is not None
        if self.fail_commit:
            raise KafkaException(self.fail_commit.pop(0))
        self._refuse_compacted(txn)
        if txn.refused:
            for err, report, on_delivery in txn.refused:
                on_delivery(err, report)
            why = f"{len(txn.refused)} records failed delivery"
            raise KafkaException(KafkaError(KafkaError._INCONSISTENT, why, txn_requires_abort=True))
        for topic, _value, headers, on_delivery in txn.records:
            source = dict(cast("list[tuple[str, bytes]]", headers))
            key = (TOPIC, int(source["streamfer.source_partition"]))
            offset = int(source["streamfer.source_offset"])
            assert key in txn.offsets and txn.offsets[key] > offset, (
                f"{topic} record of {key}@{offset} committed without its offset {txn.offsets}"
            )
            on_delivery(None, Message(topic=topic, partition=0, offset=0))
        assert set(txn.offsets) <= self.owner.owned, "offsets of partitions not owned"
        for key, offset in txn.offsets.items():
            self.owner.group_offsets[key] = offset
        self.committed.append(txn)
        self.open = None

    def _refuse_compacted(self, txn: Transaction) -> None:
        topics = [topic for topic, _v, _h, _cb in txn.records]
        refused = refused_batch(list(zip(topics, txn.keys, strict=True)), self.compacted)
        for i, err in sorted(refused.items()):
            topic, value, _headers, on_delivery = txn.records[i]
            report = Message(topic=topic, partition=0, offset=-1, value=value, key=txn.keys[i])
            txn.refused.append((err, report, on_delivery))

    def abort_transaction(self, timeout: float) -> None:
        assert self.open is not None
        self.aborted.append(self.open)
        self.open = None

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float = 0.0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def sources(self) -> list[tuple[int, int]]:
        """(partition, offset) of every request answered in a committed transaction."""
        out = []
        for txn in self.committed:
            for _topic, _value, headers, _cb in txn.records:
                source = dict(cast("list[tuple[str, bytes]]", headers))
                out.append(
                    (
                        int(source["streamfer.source_partition"]),
                        int(source["streamfer.source_offset"]),
                    )
                )
        return sorted(out)


class GatedStore(MemoryStore):
    """A feature store whose fetches wait while the gate is closed: a batch stays in its
    stage as long as a test needs."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = threading.Event()
        self.gate.set()

    def get_many(self, entities: Sequence[str]) -> list[list[bytes | str | None]]:
        self.gate.wait(30)
        return super().get_many(entities)


def requests(partition: int, n: int, start: int = 0, topic: str = TOPIC) -> list[Message]:
    return [
        Message(
            topic=topic,
            partition=partition,
            offset=start + i,
            key=b"k",
            value=orjson.dumps({"id": f"r{partition}-{start + i}", "entity": f"e{i % 20}"}),
            timestamp=(1, int(time.time() * 1000)),
        )
        for i in range(n)
    ]


def build_worker(
    classifier: DemoModel,
    *,
    batch: int = 4,
    in_flight: int = 2,
    exactly_once: bool = False,
    limits: RecordLimits | None = None,
    **settings: Any,
) -> tuple[Worker, FakeConsumer, Any, GatedStore]:
    """A real Worker, Pipeline, engine and committer around the fakes; returns the worker,
    the consumer, the sink (a FakeSink, or a Sink over a FakeTransactionalProducer) and
    the store. ``limits``: what the worker read of its topics (default: nothing)."""
    data = {
        f"e{i}": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}
        for i, row in enumerate(classifier.features[:20].tolist())
    }
    pipeline_config = PipelineConfig(
        name="p",
        request_topics=[TOPIC],
        result_topic="res",
        dead_letter_topic="dlq",
        features=FeatureSpec(fields=classifier.fields),
        model=ModelSpec(path=classifier.path, name="demo"),
        batch=BatchPolicy(max_batch_size=batch, max_wait_ms=1),
    )
    kafka = settings.pop("kafka", {})
    transaction_calls = settings.pop("transaction_calls", None)
    config = WorkerConfig.model_validate(
        {
            "pipelines": [pipeline_config.model_dump()],
            "max_in_flight_batches": in_flight,
            "poll_timeout_ms": 5,
            "delivery": "exactly-once" if exactly_once else "at-least-once",
            "kafka": kafka,
            **settings,
        }
    )
    metrics = Metrics(CollectorRegistry())
    store = GatedStore(data, classifier.fields)
    engine = OnnxEngine(pipeline_config.model)
    pipeline = build_pipeline(
        config.pipelines[0],
        store=store,
        engine=engine,
        plan=FeedPlan.build(config.pipelines[0], engine.inputs),
        metrics=metrics.for_pipeline("p"),
    )
    consumer = FakeConsumer()
    known = limits or RecordLimits.unread()
    sink: Any = (
        Sink(cast(Any, FakeTransactionalProducer(consumer)), known)
        if exactly_once
        else FakeSink(limit=known)
    )
    worker = fake_worker(config, consumer, sink, [pipeline], metrics, calls=transaction_calls)
    return worker, consumer, sink, store


def fake_worker(
    config: WorkerConfig,
    consumer: FakeConsumer,
    sink: Any,
    pipelines: Sequence[Pipeline],
    metrics: Metrics,
    calls: CallWatch | None = None,
) -> Worker:
    """A worker wired as ``build_worker`` wires one, around the fakes; subscribed, as
    ``Worker.run`` would, so tests can drive ``run_once``."""
    health = HealthState(liveness_timeout_s=config.liveness_timeout_s)
    health.models_loaded = True
    events = ConsumerEvents(health, metrics)
    consumer.on_commit = events.on_commit
    worker = wire_worker(
        config,
        client=ConsumerClient(cast(Consumer, consumer), events),
        sink=cast(Sink, sink),
        pipelines=pipelines,
        metrics=metrics,
        health=health,
        calls=calls,
    )
    worker.group.join()
    return worker


def turn_until(worker: Worker, done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the worker did not get there"
        worker.run_once()


# --- two pipelines, in two priority lanes -------------------------------------------

LIVE, BULK = "live-req", "bulk-req"


def entity_rows(classifier: DemoModel) -> dict[str, dict[str, bytes]]:
    """The feature store's rows: entities e0 to e19."""
    return {
        f"e{i}": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}
        for i, row in enumerate(classifier.features[:20].tolist())
    }


def two_pipeline_config(classifier: DemoModel, *, priorities: bool = True) -> WorkerConfig:
    """An interactive pipeline (batches of 4) and a bulk one (batches of 8); bound 4 x 8 =
    32 records, so bulk's default share is 16 (two batches), resuming at 8."""

    def pipeline(name: str, topic: str, batch: int, priority: str) -> dict[str, Any]:
        return {
            "name": name,
            "request_topics": [topic],
            "result_topic": f"{name}-res",
            "dead_letter_topic": f"{name}-dlq",
            "features": {"fields": classifier.fields},
            "model": {"path": str(classifier.path), "name": "demo"},
            "batch": {"max_batch_size": batch, "max_wait_ms": 1},
            **({"priority": priority} if priorities else {}),
        }

    return WorkerConfig.model_validate(
        {
            "pipelines": [
                pipeline("live", LIVE, 4, "interactive"),
                pipeline("bulk", BULK, 8, "bulk"),
            ],
            "max_in_flight_batches": 4,
            "poll_timeout_ms": 5,
        }
    )
