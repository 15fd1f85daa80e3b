"""A model graph (``[[pipelines.steps]]``) with real ONNX models: the config's rules,
the steps run on the whole batch in order with scores equal to running the models by
hand, mismatches named at load, and, through a real ``Pipeline``, a step's refused
rows and its fault named in dead letters and readiness."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.graphs import FIELDS, ensemble_steps, graph_config, graph_models
from tests.fakes.onnx_models import random_mlp
from tests.fakes.pipeline import Readiness, handle, messages, req
from tests.fakes.sink import FakeSink
from tests.fakes.stores import MemoryStore
from tests.fakes.triton import FakeTriton, TritonFailure
from worker.compose import Metrics
from worker.config import ModelSpec, PipelineConfig
from worker.errors import ConfigError, EngineError, ModelMismatchError
from worker.inference import LiveModel, ModelGraph, ModelSlot, OnnxEngine, ServingEngine
from worker.inference.engine import Feeds, Outputs
from worker.models import build_pipeline
from worker.models.graph import open_graph
from worker.models.parts import load_model
from worker.models.reloader import Look, ModelWatch, show_model
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.model_faults import ModelFaultWait

POISON = 99.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return graph_models(tmp_path_factory.mktemp("graph"))


def by_hand(path: Path, feeds: dict[str, Any]) -> Any:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


ROWS = np.random.default_rng(5).normal(0, 1, (6, 3)).astype(np.float32)


def test_an_ensemble_scores_the_batch_as_the_models_run_by_hand(models: dict[str, Path]) -> None:
    config = graph_config(ensemble_steps(models))
    assert config.model.name == "one+two+avg"
    assert config.model.inputs == {"one.input": FIELDS, "two.input": ["c", "b", "a"]}
    engine, plan = load_model(config, config.model, warm_up=[1])
    assert isinstance(engine, ModelGraph)
    assert engine.served_version == "1+7+1"
    outputs = engine.infer({"one.input": ROWS, "two.input": ROWS[:, ::-1].copy()})

    first = by_hand(models["one"], {"input": ROWS})
    second = by_hand(models["two"], {"input": ROWS[:, ::-1].copy()})
    mean = by_hand(models["mean"], {"x": first, "y": second})
    assert set(outputs) == {"mean", "second"}
    assert engine.outputs == {"mean": "avg.mean", "second": "two.probabilities"}
    assert engine.output_types["avg.mean"] == "tensor(float)"
    assert np.array_equal(outputs["mean"], mean)
    assert np.array_equal(outputs["second"], second)
    assert [i.name for i in plan.inputs] == ["one.input", "two.input"]


def test_a_chain_feeds_a_step_an_earlier_output(models: dict[str, Path]) -> None:
    steps = [
        {
            "name": "cls",
            "model": {"path": models["one"], "name": "cls"},
            "inputs": {"input": FIELDS},
        },
        {
            "name": "head",
            "model": {"path": models["head"], "name": "head"},
            "inputs": {"input": "cls.probabilities"},
        },
    ]
    config = graph_config(steps)
    engine, _plan = load_model(config, config.model, warm_up=[1])
    outputs = engine.infer({"cls.input": ROWS})
    expected = by_hand(models["head"], {"input": by_hand(models["one"], {"input": ROWS})})
    assert np.array_equal(outputs["value"], expected)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({2: {"inputs": {"x": "one.probabilities", "y": "three.probabilities"}}}, "names no step"),
        ({0: {"inputs": {"input": "avg.mean"}}}, "not an earlier step"),
        ({2: {"inputs": {"x": "avg.mean", "y": "one.probabilities"}}}, "not an earlier step"),
        ({1: {"name": "one"}}, "'one' is named twice"),
        ({0: {"publish": {"second": "probabilities"}}}, "second: also published by one"),
        ({0: {"inputs": {"input": "one"}}}, "is not 'step.output'"),
        (
            {0: {"model": {"path": "x.onnx", "name": "x", "outputs": {"s": "probabilities"}}}},
            "last step",
        ),
    ],
)
def test_a_graph_that_cannot_run_is_refused_when_the_config_loads(
    models: dict[str, Path], change: dict[int, dict[str, Any]], named: str
) -> None:
    steps = ensemble_steps(models)
    for i, fields in change.items():
        steps[i] = {**steps[i], **fields}
    with pytest.raises(ConfigError, match=named):
        graph_config(steps)


def test_steps_beside_a_model_or_a_canary_are_refused(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="either model or steps"):
        graph_config(ensemble_steps(models), model={"path": models["one"], "name": "m"})
    with pytest.raises(ConfigError, match="steps with a canary"):
        graph_config(
            ensemble_steps(models), canary={"model": models["one"], "version": "2", "percent": 5}
        )


@pytest.mark.parametrize(
    ("step", "named"),
    [
        (
            {
                "name": "avg",
                "model": {"name": "avg"},
                "inputs": {"x": "one.probabilities", "y": "one.nothing"},
            },
            r"steps.avg.inputs.y: step one has no output 'nothing'",
        ),
        (
            {"name": "avg", "model": {"name": "avg"}, "inputs": {"x": "one.probabilities"}},
            r"steps.avg: input y of model mean.onnx is fed by nothing",
        ),
        (
            {
                "name": "avg",
                "model": {"name": "avg"},
                "inputs": {"x": "one.probabilities", "y": "one.probabilities", "z": ["a"]},
            },
            r"steps.avg.inputs: model mean.onnx has no input z",
        ),
    ],
)
def test_a_graph_that_does_not_fit_its_models_is_named_at_load(
    models: dict[str, Path], step: dict[str, Any], named: str
) -> None:
    step["model"]["path"] = models["mean"]
    steps = [ensemble_steps(models)[0], step]
    config = graph_config(steps)
    with pytest.raises(ModelMismatchError, match=named):
        load_model(config, config.model, warm_up=[1])


def test_an_output_of_another_width_than_its_input_is_named_at_load(
    models: dict[str, Path],
) -> None:
    steps = [
        ensemble_steps(models)[0],
        {
            "name": "three",
            "model": {"path": models["two"], "name": "three"},
            "inputs": {"input": "one.probabilities"},
        },
    ]
    config = graph_config(steps)
    with pytest.raises(
        ModelMismatchError,
        match=r"steps.three.inputs.input: one.probabilities "
        r"is float32\[2\] per batch row, but input input float\[batch, 3\] takes 3",
    ):
        load_model(config, config.model, warm_up=[1])


class Refusing(OnnxEngine):
    """The real engine, refusing a call with a POISON value in its first input's first
    column, or any call while ``broken``; it records the rows of each call."""

    broken = False

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.calls: list[int] = []

    def infer(self, feeds: Feeds | Any) -> Outputs:
        first = next(iter(feeds.values()))
        self.calls.append(len(first))
        if self.broken:
            raise EngineError("device lost")
        if (np.asarray(first)[:, 0] == POISON).any():
            raise EngineError("poison row")
        return super().infer(feeds)


@pytest.fixture
def abort() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


Opened = tuple[ModelGraph, dict[str, "Refusing"], dict[str, list[int]]]


def opened_graph(config: PipelineConfig) -> Opened:
    """``config``'s graph on engines that refuse as ``Refusing`` says; the rows of each
    call each step saw."""
    engines: dict[str, Refusing] = {}
    calls: dict[str, list[int]] = {}

    def opened(spec: ModelSpec) -> ServingEngine:
        engine = engines[spec.name] = Refusing(spec)
        calls[spec.name] = engine.calls
        return engine

    graph = open_graph(config, opened)
    for seen in calls.values():
        seen.clear()
    return graph, engines, calls


def graph_pipeline(config: PipelineConfig, graph: ModelGraph, **kw: Any) -> Any:
    metrics = Metrics(CollectorRegistry())
    plan = FeedPlan.build(config, graph.inputs)
    return build_pipeline(
        config,
        store=MemoryStore({}, FIELDS),
        engine=graph,
        plan=plan,
        metrics=metrics.for_pipeline("p"),
        **kw,
    )


def inline(i: int, a: float | None = None) -> bytes:
    return req(f"r{i}", features={"a": 0.1 * i if a is None else a, "b": 0.2, "c": -0.3})


def test_rows_a_step_refuses_are_dead_lettered_naming_it_and_reach_no_later_step(
    models: dict[str, Path],
) -> None:
    config = graph_config(ensemble_steps(models))
    graph, _engines, calls = opened_graph(config)
    pipeline = graph_pipeline(config, graph)
    sink = FakeSink()
    values = [inline(i, POISON if i == 3 else None) for i in range(8)]
    handle(pipeline, messages(values), sink)

    dead = [s for s in sink.sent if s.topic == "dlq"]
    assert [d.body["request_id"] for d in dead] == ["r3"]
    assert dead[0].header("streamfer.error_code") == b"model_error"
    assert dead[0].body["reason"].startswith("step one: poison row")
    results = {s.body["id"]: s.body for s in sink.sent if s.topic == "res"}
    assert sorted(results) == [f"r{i}" for i in range(8) if i != 3]
    assert results["r0"]["model"]["name"] == "one+two+avg"
    # the whole batch once at step one; after its bisection, no call of a later step
    # held row 3: step two ran only on the halves without it
    assert calls["one"][0] == 8
    assert 8 not in calls["avg"]
    rows = np.array([[0.1 * i, 0.2, -0.3] for i in (0, 1, 2)], dtype=np.float32)
    mean = by_hand(
        models["mean"],
        {
            "x": by_hand(models["one"], {"input": rows}),
            "y": by_hand(models["two"], {"input": rows[:, ::-1].copy()}),
        },
    )
    got = np.array([results[f"r{i}"]["outputs"]["mean"] for i in (0, 1, 2)], dtype=np.float32)
    assert np.array_equal(got, mean)


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ModelFaultWait, "RETRY_S", (0.05, 0.2))
    monkeypatch.setattr(ModelFaultWait, "LOOK_S", 0.01)


@pytest.mark.usefixtures("quick_retries")
def test_a_step_at_fault_holds_the_batch_and_readiness_names_the_step(
    models: dict[str, Path], abort: threading.Event
) -> None:
    config = graph_config(ensemble_steps(models))
    graph, engines, _calls = opened_graph(config)
    readiness = Readiness()
    pipeline = graph_pipeline(config, graph, abort=abort, on_model=readiness)
    sink = FakeSink()
    handle(pipeline, messages([inline(i) for i in range(8)]), sink)
    engines["avg"].broken = True

    held = threading.Thread(
        target=handle,
        args=(pipeline, messages([inline(i) for i in range(8, 16)], start=200), sink),
        daemon=True,
    )
    held.start()
    assert readiness.held.wait(5)
    why = next(w for ok, w in readiness.heard if not ok)
    assert why is not None and "step avg: device lost" in why
    assert not [s for s in sink.sent if s.topic == "dlq"]
    engines["avg"].broken = False
    held.join(5)
    assert not held.is_alive()
    assert len([s for s in sink.sent if s.topic == "res"]) == 16
    assert readiness.heard[-1] == (True, None)


def _settled(path: Path) -> Path:
    then = time.time() - 60
    os.utime(path, (then, then))
    return path


def watched(config: PipelineConfig) -> tuple[ModelSlot, ModelWatch]:
    """The graph of ``config`` loaded into a slot, and the reloader's watch of it."""
    metrics = Metrics(CollectorRegistry())
    loaded = load_model(config, config.model, warm_up=[1])
    slot = ModelSlot(LiveModel.of(config.model, loaded.engine))
    shown = show_model(metrics, "p", slot.for_batch().identity, "cpu", hide=None)
    return slot, ModelWatch(config, slot, loaded, metrics, shown=shown)


