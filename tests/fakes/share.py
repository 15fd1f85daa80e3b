"""A fake share consumer (KIP-932) for driving a real ``Worker`` in a share group without a broker.

It behaves like confluent-kafka's ``ShareConsumer`` in explicit acknowledgement mode
where the worker can tell: a poll hands out up to ``max_poll`` records (all that wait
with ``whole``, as a broker handing out whole producer batches does) and refuses to run
while a record of the previous poll is unacknowledged; an acknowledgement of a record
not held is refused; a RELEASEd record waits again with its delivery count one higher
(or, with ``archive_at``, is archived at that count, as the broker does at the group's
limit); acknowledgements are answered (``on_ack``) when they are sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from confluent_kafka import (
    AcknowledgeType,
    IllegalStateException,
    KafkaException,
    Message,
    ShareConsumer,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.sink import FakeSink
from tests.fakes.worker import TOPIC, GatedStore
from worker.compose import Metrics, ShareClient, wire_worker
from worker.config import BatchPolicy, FeatureSpec, ModelSpec, PipelineConfig, WorkerConfig
from worker.inference.engine import OnnxEngine
from worker.kafka.share_group import ShareGroupSettings
from worker.kafka.sink import Sink
from worker.loop import Worker
from worker.loop.share_events import ShareEvents
from worker.models import build_pipeline
from worker.ops.health import HealthState
from worker.pipeline import Pipeline
from worker.pipeline.feeds import FeedPlan

Position = tuple[str, int, int]


def request(offset: int, count: int = 1, partition: int = 0, rid: str | None = None) -> Message:
    return Message(
        topic=TOPIC,
        partition=partition,
        offset=offset,
        key=b"k",
        value=orjson.dumps({"id": rid or f"r{offset}", "entity": f"e{offset % 20}"}),
        timestamp=(1, int(time.time() * 1000)),
        delivery_count=count,
    )


@dataclass
class FakeShareConsumer:
    max_poll: int = 500
    whole: bool = False
    waiting: list[Message] = field(default_factory=list)
    held: dict[Position, Message] = field(default_factory=dict)
    """Records of the last poll not acknowledged yet."""
    acks: list[tuple[Position, str]] = field(default_factory=list)
    """Every acknowledgement made, in order: (position, ACCEPT / RELEASE)."""
    sent: list[list[tuple[Position, str]]] = field(default_factory=list)
    """Acknowledgements as they were sent to the broker (commit_async / commit_sync)."""
    polls: list[int] = field(default_factory=list)
    subscribed: list[str] = field(default_factory=list)
    closed: bool = False
    on_ack: Callable[[dict[TopicPartition, set[int]], KafkaException | None], None] | None = None
    refuse_acks: bool = False
    """Answer every acknowledgement sent with an error."""
    archive_at: int | None = None
    """A record RELEASEd at this delivery count or later is archived, never again."""
    archived: list[int] = field(default_factory=list)
    _unsent: list[tuple[Position, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(self, n: int, start: int = 0, count: int = 1) -> None:
        with self._lock:
            self.waiting += [request(start + i, count) for i in range(n)]

    def subscribe(self, topics: list[str]) -> None:
        self.subscribed = topics

    def poll(self, timeout: float = -1) -> list[Message]:
        with self._lock:
            if self.held:
                raise IllegalStateException("records of the previous poll are unacknowledged")
            self._send()
            n = len(self.waiting) if self.whole else self.max_poll
            out, self.waiting = self.waiting[:n], self.waiting[n:]
            self.held = {_at(m): m for m in out}
        if out:
            self.polls.append(len(out))
        else:
            time.sleep(min(timeout, 0.001))
        return out

    def acknowledge(
        self, message: Message, ack_type: AcknowledgeType = AcknowledgeType.ACCEPT
    ) -> None:
        with self._lock:
            where = _at(message)
            if where not in self.held:
                raise IllegalStateException(f"{where} is not in flight")
            del self.held[where]
            self.acks.append((where, ack_type.name))
            self._unsent.append((where, ack_type.name))
            if ack_type == AcknowledgeType.RELEASE:
                count = (message.delivery_count() or 1) + 1
                if self.archive_at is not None and count > self.archive_at:
                    self.archived.append(where[2])
                    return
                self.waiting.insert(0, request(where[2], count, where[1]))
                self.waiting.sort(key=lambda m: cast(int, m.offset()))

    def commit_async(self) -> None:
        with self._lock:
            self._send()

    def commit_sync(self, timeout: float = 60) -> dict[TopicPartition, KafkaException | None]:
        with self._lock:
            self._send()
        return {}

    def set_acknowledgement_commit_callback(self, callback: Any) -> None:
        self.on_ack = callback

    def close(self) -> None:
        self.closed = True

    def _send(self) -> None:
        if not self._unsent:
            return
        batch, self._unsent = self._unsent, []
        self.sent.append(batch)
        if self.on_ack is not None:
            offsets: dict[TopicPartition, set[int]] = {}
            for (topic, partition, offset), _kind in batch:
                offsets.setdefault(TopicPartition(topic, partition), set()).add(offset)
            error = KafkaException("refused") if self.refuse_acks else None
            self.on_ack(offsets, error)

    def accepted(self) -> list[int]:
        return sorted(at[2] for at, kind in self.acks if kind == "ACCEPT")

    def released(self) -> list[int]:
        return sorted(at[2] for at, kind in self.acks if kind == "RELEASE")


def _at(msg: Message) -> Position:
    return cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset())


@dataclass
class ShareRig:
    worker: Worker
    consumer: FakeShareConsumer
    sink: Any
    store: GatedStore
    metrics: Metrics
    pipelines: dict[str, Pipeline]


def share_worker(
    classifier: DemoModel,
    *,
    batch: int = 4,
    in_flight: int = 2,
    limit: int = 5,
    lock_s: float = 30.0,
    sink: Any = None,
    clock: Callable[[], float] = time.monotonic,
    consumer: FakeShareConsumer | None = None,
    pipelines: Sequence[str] = ("p",),
    **settings: Any,
) -> ShareRig:
    """A real Worker (a share group's), Pipeline and engine around the fakes, wired as
    ``build_worker`` wires one, and subscribed, so tests can drive ``run_once``."""
    data = {
        f"e{i}": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}
        for i, row in enumerate(classifier.features[:20].tolist())
    }
    configs = [
        PipelineConfig(
            name=name,
            request_topics=[TOPIC if i == 0 else f"{TOPIC}-{name}"],
            result_topic=f"res-{name}" if i else "res",
            dead_letter_topic=f"dlq-{name}" if i else "dlq",
            features=FeatureSpec(fields=classifier.fields),
            model=ModelSpec(path=classifier.path, name="demo"),
            batch=BatchPolicy(max_batch_size=batch, max_wait_ms=1),
        )
        for i, name in enumerate(pipelines)
    ]
    config = WorkerConfig.model_validate(
        {
            "pipelines": [c.model_dump() for c in configs],
            "max_in_flight_batches": in_flight,
            "poll_timeout_ms": 5,
            "kafka": {"share_group": True},
            **settings,
        }
    )
    metrics = Metrics(CollectorRegistry())
    store = GatedStore(data, classifier.fields)
    engine = OnnxEngine(configs[0].model)
    built = [
        build_pipeline(
            p,
            store=store,
            engine=engine,
            plan=FeedPlan.build(p, engine.inputs),
            metrics=metrics.for_pipeline(p.name),
        )
        for p in config.pipelines
    ]
    consumer = consumer or FakeShareConsumer(max_poll=config.in_flight_bound)
    health = HealthState()
    health.models_loaded = True
    route = {t: p.name for p in config.pipelines for t in p.request_topics}
    events = ShareEvents(health, metrics, config.kafka.group_id, route)
    sink = sink if sink is not None else FakeSink()
    worker = wire_worker(
        config,
        client=ShareClient(
            cast(ShareConsumer, consumer), events, ShareGroupSettings(limit, lock_s)
        ),
        sink=cast(Sink, sink),
        pipelines=built,
        metrics=metrics,
        health=health,
        clock=clock,
    )
    worker.group.join()
    return ShareRig(worker, consumer, sink, store, metrics, {p.name: p for p in built})
