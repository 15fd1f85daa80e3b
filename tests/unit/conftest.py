"""Shared fixtures of the unit tests: no network, no Kafka, no Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel, make_classifier
from tests.fakes.pipeline import MAX_RECORD_BYTES, PipelineFactory
from tests.fakes.sink import FakeSink
from tests.fakes.stores import MemoryStore, StoreFactory
from worker.compose import Metrics
from worker.config import FeatureSpec, ModelSpec, PipelineConfig
from worker.inference.engine import InferenceEngine, OnnxEngine
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.steps import Pipeline


@pytest.fixture
def make_store() -> StoreFactory:
    """Build an in-memory feature store: ``make_store({"e1": {"a": b"1"}}, ["a"])``."""
    return MemoryStore


@pytest.fixture(scope="session")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    """The demo random-forest classifier (30 features, 2 classes), built once (~3 s)."""
    path: Path = tmp_path_factory.mktemp("model") / "m.onnx"
    return make_classifier(path)


# --- a pipeline over the demo classifier, an in-memory store and a fake sink ------------


@pytest.fixture(scope="module")
def onnx_engine(classifier: DemoModel) -> OnnxEngine:
    return OnnxEngine(ModelSpec(path=classifier.path, name="demo"))


@pytest.fixture
def config(classifier: DemoModel) -> PipelineConfig:
    return PipelineConfig(
        name="p",
        request_topics=["req"],
        result_topic="res",
        dead_letter_topic="dlq",
        features=FeatureSpec(fields=classifier.fields, on_missing_entity="dead_letter"),
        model=ModelSpec(path=classifier.path, name="demo", version="3"),
        max_record_bytes=MAX_RECORD_BYTES,
    )


@pytest.fixture
def store(make_store: StoreFactory, classifier: DemoModel) -> MemoryStore:
    data = {
        f"e{i}": {
            name: repr(float(v)).encode() for name, v in zip(classifier.fields, row, strict=True)
        }
        for i, row in enumerate(classifier.features[:50].tolist())
    }
    return make_store(data, classifier.fields)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


@pytest.fixture
def make_pipeline(
    config: PipelineConfig, store: MemoryStore, onnx_engine: OnnxEngine, metrics: Metrics
) -> PipelineFactory:
    def make(engine: InferenceEngine | None = None, **kw: Any) -> Pipeline:
        """A pipeline on ``config`` (or ``config=``) and ``onnx_engine`` (or ``engine``)."""
        cfg: PipelineConfig = kw.pop("config", config)
        engine = engine if engine is not None else onnx_engine
        return build_pipeline(
            cfg,
            store=kw.pop("store", store),
            engine=engine,
            plan=FeedPlan.build(cfg, engine.inputs),
            metrics=metrics.for_pipeline("p"),
            **kw,
        )

    return make


@pytest.fixture
def sink() -> FakeSink:
    return FakeSink()
