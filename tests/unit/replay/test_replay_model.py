"""The model a replay runs (``worker.replay.model``, ``new_plan``): a pipeline on a Triton
server replays there, pinned by version and signature, against the fake server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.offsets import FakeLookup
from tests.fakes.triton import FakeTriton, TritonFailure
from worker.config import ModelSpec, WorkerConfig
from worker.errors import ConfigError
from worker.inference import TritonEngine
from worker.replay import ReplayOptions, ReplayPlan
from worker.replay.model import _moved_on, _opened, replay_spec
from worker.replay.plan import new_plan

URL = "127.0.0.1:8001"


def config(model: dict[str, Any]) -> WorkerConfig:
    pipeline = {
        "name": "p",
        "request_topics": ["t"],
        "result_topic": "res",
        "dead_letter_topic": "dlq",
        "features": {"fields": ["a"]},
        "model": model,
    }
    return WorkerConfig.model_validate({"pipelines": [pipeline]})


ON_SERVER = {"name": "m", "engine": "triton", "triton": {"url": URL, "model": "fraud"}}


def plan_of(opts: ReplayOptions, asked: list[ModelSpec] | None = None) -> ReplayPlan:
    def served(spec: ModelSpec) -> str:
        if asked is not None:
            asked.append(spec)
        return "7"

    return new_plan(config(ON_SERVER), opts, FakeLookup(), "r1", served)


def test_a_plan_on_a_server_records_it_and_the_version_it_serves() -> None:
    asked: list[ModelSpec] = []
    plan = plan_of(ReplayOptions(), asked)
    assert len(asked) == 1
    assert (plan.server, plan.server_model, plan.model_version) == (URL, "fraud", "7")
    assert plan.model_path is None and plan.output_topic == "res.replay.7"
    assert plan.dead_letter_topic == "dlq.replay.7"
    assert ReplayPlan.from_json(plan.to_json()) == plan
    pinned = plan_of(ReplayOptions(model_version="3"), asked)
    assert pinned.model_version == "3" and len(asked) == 1, "a pinned version asks nobody"


def test_a_file_given_instead_runs_in_the_worker_pinned_by_its_hash(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx")
    plan = plan_of(ReplayOptions(model_path=model, model_version="9"))
    assert plan.server is None and plan.model_path == str(model)
    assert plan.model_version == "9"
    plan = replace(plan, model_sha256="ab" * 32)
    spec = replay_spec(config(ON_SERVER).pipelines[0], plan, current=False)
    assert (spec.engine, spec.triton, spec.path) == ("onnxruntime", None, model)
    assert spec.sha256 == "ab" * 32 and spec.version == "9"
    assert replay_spec(config(ON_SERVER).pipelines[0], plan, current=True).sha256 is None


def test_a_replay_runs_the_planned_version_or_with_current_model_the_served_one() -> None:
    plan = replace(plan_of(ReplayOptions()), model_version="1")
    pipeline = config(ON_SERVER).pipelines[0]
    spec = replay_spec(pipeline, plan, current=False)
    assert spec.triton is not None and spec.triton.version == "1" and spec.watch is False
    assert spec.triton.url == URL and spec.triton.model == "fraud"
    current = replay_spec(pipeline, plan, current=True)
    assert current.triton is not None and current.triton.version is None
    on_a_file = config({"name": "m", "path": "m.onnx"}).pipelines[0]
    with pytest.raises(ConfigError, match="names no Triton server now"):
        replay_spec(on_a_file, plan, current=False)


def engine(server: FakeTriton, version: str | None = None) -> TritonEngine:
    triton = {**ON_SERVER["triton"], "version": version}  # type: ignore[dict-item]
    spec = ModelSpec.model_validate({**ON_SERVER, "triton": triton})
    return TritonEngine(spec, grpc=server.module())


def test_a_resume_refuses_a_model_that_takes_other_tensors_unless_asked() -> None:
    planned = _opened(
        replace(plan_of(ReplayOptions()), model_version="1"),
        engine(FakeTriton(), "1"),
        resuming=False,
        current=False,
    )
    assert planned.model_version == "1" and planned.model_signature is not None
    # the same version and tensors on a restarted server: goes on
    assert _opened(planned, engine(FakeTriton(), "1"), resuming=True, current=False) == planned
    wider = engine(FakeTriton(width=4), "1")
    with pytest.raises(ConfigError, match="other tensors than when the replay was planned"):
        _opened(planned, wider, resuming=True, current=False)
    taken = _opened(planned, wider, resuming=True, current=True)
    assert taken.model_signature == wider.signature != planned.model_signature


def test_a_version_the_server_no_longer_serves_is_refused_naming_the_one_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = FakeTriton(versions=["2"], ready={"2"})
    monkeypatch.setattr("worker.inference.triton.client_module", server.module)
    plan = replace(plan_of(ReplayOptions()), model_version="1")
    spec = replay_spec(config(ON_SERVER).pipelines[0], plan, current=False)
    moved = _moved_on(spec, plan, resuming=True)
    assert moved is not None
    assert "version 1" in str(moved) and "serves version 2 now" in str(moved)
    assert "--current-model" in str(moved)
    new = _moved_on(spec, plan, resuming=False)
    assert new is not None and "has no version 1 of model fraud ready" in str(new)
    server.failures.append(TritonFailure("UNAVAILABLE", "connection refused"))
    assert _moved_on(spec, plan, resuming=True) is None, "a server down is an outage"
