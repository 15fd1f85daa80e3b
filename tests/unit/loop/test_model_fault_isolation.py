"""A model fault in one pipeline holds that pipeline only, and so does an inference
server that cannot answer: its batch is parked while the shared processing threads serve
the other pipelines, in either priority lane or in one shared lane; only its partitions
pause, nothing of it is dead-lettered, the worker is not ready and names it, and every
request is answered, in order, once the model (or its server) takes batches again. The
real ``Worker`` (of a consumer group and of a share group), Pipeline and ONNX engine,
around the fakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import orjson
import pytest
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.pipeline import WrappedEngine
from tests.fakes.share import request, share_worker
from tests.fakes.sink import FakeSink
from tests.fakes.waits import wait_for
from tests.fakes.worker import (
    BULK,
    LIVE,
    FakeConsumer,
    GatedStore,
    entity_rows,
    fake_worker,
    requests,
    two_pipeline_config,
)
from worker.compose import Metrics
from worker.errors import EngineError, InferenceServerError
from worker.inference import LiveModel
from worker.inference.engine import Feeds, OnnxEngine, Outputs
from worker.loop.worker import Worker
from worker.models import build_pipeline
from worker.ops.health import HealthState
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.model_faults import ModelFaultWait
from worker.pipeline.server_outage import ServerOutage
from worker.pipeline.steps import Pipeline

DEVICE_ERROR = "CUDA failure 700: an illegal memory access was encountered"
SERVER_DOWN = "inference server m:1 at 10.0.0.1:8001: UNAVAILABLE: failed to connect"
FAILURES: dict[str, tuple[type[Exception], str]] = {
    "model": (EngineError, DEVICE_ERROR),
    "server": (InferenceServerError, SERVER_DOWN),
}
"""What holds a pipeline: its model at fault, or its inference server down."""


class Switchable(WrappedEngine):
    """The real engine, failing every call while ``broken``: the model refusing it, or
    (``failure = "server"``) a server that cannot answer."""

    broken = False
    failure = "model"

    def infer(self, feeds: Feeds) -> Outputs:
        if self.broken:
            error, why = FAILURES[self.failure]
            raise error(why)
        return self.inner.infer(feeds)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ModelFaultWait, "RETRY_S", (0.05, 0.2))
    monkeypatch.setattr(ModelFaultWait, "LOOK_S", 0.01)
    monkeypatch.setattr(ServerOutage, "RETRY_S", (0.05, 0.2))


def switchable(pipeline: Pipeline) -> Switchable:
    """Put a Switchable around the model ``pipeline`` serves."""
    live = pipeline.slot.for_batch()
    engine = Switchable(live.engine)  # type: ignore[arg-type]
    pipeline.slot.swap(LiveModel(engine, live.identity))  # type: ignore[arg-type]
    return engine


def q_request(offset: int) -> Message:
    return Message(
        topic="req-q",
        partition=0,
        offset=offset,
        value=orjson.dumps({"id": f"q{offset}", "entity": "e1"}),
        timestamp=(1, int(time.time() * 1000)),
        delivery_count=1,
    )


def test_a_share_worker_serves_a_healthy_pipeline_while_another_is_held(
    classifier: DemoModel,
) -> None:
    rig = share_worker(classifier, pipelines=("p", "q"), batch=4, in_flight=4)
    p = rig.pipelines["p"]
    engine = switchable(p)
    rig.consumer.waiting += [request(0)]
    rig.worker.run_once()  # p answers one row: it has a row known to be good
    engine.broken = True
    rig.consumer.waiting += [request(1), q_request(0), q_request(1)]
    poll = threading.Thread(target=rig.worker.run_once, daemon=True)
    poll.start()  # one poll of three records: it ends once all three are settled
    paused = rig.metrics.model_paused.labels("p")
    try:
        wait_for(lambda: len(rig.sink.delivered_to("res-q")) == 2 and paused._value.get() == 1)
        assert poll.is_alive() and rig.worker._threads.parked() == {"p"}
        assert len(rig.sink.delivered_to("res")) == 1 and not rig.sink.delivered_to("dlq")
    finally:
        engine.broken = False
    poll.join(10)
    assert not poll.is_alive()
    assert [r["id"] for r in rig.sink.delivered_to("res")] == ["r0", "r1"]
    assert paused._value.get() == 0 and not rig.sink.delivered_to("dlq")
    rig.worker.stop()


def two_pipelines(
    classifier: DemoModel, *, priorities: bool
) -> tuple[Worker, FakeConsumer, FakeSink, dict[str, Switchable], Metrics]:
    """``two_pipeline_config``'s worker, each model one that can be broken, its
    pipelines reporting their model's faults and their server to the worker's health."""
    data = entity_rows(classifier)
    config = two_pipeline_config(classifier, priorities=priorities)
    metrics = Metrics(CollectorRegistry())
    health = HealthState()
    engines = {p.name: Switchable(OnnxEngine(p.model)) for p in config.pipelines}
    pipelines = [
        build_pipeline(
            p,
            store=GatedStore(data, classifier.fields),
            engine=engines[p.name],
            plan=FeedPlan.build(p, engines[p.name].inputs),
            metrics=metrics.for_pipeline(p.name),
            on_model=health.model_for(p.name),
            on_inference_server=health.inference_server_for(p.name),
        )
        for p in config.pipelines
    ]
    consumer, sink = FakeConsumer(), FakeSink()
    worker = fake_worker(config, consumer, sink, pipelines, metrics)
    worker.health.model_problems = health.model_problems  # the pipelines report there
    worker.health.inference_server_problems = health.inference_server_problems
    return worker, consumer, sink, engines, metrics


def append(consumer: FakeConsumer, topic: str, partition: int, n: int) -> None:
    log = consumer.logs.setdefault((topic, partition), [])
    log += requests(partition, n, start=len(log), topic=topic)


def turn_answering(worker: Worker, consumer: FakeConsumer, done: Callable[[], bool]) -> None:
    """Turn, the broker answering every commit, until ``done``."""
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, "the worker did not get there"
        worker.run_once()
        consumer.answer(None)


def ids(sink: FakeSink, topic: str) -> list[str]:
    return [orjson.loads(v)["id"] for t, v in sink.sent if t == topic]


@pytest.mark.parametrize("failure", ["model", "server"])
@pytest.mark.parametrize("priorities", [True, False], ids=["two-lanes", "one-lane"])
@pytest.mark.parametrize("broken", ["live", "bulk"])
def test_a_held_pipeline_pauses_only_its_partitions_and_the_other_flows(
    classifier: DemoModel, priorities: bool, broken: str, failure: str
) -> None:
    worker, consumer, sink, engines, metrics = two_pipelines(classifier, priorities=priorities)
    engines[broken].failure = failure
    why = FAILURES[failure][1]
    healthy = "bulk" if broken == "live" else "live"
    topic = {"live": LIVE, "bulk": BULK}
    parts = [(LIVE, 0), (LIVE, 1), (BULK, 0), (BULK, 1)]
    consumer.assign(*parts)
    for key in parts:
        append(consumer, *key, 8)
    turn_answering(worker, consumer, lambda: len(sink.sent) == 32)  # both models answered
    engines[broken].broken = True
    for key in parts:
        append(consumer, *key, 40)
    mine = {(topic[broken], 0), (topic[broken], 1)}
    turn_answering(
        worker,
        consumer,
        lambda: consumer.paused == mine and len(ids(sink, f"{healthy}-res")) == 96,
    )
    # the healthy pipeline answered everything while the other was held
    assert len(ids(sink, f"{broken}-res")) == 16
    assert not ids(sink, f"{broken}-dlq") and not ids(sink, f"{healthy}-dlq")
    assert worker._threads.parked() == {broken}
    assert metrics.model_paused.labels(broken)._value.get() == (failure == "model")
    assert metrics.model_paused.labels(healthy)._value.get() == 0
    reasons = worker.health.not_ready_reasons()
    assert any(r.startswith(f"pipeline {broken}: ") and why in r for r in reasons)
    assert not any(f"pipeline {healthy}" in r for r in reasons)
    for _ in range(20):
        worker.run_once()
        consumer.answer(None)
    assert consumer.paused == mine

    engines[broken].broken = False
    ends = {key: len(consumer.logs[key]) for key in parts}
    turn_answering(
        worker,
        consumer,
        lambda: all(consumer.group_offsets.get(k, 0) == end for k, end in ends.items()),
    )
    assert consumer.paused == set()
    assert metrics.model_paused.labels(broken)._value.get() == 0
    assert not any("pipeline" in r for r in worker.health.not_ready_reasons())
    for name in ("live", "bulk"):
        got = ids(sink, f"{name}-res")
        for partition in (0, 1):
            answered = [i for i in got if i.startswith(f"r{partition}-")]
            assert answered == [f"r{partition}-{n}" for n in range(48)], name
    assert not [t for t, _ in sink.sent if t.endswith("-dlq")]
