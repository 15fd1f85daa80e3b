"""What the pipeline's tests hand a ``Pipeline``: requests, messages, and engines that
wrap the real one to break it on purpose."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from confluent_kafka import KafkaError

from streamfer_dev.modelgen import DemoModel
from tests.fakes.sink import FakeSink
from worker.config import PipelineConfig, parse_config
from worker.core.tracker import DeliveryTracker
from worker.errors import EngineError
from worker.inference.engine import Feeds, OnnxEngine, Outputs, TensorInput
from worker.pipeline.steps import Pipeline

POISON = -999.0  # f0 value the failing engine refuses
NAN_ROW = -1.0  # f0 value for which the NaN engine returns NaN scores
MAX_RECORD_BYTES = 2048
FIELDS = ["a", "b", "c"]  # the features of ``one_pipeline``


class FakeMessage:
    """The part of ``confluent_kafka.Message`` the worker reads; with ``error``, an event
    (the end of a partition, a fetch error) instead of a record."""

    def __init__(
        self,
        value: bytes | None,
        offset: int,
        *,
        key: bytes | None = None,
        topic: str = "req",
        partition: int = 0,
        ts_ms: int = 1_700_000_000_000,
        headers: list[tuple[str, bytes]] | None = None,
        error: KafkaError | None = None,
    ) -> None:
        self._value, self._offset, self._key = value, offset, key
        self._topic, self._partition, self._ts = topic, partition, ts_ms
        self._headers, self._error = headers, error

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def error(self) -> KafkaError | None:
        return self._error


def matrix(feeds: Feeds) -> npt.NDArray[np.float32]:
    """The demo model's one input."""
    (only,) = feeds.values()
    return only


class WrappedEngine:
    """Delegates to the real engine; subclasses break it on purpose."""

    def __init__(self, inner: OnnxEngine) -> None:
        self.inner = inner
        self.calls: list[int] = []

    @property
    def inputs(self) -> Sequence[TensorInput]:
        return self.inner.inputs

    @property
    def model_hash(self) -> str:
        return self.inner.model_hash

    def infer(self, feeds: Feeds) -> Outputs:
        self.calls.append(len(matrix(feeds)))
        return self.inner.infer(feeds)

    def warm_up(self, batch_sizes: Sequence[int], example: Any = None) -> None:
        self.inner.warm_up(batch_sizes, example)


class PoisonEngine(WrappedEngine):
    """Fails the whole call when any row has f0 == POISON."""

    def infer(self, feeds: Feeds) -> Outputs:
        batch = matrix(feeds)
        self.calls.append(len(batch))
        if (batch[:, 0] == POISON).any():
            raise EngineError("poison row in batch")
        return self.inner.infer(feeds)


class NanEngine(WrappedEngine):
    """Returns NaN scores for rows whose f0 == NAN_ROW."""

    def infer(self, feeds: Feeds) -> Outputs:
        out = super().infer(feeds)
        scores = out["scores"].copy()
        scores[matrix(feeds)[:, 0] == NAN_ROW] = np.nan
        return {**out, "scores": scores}


PipelineFactory = Callable[..., Pipeline]


def req(rid: str, entity: str | None = None, features: dict[str, float] | None = None) -> bytes:
    doc: dict[str, Any] = {"id": rid}
    if entity is not None:
        doc["entity"] = entity
    if features is not None:
        doc["features"] = features
    return orjson.dumps(doc)


def inline_row(classifier: DemoModel, i: int, f0: float | None = None) -> dict[str, float]:
    values = classifier.features[i].tolist()
    row = {name: float(v) for name, v in zip(classifier.fields, values, strict=True)}
    if f0 is not None:
        row["f0"] = f0
    return row


def messages(values: Sequence[bytes | None], start: int = 100) -> list[FakeMessage]:
    return [FakeMessage(v, start + i, key=f"k{i}".encode()) for i, v in enumerate(values)]


def handle(
    pipeline: Pipeline, batch: Sequence[FakeMessage], sink: FakeSink
) -> tuple[DeliveryTracker, dict[tuple[str, int], int]]:
    return pipeline.handle(batch, sink)  # type: ignore[arg-type]


def expected_scores(engine: OnnxEngine, classifier: DemoModel, rows: list[int]) -> Any:
    return engine.infer(classifier.features[rows])["scores"].tolist()


def rows(classifier: DemoModel, ids: Sequence[int], start: int = 0) -> list[Any]:
    return messages(
        [req(f"r{i}", features=inline_row(classifier, i % 50)) for i in ids], start=start
    )


class Readiness:
    """Records a pipeline's ``on_model`` calls."""

    def __init__(self) -> None:
        self.heard: list[tuple[bool, str | None]] = []
        self.held = threading.Event()

    def __call__(self, ok: bool, why: str | None) -> None:
        self.heard.append((ok, why))
        if not ok:
            self.held.set()


def one_pipeline(
    model: dict[str, Any], cache: dict[str, Any] | None = None, **tables: Any
) -> PipelineConfig:
    """Pipeline ``p`` of features ``FIELDS``, batches of 8, serving ``model`` (named m),
    with ``tables`` (``canary={...}``, say)."""
    cached = {"cache": cache} if cache is not None else {}
    return pipeline_of(model={"name": "m", **model}, **cached, **tables)


def pipeline_of(**tables: Any) -> PipelineConfig:
    """Pipeline ``p`` of features ``FIELDS``, batches of 8, with ``tables`` (its model,
    or its ``steps``)."""
    raw = {
        "pipelines": [
            {
                "name": "p",
                "request_topics": ["req"],
                "result_topic": "res",
                "dead_letter_topic": "dlq",
                "features": {"fields": FIELDS},
                "batch": {"max_batch_size": 8},
                **tables,
            }
        ]
    }
    return parse_config(raw, environ={}).pipelines[0]