def test_a_steps_new_version_reloads_the_graph_and_a_misfit_one_is_refused(
    models: dict[str, Path], tmp_path: Path
) -> None:
    versions = tmp_path / "two"
    _settled(random_mlp(versions / "1" / "model.onnx", seed=2))
    steps = ensemble_steps(models)
    steps[1]["model"] = {"path": versions, "name": "two"}
    config = graph_config(steps)
    slot, watch = watched(config)
    assert watch.polls  # a step's directory of versions is followed
    assert slot.for_batch().identity.version == "1+1+1"
    assert watch.look() is Look.IDLE

    _settled(random_mlp(versions / "2" / "model.onnx", seed=9))
    assert watch.look() is Look.LOADED
    live = slot.for_batch()
    assert live.identity.version == "1+2+1"
    outputs = live.engine.infer({"one.input": ROWS, "two.input": ROWS[:, ::-1].copy()})
    second = by_hand(versions / "2" / "model.onnx", {"input": ROWS[:, ::-1].copy()})
    assert np.array_equal(outputs["second"], second)
    assert watch.look() is Look.IDLE

    _settled(random_mlp(versions / "3" / "model.onnx", n_in=4, seed=3))
    assert watch.look() is Look.REFUSED
    assert slot.for_batch().identity.version == "1+2+1"
    assert watch.look() is Look.IDLE  # not tried again until it changes


