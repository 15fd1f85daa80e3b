"""Priority lanes in a real ``Worker`` against fake Kafka clients (``tests/fakes/worker.py``):
a bulk pipeline at its share of the in-flight bound has only its partitions paused while
the interactive pipeline's keep flowing, interactive batches go ahead of waiting bulk
ones, and every request of both is answered once, in order, and committed to the end."""

from __future__ import annotations

import time

import orjson
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.sink import FakeSink
from tests.fakes.worker import (
    BULK,
    LIVE,
    FakeConsumer,
    GatedStore,
    entity_rows,
    fake_worker,
    requests,
    turn_until,
    two_pipeline_config,
)
from worker.compose import Metrics
from worker.inference.engine import OnnxEngine
from worker.loop.worker import Worker
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan


def append(consumer: FakeConsumer, topic: str, partition: int, n: int) -> None:
    log = consumer.logs.setdefault((topic, partition), [])
    log += requests(partition, n, start=len(log), topic=topic)


def two_pipeline_worker(
    classifier: DemoModel, *, priorities: bool = True
) -> tuple[Worker, FakeConsumer, FakeSink, dict[str, GatedStore], Metrics]:
    """``two_pipeline_config``'s worker, around the fakes."""
    data = entity_rows(classifier)
    config = two_pipeline_config(classifier, priorities=priorities)
    metrics = Metrics(CollectorRegistry())
    stores = {p.name: GatedStore(data, classifier.fields) for p in config.pipelines}
    engines = {p.name: OnnxEngine(p.model) for p in config.pipelines}
    pipelines = [
        build_pipeline(
            p,
            store=stores[p.name],
            engine=engines[p.name],
            plan=FeedPlan.build(p, engines[p.name].inputs),
            metrics=metrics.for_pipeline(p.name),
        )
        for p in config.pipelines
    ]
    consumer, sink = FakeConsumer(), FakeSink()
    worker = fake_worker(config, consumer, sink, pipelines, metrics)
    return worker, consumer, sink, stores, metrics


def ids(sink: FakeSink, topic: str) -> list[str]:
    return [orjson.loads(v)["id"] for t, v in sink.sent if t == topic]


def settle(worker: Worker, consumer: FakeConsumer, ends: dict[tuple[str, int], int]) -> None:
    """Turn, answering commits, until every partition's group offset is its log end."""
    deadline = time.monotonic() + 20
    while any(consumer.group_offsets.get(k, 0) != end for k, end in ends.items()):
        assert time.monotonic() < deadline, (consumer.group_offsets, ends)
        worker.run_once()
        consumer.answer(None)


def test_a_bulk_pipeline_at_its_share_pauses_only_its_partitions(classifier: DemoModel) -> None:
    worker, consumer, sink, stores, metrics = two_pipeline_worker(classifier)
    parts = [(LIVE, 0), (LIVE, 1), (BULK, 0), (BULK, 1)]
    consumer.assign(*parts)
    stores["bulk"].gate.clear()  # the first bulk batch holds the first stage
    append(consumer, BULK, 0, 100)
    append(consumer, BULK, 1, 100)
    turn_until(worker, lambda: consumer.paused == {(BULK, 0), (BULK, 1)})
    assert worker.group._committer.records_of("bulk") == 16, "two batches: the share"
    held = metrics.in_flight_share_held.labels("bulk")._value.get()
    assert held == 1
    # interactive records keep being fetched while bulk's partitions stay paused
    append(consumer, LIVE, 0, 6)
    append(consumer, LIVE, 1, 2)
    turn_until(worker, lambda: worker.group._committer.records_of("live") == 8)
    for _ in range(20):
        worker.run_once()
    assert consumer.paused == {(BULK, 0), (BULK, 1)}
    assert worker.group._committer.records_of("bulk") == 16
    stores["bulk"].gate.set()
    settle(worker, consumer, {key: len(consumer.logs[key]) for key in parts})
    assert consumer.paused == set()
    assert metrics.in_flight_share_held.labels("bulk")._value.get() == 0
    live, bulk = ids(sink, "live-res"), ids(sink, "bulk-res")
    for topic, got in ((LIVE, live), (BULK, bulk)):
        for partition in (0, 1):
            mine = [i for i in got if i.startswith(f"r{partition}-")]
            expected = len(consumer.logs.get((topic, partition), []))
            assert mine == [f"r{partition}-{n}" for n in range(expected)]
    # the interactive batches went ahead of the bulk batch that waited for the first stage
    # (the second of bulk-req[0]: records 8-15) when they came
    sent = [(t, orjson.loads(v)["id"]) for t, v in sink.sent]
    assert sent.index(("live-res", live[-1])) < sent.index(("bulk-res", "r0-8")), sent[:40]


def test_without_priorities_nothing_pauses_for_a_share(classifier: DemoModel) -> None:
    """Today's behaviour: one lane, the whole bound for whoever fills it."""
    worker, consumer, sink, stores, _ = two_pipeline_worker(classifier, priorities=False)
    parts = [(LIVE, 0), (BULK, 0)]
    consumer.assign(*parts)
    stores["bulk"].gate.clear()
    append(consumer, BULK, 0, 100)
    turn_until(worker, lambda: worker.group._committer.records_of("bulk") >= 32)
    assert consumer.paused in (set(), {(LIVE, 0), (BULK, 0)}), "only the whole bound pauses"
    stores["bulk"].gate.set()
    settle(worker, consumer, {(BULK, 0): 100})
    assert ids(sink, "bulk-res") == [f"r0-{n}" for n in range(100)]
