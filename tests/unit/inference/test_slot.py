"""The live model of a pipeline: read once per batch at the infer step, swapped between
batches, and a replaced engine released as soon as its last batch is published."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.onnx_models import random_mlp, three_feature_pipeline
from tests.fakes.pipeline import FakeMessage
from tests.fakes.sink import FakeSink
from worker.compose import Metrics
from worker.config import ModelSpec, PipelineConfig
from worker.core.tracker import DeliveryTracker
from worker.inference.engine import OnnxEngine
from worker.inference.slot import LiveModel, ModelIdentity, ModelSlot
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.steps import Pipeline

if TYPE_CHECKING:
    from tests.fakes.stores import StoreFactory

FIELDS = ["a", "b", "c"]
ROWS = {"e0": [0.5, -1.0, 2.0], "e1": [1.5, 0.25, -0.75], "e2": [-2.0, 3.0, 0.0]}


@pytest.fixture
def versions(tmp_path: Path) -> dict[str, Path]:
    """Two versions of one 3 -> 2 model: the same signature, other weights."""
    return {v: random_mlp(tmp_path / v / "model.onnx", seed=int(v)) for v in ("1", "2")}


@pytest.fixture
def config(versions: dict[str, Path]) -> PipelineConfig:
    return three_feature_pipeline(versions["1"])


@pytest.fixture
def pipeline(config: PipelineConfig, make_store: StoreFactory) -> Pipeline:
    data = {
        e: {f: repr(v).encode() for f, v in zip(FIELDS, row, strict=True)}
        for e, row in ROWS.items()
    }
    engine = OnnxEngine(config.model)
    return build_pipeline(
        config,
        store=make_store(data, FIELDS),
        engine=engine,
        plan=FeedPlan.build(config, engine.inputs),
        metrics=Metrics(CollectorRegistry()).for_pipeline("p"),
    )


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counting frees objects: what is released is released at once."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _live(config: PipelineConfig, path: Path, version: str) -> LiveModel:
    spec = config.model.model_copy(update={"path": path, "version": version})
    return LiveModel.of(spec, OnnxEngine(spec))


def _batch(*entities: str, start: int = 0) -> list[Any]:
    return [
        FakeMessage(f'{{"id": "r{start + i}", "entity": "{e}"}}'.encode(), start + i)
        for i, e in enumerate(entities)
    ]


def _expected(path: Path, entities: list[str]) -> np.ndarray[Any, Any]:
    engine = OnnxEngine(ModelSpec(path=path, name="x"))
    rows = np.array([ROWS[e] for e in entities], dtype=np.float32)
    return np.asarray(engine.infer(rows)["probabilities"])


class _Engine:
    inputs: tuple[Any, ...] = ()
    model_hash = "ab" * 32

    def infer(self, feeds: Any) -> Any:
        return {}

    def warm_up(self, batch_sizes: Any, example: Any = None) -> None:
        return None


def test_identity_is_what_results_and_dead_letters_carry() -> None:
    model = ModelIdentity("fraud", "3", "cd" * 32)
    assert model.meta == {"name": "fraud", "version": "3", "sha256": "cd" * 32}
    assert model.tag == "fraud:3"
    assert model == ModelIdentity("fraud", "3", "cd" * 32)


def test_swap_serves_the_new_model_from_the_next_read_and_hands_back_the_old() -> None:
    first = LiveModel(_Engine(), ModelIdentity("m", "1", "00" * 32))
    second = LiveModel(_Engine(), ModelIdentity("m", "2", "11" * 32))
    slot = ModelSlot(first)
    held = slot.for_batch()
    assert slot.swap(second) is first
    assert held is first  # a batch that read before the swap keeps its model
    assert slot.for_batch() is second


def test_each_batch_runs_on_and_names_the_model_it_read_at_its_infer_step(
    pipeline: Pipeline, config: PipelineConfig, versions: dict[str, Path]
) -> None:
    sink = FakeSink()
    before = pipeline.infer(pipeline.prepare(_batch("e0", "e1")))
    enriched_before = pipeline.prepare(_batch("e2", "e0", start=10))  # enriched on v1's watch
    pipeline.slot.swap(_live(config, versions["2"], "2"))
    after = pipeline.infer(enriched_before)
    for prepared in (after, before):  # publish order does not matter either
        pipeline.publish(prepared, sink, DeliveryTracker())
    by_id = {s.body["id"]: s.body for s in sink.to("res")}
    for ids, version, entities in (
        (["r0", "r1"], "1", ["e0", "e1"]),
        (["r10", "r11"], "2", ["e2", "e0"]),
    ):
        scores = np.array([by_id[i]["outputs"]["probabilities"] for i in ids])
        np.testing.assert_allclose(scores, _expected(versions[version], entities), rtol=1e-6)
        for i in ids:
            assert by_id[i]["model"] == {"name": "m", "version": version}


def test_dead_letters_name_the_version_of_their_batch(
    pipeline: Pipeline, config: PipelineConfig, versions: dict[str, Path]
) -> None:
    sink = FakeSink()
    first = pipeline.infer(pipeline.prepare(_batch("e0", "nobody")))
    pipeline.slot.swap(_live(config, versions["2"], "2"))
    second = pipeline.infer(pipeline.prepare([FakeMessage(b"not json", 20)]))
    pipeline.publish(first, sink, DeliveryTracker())
    pipeline.publish(second, sink, DeliveryTracker())
    assert [d.body["model"] for d in sink.to("dlq")] == ["m:1", "m:2"]


@pytest.mark.usefixtures("no_cycle_collector")
def test_a_replaced_engine_lives_until_its_last_batch_is_published(
    pipeline: Pipeline, config: PipelineConfig, versions: dict[str, Path]
) -> None:
    sink = FakeSink()
    old = weakref.ref(pipeline.slot.for_batch().engine)
    in_flight = [pipeline.infer(pipeline.prepare(_batch("e0", "e1")))]  # held as a stage holds it
    pipeline.slot.swap(_live(config, versions["2"], "2"))
    newer = pipeline.infer(pipeline.prepare(_batch("e2", start=5)))
    assert old() is not None, "a batch that ran on it is not published yet"
    tracker = DeliveryTracker()
    pipeline.publish(in_flight.pop(), sink, tracker)
    assert old() is None, "released by reference counting as its last batch published"
    assert tracker.published is not None  # still there to dead-letter refused results
    assert tracker.published.model == "m:1"
    pipeline.publish(newer, sink, DeliveryTracker())
    assert pipeline.slot.for_batch().identity.version == "2"


@pytest.mark.usefixtures("no_cycle_collector")
def test_an_engine_no_batch_ran_on_is_released_by_the_swap(
    pipeline: Pipeline, config: PipelineConfig, versions: dict[str, Path]
) -> None:
    old = weakref.ref(pipeline.slot.for_batch().engine)
    pipeline.slot.swap(_live(config, versions["2"], "2"))
    assert old() is None
