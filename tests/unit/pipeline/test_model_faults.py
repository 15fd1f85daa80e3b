"""A model that fails on every row: told from records that fail it, and waited out
(``worker.pipeline.model_faults``), with the real ONNX engine and Pipeline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.pipeline import (
    POISON,
    PipelineFactory,
    Readiness,
    WrappedEngine,
    handle,
    inline_row,
    matrix,
    messages,
    req,
    rows,
)
from tests.fakes.sink import FakeSink
from worker.compose import Metrics
from worker.config import ModelSpec, PipelineConfig
from worker.errors import EngineError
from worker.inference import LiveModel, ModelIdentity
from worker.inference.engine import Feeds, OnnxEngine, Outputs
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.model_faults import ModelFault, ModelFaultWait
from worker.pipeline.steps import Pipeline

# test_pipeline's fixtures: the real engine and store, a recording sink

DEVICE_ERROR = "CUDA failure 700: an illegal memory access was encountered"


class BreakableEngine(WrappedEngine):
    """The real engine, refusing every call while ``broken`` (a device error that
    persists), and any call holding a POISON row (a record at fault)."""

    broken = False

    def infer(self, feeds: Feeds) -> Outputs:
        batch = matrix(feeds)
        self.calls.append(len(batch))
        if self.broken:
            raise EngineError(DEVICE_ERROR)
        if (batch[:, 0] == POISON).any():
            raise EngineError("poison row in batch")
        return self.inner.infer(feeds)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ModelFaultWait, "RETRY_S", (0.05, 0.2))
    monkeypatch.setattr(ModelFaultWait, "LOOK_S", 0.01)


@pytest.fixture
def abort() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # a test that failed must not leave a batch waiting


def in_thread(pipeline: Pipeline, batch: list[Any], sink: FakeSink) -> threading.Thread:
    thread = threading.Thread(target=handle, args=(pipeline, batch, sink), daemon=True)
    thread.start()
    return thread


def paused(metrics: Metrics) -> float:
    return metrics.model_paused.labels("p")._value.get()  # type: ignore[no-any-return]


Setup = tuple[BreakableEngine, Readiness, Pipeline]


@pytest.fixture
def broken_after_serving(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    abort: threading.Event,
) -> Callable[[int], Setup]:
    """A pipeline whose engine served ``n`` rows in one batch and then broke."""

    def make(n: int) -> Setup:
        engine = BreakableEngine(onnx_engine)
        readiness = Readiness()
        pipeline = make_pipeline(engine, abort=abort, on_model=readiness)
        handle(pipeline, rows(classifier, range(n)), sink)
        engine.broken = True
        engine.calls.clear()
        return engine, readiness, pipeline

    return make


def failed_batches(metrics: Metrics) -> float:
    return metrics.model_failed_batches.labels("p")._value.get()  # type: ignore[no-any-return]


def test_a_model_that_breaks_holds_the_batch_after_two_calls_and_serves_it_once_fixed(
    broken_after_serving: Callable[[int], Setup],
    sink: FakeSink,
    classifier: DemoModel,
    metrics: Metrics,
) -> None:
    engine, readiness, pipeline = broken_after_serving(8)

    held = in_thread(pipeline, rows(classifier, range(8, 72), start=200), sink)
    assert readiness.held.wait(5)
    assert engine.calls[:2] == [64, 1]  # the whole batch, then the row answered before
    assert paused(metrics) == 1 and failed_batches(metrics) == 1
    ok, why = readiness.heard[0]
    assert not ok and why is not None and DEVICE_ERROR in why and "pipeline p" in why
    assert held.is_alive() and len(sink.sent) == 8  # nothing of it dead-lettered

    engine.broken = False
    held.join(5)
    assert not held.is_alive()
    assert [s.topic for s in sink.sent] == ["res"] * 72
    assert readiness.heard[-1] == (True, None) and paused(metrics) == 0
    assert set(engine.calls) == {64, 1}  # tried whole (and probed) again, never bisected


def test_a_reload_during_the_hold_serves_the_batch_on_the_new_model_at_once(
    broken_after_serving: Callable[[int], Setup],
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ModelFaultWait, "RETRY_S", (60.0, 60.0))  # only a reload frees it
    _engine, readiness, pipeline = broken_after_serving(4)
    held = in_thread(pipeline, rows(classifier, range(4, 20), start=200), sink)
    assert readiness.held.wait(5)

    good = WrappedEngine(onnx_engine)
    pipeline.slot.swap(
        LiveModel.of(ModelSpec(path=classifier.path, name="demo", version="4"), good)
    )
    held.join(5)
    assert not held.is_alive()
    assert good.calls == [16]
    results = [s for s in sink.sent if s.topic == "res"]
    assert len(results) == 20 and len(sink.sent) == 20
    assert {r.body["model"]["version"] for r in results[4:]} == {"4"}


def test_a_stopping_worker_ends_the_hold_and_publishes_nothing_of_the_batch(
    broken_after_serving: Callable[[int], Setup],
    sink: FakeSink,
    classifier: DemoModel,
    abort: threading.Event,
) -> None:
    _engine, readiness, pipeline = broken_after_serving(4)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            handle(pipeline, rows(classifier, range(4, 12), start=200), sink)
        except ModelFault as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert readiness.held.wait(5)
    abort.set()
    thread.join(5)
    assert len(raised) == 1 and DEVICE_ERROR in str(raised[0])
    assert len(sink.sent) == 4


def test_records_at_fault_after_a_good_batch_are_bisected_and_dead_lettered(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    metrics: Metrics,
) -> None:
    engine = BreakableEngine(onnx_engine)
    pipeline = make_pipeline(engine)
    handle(pipeline, rows(classifier, range(4)), sink)
    values = [req(f"r{i}", features=inline_row(classifier, i, f0=POISON)) for i in range(4)]
    engine.calls.clear()
    handle(pipeline, messages(values, start=200), sink)  # every row poisoned: the records'
    assert engine.calls[:2] == [4, 1]  # the probe answered, so the rows are bisected
    assert [s.topic for s in sink.sent[4:]] == ["dlq"] * 4
    assert failed_batches(metrics) == 0 and paused(metrics) == 0


@pytest.mark.parametrize(("pause_after", "dead_lettered"), [(3, 2), (2, 1), (1, 0)])
def test_before_any_row_is_answered_the_nth_refused_batch_in_a_row_waits(
    make_pipeline: PipelineFactory,
    config: PipelineConfig,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    metrics: Metrics,
    abort: threading.Event,
    pause_after: int,
    dead_lettered: int,
) -> None:
    engine = BreakableEngine(onnx_engine)
    engine.broken = True
    readiness = Readiness()
    cfg = config.model_copy(update={"pause_after_model_failures": pause_after})
    pipeline = make_pipeline(engine, config=cfg, abort=abort, on_model=readiness)
    for b in range(dead_lettered):
        handle(pipeline, rows(classifier, range(b * 2, b * 2 + 2), start=b * 10), sink)
    assert [s.topic for s in sink.sent] == ["dlq"] * 2 * dead_lettered
    assert not readiness.heard

    held = in_thread(pipeline, rows(classifier, range(40, 42), start=500), sink)
    assert readiness.held.wait(5)
    assert failed_batches(metrics) == dead_lettered + 1
    assert len(sink.sent) == 2 * dead_lettered
    engine.broken = False
    held.join(5)
    assert [s.topic for s in sink.sent[2 * dead_lettered :]] == ["res", "res"]


def test_a_batch_with_an_answered_row_resets_the_count(
    make_pipeline: PipelineFactory,
    config: PipelineConfig,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    metrics: Metrics,
) -> None:
    engine = BreakableEngine(onnx_engine)
    cfg = config.model_copy(update={"pause_after_model_failures": 2})
    pipeline = make_pipeline(engine, config=cfg)
    poisoned = [req(f"r{i}", features=inline_row(classifier, i, f0=POISON)) for i in range(2)]
    handle(pipeline, messages(poisoned, start=0), sink)  # 1 refused batch, nothing to test
    mixed = [*poisoned[:1], req("r9", features=inline_row(classifier, 9))]
    handle(pipeline, messages(mixed, start=10), sink)  # a row answered: the count resets
    engine.calls.clear()
    handle(pipeline, messages(poisoned, start=20), sink)  # tested on r9's row: the records'
    assert engine.calls[:2] == [2, 1]
    assert [s.topic for s in sink.sent] == ["dlq", "dlq", "dlq", "res", "dlq", "dlq"]
    assert failed_batches(metrics) == 1


def test_a_hook_that_fails_on_every_row_holds_instead_of_dead_lettering(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    abort: threading.Event,
) -> None:
    wrong_dtype = threading.Event()

    def prepare(requests: Sequence[Any], inputs: Any) -> Any:
        (x,) = inputs.values()
        return {"X": x.astype(np.float64 if wrong_dtype.is_set() else np.float32)}

    readiness = Readiness()
    pipeline = make_pipeline(hooks=BatchHooks(prepare=prepare), abort=abort, on_model=readiness)
    handle(pipeline, rows(classifier, range(3)), sink)
    wrong_dtype.set()
    held = in_thread(pipeline, rows(classifier, range(3, 9), start=100), sink)
    assert readiness.held.wait(5)
    _ok, why = readiness.heard[0]
    assert why is not None and "double" in why
    wrong_dtype.clear()
    held.join(5)
    assert [s.topic for s in sink.sent] == ["res"] * 9


def test_the_registry_counts_metrics_per_pipeline() -> None:
    metrics = Metrics(CollectorRegistry())
    bound = metrics.for_pipeline("q")
    bound.model_failed_batches.inc()
    bound.model_paused.set(1)
    text = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert text["streamfer_model_failed_batches_total"] == 1
    assert text["streamfer_model_paused"] == 1


def test_the_hold_never_blocks_and_backs_off_on_its_clock() -> None:
    """On an injected clock: the held batch is tried at 1 s, 2 s, 4 s ... (at most
    30 s) after each fault on the same model, at once on another model, and the
    ``Parked`` it raises meanwhile looks back within ``LOOK_S``; abort ends it."""
    now = [100.0]
    first = ModelIdentity("m", "1", "00" * 32)
    serving = [first]
    abort = threading.Event()
    readiness = Readiness()
    gauge = Metrics(CollectorRegistry()).model_paused.labels("p")
    wait = ModelFaultWait(
        "p",
        abort=abort,
        paused=gauge,
        on_model=readiness,
        model=lambda: serving[0],
        clock=lambda: now[0],
    )
    wait.RETRY_S, wait.LOOK_S = (1.0, 30.0), 0.25
    parked = wait.held(ModelFault(DEVICE_ERROR), first)
    assert wait.holding and gauge._value.get() == 1 and readiness.heard[-1][0] is False
    assert parked.after_s == 0.25
    now[0] += 0.9
    assert not wait.try_now()
    now[0] += 0.1
    assert wait.try_now()
    wait.held(ModelFault(DEVICE_ERROR), first)  # the same fault again: twice as long
    now[0] += 1.9
    assert not wait.try_now()
    now[0] += 0.1
    assert wait.try_now()
    serving[0] = ModelIdentity("m", "2", "11" * 32)
    assert wait.try_now(), "a reloaded model is tried at once"
    wait.held(ModelFault(DEVICE_ERROR), serving[0])  # and after it fails, 1 s again
    now[0] += 1.0
    assert wait.try_now()
    wait.released()
    assert not wait.holding and gauge._value.get() == 0 and readiness.heard[-1] == (True, None)

    wait.held(ModelFault(DEVICE_ERROR), serving[0])
    abort.set()
    with pytest.raises(ModelFault, match="CUDA failure"):
        wait.try_now()
    assert not wait.holding and gauge._value.get() == 0