def test_an_invalid_step_is_reported_under_steps_alone(models: dict[str, Path]) -> None:
    steps = ensemble_steps(models)
    del steps[1]["name"]
    with pytest.raises(ConfigError) as raised:
        graph_config(steps)
    assert str(raised.value).splitlines()[1:] == ["  pipelines[0].steps[1].name: Field required"]


def test_a_new_version_of_a_step_on_a_server_reloads_the_graph(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step srv runs on a (fake) Triton server: a version the server makes ready is
    followed as a step's new file is; a server that cannot answer changes nothing."""
    server = FakeTriton(versions=["1", "2"], ready={"1", "2"})
    monkeypatch.setattr("worker.inference.triton.client_module", server.module)
    srv = {"name": "srv", "engine": "triton", "triton": {"url": "10.0.0.1:8001"}}
    steps = [ensemble_steps(models)[0], {"name": "srv", "model": srv, "inputs": {"x": FIELDS}}]
    config = graph_config(steps)
    slot, watch = watched(config)
    assert watch.polls  # an unpinned server step is followed
    assert slot.for_batch().identity.version == "1+2"
    assert watch.look() is Look.IDLE

    server.versions.append("3")
    server.ready.add("3")
    assert watch.look() is Look.LOADED
    assert slot.for_batch().identity.version == "1+3"
    assert watch.look() is Look.IDLE

    server.failures.append(TritonFailure("UNAVAILABLE", "connection refused"))
    assert watch.look() is Look.IDLE
    assert slot.for_batch().identity.version == "1+3"
