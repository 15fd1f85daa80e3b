"""The shadow model: a copy of every batch scored off the serving path, its results on
their own topic, its agreement with the pipeline measured, and a shadow that is slow,
failing or undeliverable never touching the pipeline's own results."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson
import pytest
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry

from tests.fakes.onnx_models import random_mlp, three_feature_pipeline
from tests.fakes.pipeline import FakeMessage
from tests.fakes.sink import FakeSink
from worker.compose import Metrics
from worker.config import ModelSpec, PipelineConfig, ShadowSpec
from worker.core.tracker import DeliveryTracker
from worker.errors import EngineError
from worker.inference.engine import Feeds, OnnxEngine, Outputs
from worker.inference.slot import LiveModel, ModelSlot
from worker.kafka.limits import RecordLimits
from worker.kafka.sink import Headers, Sink
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.shadow import Agreement, ShadowRunner
from worker.pipeline.steps import Pipeline

if TYPE_CHECKING:
    from tests.fakes.stores import StoreFactory

FIELDS = ["a", "b", "c"]
SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / "result.schema.json"


@dataclass
class ShadowSink:
    """Takes records as ``Sink.send`` does; ``poll`` delivers them (or fails them)."""

    fail: bool = False
    limit: RecordLimits = field(default_factory=RecordLimits.unread)
    records: list[tuple[str, bytes, bytes | None]] = field(default_factory=list)
    _waiting: list[DeliveryTracker] = field(default_factory=list)

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        tracker.sent += 1
        self.records.append((topic, value, key))
        self._waiting.append(tracker)
        return True

    def poll(self, timeout: float = 0.0) -> int:
        waiting, self._waiting = self._waiting, []
        for tracker in waiting:
            if self.fail:
                tracker.errors.append("shadow-topic[0]: Broker: Unknown topic or partition")
            tracker.acked += 1
        return len(waiting)

    def flush(self, timeout: float) -> int:
        self.poll()
        return 0

    def docs(self) -> list[dict[str, Any]]:
        return [orjson.loads(v) for _t, v, _k in self.records]


def _config(versions: dict[str, Path], **shadow: Any) -> PipelineConfig:
    return three_feature_pipeline(
        versions["1"],
        shadow=ShadowSpec(model=versions["2"], version="2", topic="shadow-topic", **shadow),
    )


@pytest.fixture
def versions(tmp_path: Path) -> dict[str, Path]:
    return {v: random_mlp(tmp_path / v / "model.onnx", seed=int(v)) for v in ("1", "2")}


@dataclass
class Served:
    pipeline: Pipeline
    runner: ShadowRunner
    sink: ShadowSink
    metrics: Metrics

    def count(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "streamfer_shadow_batches_total", {"pipeline": "p", "result": result}
        )
        return value or 0.0

    def gauge(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, {"pipeline": "p"})


def _serve(
    versions: dict[str, Path],
    make_store: StoreFactory,
    *,
    shadow_engine: Any = None,
    sink: ShadowSink | None = None,
    **shadow: Any,
) -> Served:
    config = _config(versions, **shadow)
    assert config.shadow is not None
    data = {
        f"e{i}": {f: repr(float(i % 9 - 4) / 2 + j).encode() for j, f in enumerate(FIELDS)}
        for i in range(30)
    }
    metrics = Metrics(CollectorRegistry())
    spec = config.shadow.model_spec(config.model)
    engine = shadow_engine or OnnxEngine(spec)
    out = sink or ShadowSink()
    runner = ShadowRunner(
        config,
        ModelSlot(LiveModel.of(spec, engine)),
        cast(Sink, out),
        metrics.for_shadow("p"),
    )
    live = OnnxEngine(config.model)
    pipeline = build_pipeline(
        config,
        store=make_store(data, FIELDS),
        engine=live,
        plan=FeedPlan.build(config, live.inputs),
        metrics=metrics.for_pipeline("p"),
        shadow=runner,
    )
    return Served(pipeline, runner, out, metrics)


def _messages(n: int, start: int = 0) -> list[Any]:
    return [
        FakeMessage(f'{{"id": "r{i}", "entity": "e{i % 30}"}}'.encode(), i, key=f"k{i}".encode())
        for i in range(start, start + n)
    ]


def _rows(n: int, start: int = 0) -> np.ndarray[Any, Any]:
    return np.array(
        [[float(i % 30 % 9 - 4) / 2 + j for j in range(3)] for i in range(start, start + n)],
        dtype=np.float32,
    )


def _run(served: Served, batches: list[list[Any]]) -> FakeSink:
    primary_sink = FakeSink()
    for batch in batches:
        p = served.pipeline
        p.publish(p.infer(p.prepare(batch)), primary_sink, DeliveryTracker())
    return primary_sink


def test_every_batch_is_scored_again_and_published_to_the_shadow_topic(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    served = _serve(versions, make_store)
    served.runner.start()
    primary = _run(served, [_messages(20), _messages(13, start=20)])
    assert served.runner.stop(10.0)
    assert len(primary.to("res")) == 33 and not primary.to("dlq")
    docs = served.sink.docs()
    assert {t for t, _v, _k in served.sink.records} == {"shadow-topic"}
    assert [d["id"] for d in docs] == [f"r{i}" for i in range(33)]
    assert [k for _t, _v, k in served.sink.records] == [f"k{i}".encode() for i in range(33)]
    shadow_engine = OnnxEngine(ModelSpec(path=versions["2"], name="x"))
    primary_engine = OnnxEngine(ModelSpec(path=versions["1"], name="x"))
    expected = shadow_engine.infer(_rows(33))["probabilities"]
    np.testing.assert_allclose([d["outputs"]["probabilities"] for d in docs], expected, rtol=1e-6)
    validator = Draft202012Validator(json.loads(SCHEMA.read_text()))
    for doc in docs:
        assert not list(validator.iter_errors(doc))
        assert doc["model"] == {"name": "m", "version": "2", "sha256": shadow_engine.model_hash}
        assert doc["shadows"] == {"name": "m", "version": "1", "sha256": primary_engine.model_hash}
        assert doc["pipeline"] == "p" and doc["timings_ms"]["infer_ms"] >= 0
    assert served.count("done") == 2 and served.count("dropped") == served.count("failed") == 0
    ours = primary_engine.infer(_rows(33))["probabilities"]
    agree = float((ours.argmax(axis=1) == expected.argmax(axis=1)).mean())
    assert served.gauge("streamfer_shadow_label_agreement") == pytest.approx(agree)
    diff = float(np.abs(ours.astype(np.float64) - expected).mean())
    assert served.gauge("streamfer_shadow_score_abs_diff") == pytest.approx(diff, rel=1e-6)
    assert (
        served.metrics.registry.get_sample_value(
            "streamfer_shadow_seconds_count", {"pipeline": "p"}
        )
        == 2
    )


def test_a_full_queue_drops_the_batch_for_the_shadow_only(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    served = _serve(versions, make_store, queue_batches=1)  # not started: nothing drains
    primary = _run(served, [_messages(5), _messages(5, start=5), _messages(5, start=10)])
    assert len(primary.to("res")) == 15
    assert served.count("dropped") == 2
    served.runner.start()
    assert served.runner.stop(10.0)
    assert [d["id"] for d in served.sink.docs()] == [f"r{i}" for i in range(5)]
    assert served.count("done") == 1


def test_the_offer_waits_up_to_its_budget_for_room(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    served = _serve(versions, make_store, queue_batches=1, max_delay_ms=10_000)
    _run(served, [_messages(5)])  # the queue is full now
    started = threading.Event()

    def drain_soon() -> None:
        started.wait(5)
        time.sleep(0.1)
        served.runner.start()

    thread = threading.Thread(target=drain_soon)
    thread.start()
    started.set()
    _run(served, [_messages(5, start=5)])  # waits for the room the shadow makes
    thread.join()
    assert served.runner.stop(10.0)
    assert served.count("dropped") == 0 and served.count("done") == 2


class Broken:
    def __init__(self, inner: OnnxEngine) -> None:
        self.inner = inner

    @property
    def inputs(self) -> Any:
        return self.inner.inputs

    @property
    def model_hash(self) -> str:
        return self.inner.model_hash

    def infer(self, feeds: Feeds) -> Outputs:
        raise EngineError("the shadow's model run failed")

    def warm_up(self, batch_sizes: Any, example: Any = None) -> None:
        return None


def test_a_failing_shadow_is_counted_and_never_dead_letters_a_record(
    versions: dict[str, Path], make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken(OnnxEngine(ModelSpec(path=versions["2"], name="x")))
    served = _serve(versions, make_store, shadow_engine=broken)
    served.runner.start()
    primary = _run(served, [_messages(8), _messages(8, start=8), _messages(8, start=16)])
    assert served.runner.stop(10.0)
    assert len(primary.to("res")) == 24 and not primary.to("dlq")
    assert served.sink.records == []
    assert served.count("failed") == 3 and served.count("done") == 0
    errors = [r.getMessage() for r in caplog.records if r.name == "worker.pipeline.shadow"]
    assert len(errors) == 1  # once a minute at most
    assert "model m:2 failed on a batch of 8 rows: the shadow's model run failed" in errors[0]


def test_undelivered_shadow_results_count_as_failed(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    served = _serve(versions, make_store, sink=ShadowSink(fail=True))
    served.runner.start()
    _run(served, [_messages(4)])
    assert served.runner.stop(10.0)
    assert served.count("failed") == 1 and served.count("done") == 0


def test_agreement_is_over_the_recent_rows_both_models_scored() -> None:
    seen: dict[str, float] = {}
    agreement = Agreement(
        4, lambda v: seen.__setitem__("share", v), lambda v: seen.__setitem__("diff", v)
    )
    ours = {"label": np.array([1, 0, 1]), "scores": np.array([[0.2, 0.8], [0.9, 0.1], [0.4, 0.6]])}
    theirs = {
        "label": np.array([1, 1, 0]),
        "scores": np.array([[0.3, 0.7], [0.4, 0.6], [0.5, 0.5]]),
    }
    agreement.add(ours, theirs, np.array([True, True, False]))  # the third row not compared
    assert seen["share"] == pytest.approx(1 / 2)
    assert seen["diff"] == pytest.approx((0.1 + 0.1 + 0.5 + 0.5) / 4)
    agreement.add(ours, ours, np.array([True, True, True]))
    assert seen["share"] == pytest.approx(4 / 5)  # 2 + 3 rows held: the window is 4 rows
    agreement.add(ours, ours, np.array([True, True, True]))
    assert seen["share"] == pytest.approx(1.0)  # the first batch left the window
    assert seen["diff"] == pytest.approx(0.0)


def test_without_a_label_field_the_highest_score_is_the_label() -> None:
    seen: dict[str, float] = {}
    agreement = Agreement(100, lambda v: seen.__setitem__("share", v), lambda v: None)
    agreement.add(
        {"scores": np.array([[0.2, 0.8], [0.7, 0.3]])},
        {"scores": np.array([[0.4, 0.6], [0.4, 0.6]])},
        np.array([True, True]),
    )
    assert seen["share"] == pytest.approx(0.5)
