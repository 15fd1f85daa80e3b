"""A replay of a model graph (``worker.replay.steps``): the plan records every step's
model, each run opens exactly those, and a resume refuses a server step whose tensors
changed unless ``--current-model`` asks for it; real ONNX files, a fake server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.graphs import FIELDS, ensemble_steps, graph_config, graph_models
from tests.fakes.offsets import FakeLookup
from tests.fakes.triton import FakeTriton, TritonFailure
from worker.config import ModelSpec, PipelineConfig, WorkerConfig
from worker.errors import ConfigError
from worker.inference import GraphStep, ModelGraph, OnnxEngine, TritonEngine
from worker.replay import ReplayOptions, ReplayPlan
from worker.replay.plan import new_plan
from worker.replay.steps import StepModel, moved_step, opened_steps, pinned_config

URL = "127.0.0.1:8001"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return graph_models(tmp_path_factory.mktemp("graph"))


ON_SERVER = {"name": "srv", "engine": "triton", "triton": {"url": URL, "model": "fraud"}}


def with_server_step(models: dict[str, Path]) -> PipelineConfig:
    """Step one a file, step srv a model on the server (fed a, b, c), the last."""
    one = ensemble_steps(models)[0]
    return graph_config([one, {"name": "srv", "model": ON_SERVER, "inputs": {"x": FIELDS}}])


def plan_of(pipeline: PipelineConfig, opts: ReplayOptions | None = None) -> ReplayPlan:
    config = WorkerConfig(pipelines=[pipeline.model_copy(update={"request_topics": ["t"]})])
    return new_plan(config, opts or ReplayOptions(), FakeLookup(), "r1", lambda _s: "7")


def test_the_plan_records_every_steps_model(models: dict[str, Path]) -> None:
    plan = plan_of(with_server_step(models))
    assert plan.steps == (
        StepModel("one", "one", "1", path=str(models["one"])),
        StepModel("srv", "srv", "7", server=URL, server_model="fraud"),
    )
    assert plan.model_version == "1+7" and plan.model_path is None and plan.server is None
    assert (plan.output_topic, plan.dead_letter_topic) == ("res.replay.1_7", "dlq.replay.1_7")
    assert ReplayPlan.from_json(plan.to_json()) == plan
    files = plan_of(graph_config(ensemble_steps(models)))
    assert [(s.step, s.version, s.path) for s in files.steps] == [
        ("one", "1", str(models["one"])),
        ("two", "7", str(models["two"])),
        ("avg", "1", str(models["mean"])),
    ]
    for given in (
        ReplayOptions(model_path=models["one"], model_version="9"),
        ReplayOptions(model_version="9"),
    ):
        with pytest.raises(ConfigError, match="--model and --model-version name one model"):
            plan_of(graph_config(ensemble_steps(models)), given)


def test_each_run_opens_the_planned_models_or_with_current_model_the_newest(
    models: dict[str, Path],
) -> None:
    pipeline = with_server_step(models)
    plan = plan_of(pipeline)
    steps = (replace(plan.steps[0], sha256="ab" * 32), plan.steps[1])
    pinned = pinned_config(pipeline, steps, current=False)
    one, srv = (step.model for step in pinned.steps or ())
    assert (one.path, one.version, one.sha256, one.watch) == (models["one"], "1", "ab" * 32, False)
    assert srv.triton is not None and srv.triton.version == "7" and srv.watch is False
    assert pinned.model.version == "1+1" and pinned.model.inputs == {
        "one.input": FIELDS,
        "srv.x": FIELDS,
    }
    now = pinned_config(pipeline, steps, current=True)
    one, srv = (step.model for step in now.steps or ())
    assert one.sha256 is None and srv.triton is not None and srv.triton.version is None
    renamed = graph_config(ensemble_steps(models))
    with pytest.raises(ConfigError, match="has steps one, two, avg now; the replay was planned"):
        pinned_config(renamed, steps, current=False)


def server_graph(models: dict[str, Path], server: FakeTriton) -> ModelGraph:
    one = OnnxEngine(ModelSpec(name="one", path=models["one"]))
    spec: dict[str, Any] = {**ON_SERVER, "triton": {**ON_SERVER["triton"], "version": "2"}}  # type: ignore[dict-item]
    srv = TritonEngine(ModelSpec.model_validate(spec), grpc=server.module())
    return ModelGraph(
        [GraphStep("one", one, "1", ("input",)), GraphStep("srv", srv, "2", ("x",))], {}
    )


def test_a_resume_refuses_a_server_step_with_other_tensors_unless_asked(
    models: dict[str, Path],
) -> None:
    pipeline = with_server_step(models)
    plan = plan_of(pipeline)
    pinned = pinned_config(pipeline, plan.steps, current=False)
    first = opened_steps(plan.steps, pinned, server_graph(models, FakeTriton()), check=False)
    assert [s.version for s in first] == ["1", "2"]
    assert first[0].sha256 and first[0].path == str(models["one"]) and first[0].signature is None
    assert first[1].signature and first[1].path is None and first[1].server == URL
    # a restarted server serving the same tensors: goes on, recorded the same
    again = opened_steps(first, pinned, server_graph(models, FakeTriton()), check=True)
    assert again == first
    wider = server_graph(models, FakeTriton(width=4))
    with pytest.raises(ConfigError, match=r"step srv: model fraud version 2 on .* other tensors"):
        opened_steps(first, pinned, wider, check=True)
    taken = opened_steps(first, pinned, wider, check=False)
    assert taken[1].signature != first[1].signature


def test_a_server_step_whose_version_is_gone_is_named_with_the_one_served(
    models: dict[str, Path],
) -> None:
    pipeline = with_server_step(models)
    plan = plan_of(pipeline)  # srv planned on version 7
    server = FakeTriton(versions=["8"], ready={"8"})

    def served(spec: ModelSpec) -> str:
        return TritonEngine(spec, grpc=server.module()).served_version

    moved = moved_step(pipeline, plan.steps, served)
    assert moved is not None, "the server answers with version 8"
    assert "step srv:" in str(moved) and "no version 7 of model fraud" in str(moved)
    assert "serves version 8 now: resume with --current-model" in str(moved)
    server.failures.append(TritonFailure("UNAVAILABLE", "connection refused"))
    assert moved_step(pipeline, plan.steps, served) is None  # an outage, said as such
