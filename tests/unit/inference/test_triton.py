"""``TritonEngine`` against a fake server (``tests.fakes.triton``), its config, and
the infer step waiting out a server that cannot answer, with the real Pipeline."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from streamfer_dev.modelgen import DemoModel
from tests.fakes import pipeline as base
from tests.fakes.pipeline import Readiness, WrappedEngine, matrix, one_pipeline, rows
from tests.fakes.sink import FakeSink
from tests.fakes.triton import FakeTriton, TritonFailure
from tests.fakes.waits import wait_for
from worker.compose import Metrics
from worker.config import ModelSpec, PipelineConfig, load_config
from worker.errors import ConfigError, EngineError, InferenceServerError
from worker.inference import LiveModel, ModelSlot, TritonEngine
from worker.inference.engine import Feeds, Outputs
from worker.inference.triton import call_failure
from worker.models import LoadedModel, load_candidates
from worker.models.reloader import Look, ModelWatch, show_model
from worker.ops.health import HealthState
from worker.pipeline import FeedPlan


def spec(**triton: Any) -> ModelSpec:
    return ModelSpec.model_validate(
        {"name": "m", "engine": "triton", "triton": {"url": "10.0.0.1:8001", **triton}}
    )


def engine(server: FakeTriton, **kw: Any) -> TritonEngine:
    return TritonEngine(spec(**kw), grpc=server.module())


def test_reads_the_models_signature_and_serves_its_highest_ready_version() -> None:
    server = FakeTriton(versions=["1", "2", "10"], ready={"1", "2"})
    e = engine(server)
    assert e.served_version == "2"
    assert e.max_batch_size == 4
    (x,) = e.inputs
    assert (x.name, x.onnx_type, x.rank, x.width) == ("x", "tensor(float)", 2, 3)
    assert e.outputs == {"score": "score"} and e.output_types == {"score": "tensor(float)"}
    assert e.provider == "triton"
    assert engine(server, version="1").served_version == "1"
    assert e.model_hash != engine(FakeTriton(width=4)).model_hash


def test_a_models_identity_outlives_a_server_restart_and_tells_models_apart() -> None:
    """What the server writes anew at each start (its workspace) and the versions it
    lists leave ``model_hash`` as it was; another version, signature or output shape
    changes it."""
    first = engine(FakeTriton(workspace="/tmp/pytriton-a"), version="2").model_hash
    restarted = FakeTriton(versions=["1", "2", "3"], workspace="/tmp/pytriton-b")
    assert engine(restarted, version="2").model_hash == first
    assert engine(FakeTriton(), version="1").model_hash != first
    assert engine(FakeTriton(width=4), version="2").model_hash != first
    assert engine(FakeTriton(per_row_score=True), version="2").model_hash != first
    assert engine(FakeTriton(max_batch_size=8), version="2").model_hash != first


def test_no_ready_version_is_an_outage_at_start_up() -> None:
    with pytest.raises(InferenceServerError, match="no version of model m ready"):
        engine(FakeTriton(ready=set()))


def test_a_batch_is_one_call_per_max_batch_size_rows() -> None:
    server = FakeTriton()
    seconds: list[float] = []
    e = TritonEngine(spec(), grpc=server.module(), on_call=seconds.append)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    out = e.infer({"x": x})
    assert sorted(server.calls) == [2, 4, 4]
    assert len(seconds) == 3
    np.testing.assert_array_equal(out["score"][:, 0], x.sum(axis=1))
    assert server.headers == [{}, {}, {}]


def test_the_parts_of_a_batch_are_in_flight_together_up_to_the_bound() -> None:
    server = FakeTriton(max_batch_size=2, held=True)
    e = engine(server, max_calls_in_flight=3)
    x = np.arange(36, dtype=np.float32).reshape(12, 3)  # six calls of two rows
    out: list[Outputs] = []
    scoring = threading.Thread(target=lambda: out.append(e.infer({"x": x})), daemon=True)
    scoring.start()
    wait_for(lambda: len(server.waiting) == 3)
    assert server.in_flight == 3 and not server.calls  # three out, none answered yet
    server.waiting[1].set()  # answers may come in any order
    wait_for(lambda: len(server.waiting) == 4)  # one answered: one more goes out
    assert server.in_flight == 3
    for gate in list(server.waiting):
        gate.set()
    wait_for(lambda: len(server.waiting) == 6)
    for gate in server.waiting:
        gate.set()
    scoring.join(10)
    assert server.peak == 3 and len(server.calls) == 6
    np.testing.assert_array_equal(out[0]["score"][:, 0], x.sum(axis=1))  # in row order


def test_a_failed_part_fails_the_batch_once_the_calls_out_have_answered() -> None:
    server = FakeTriton(max_batch_size=2, held=True)
    kinds: list[str] = []
    e = TritonEngine(spec(max_calls_in_flight=2), grpc=server.module(), on_error=kinds.append)
    server.failures = [TritonFailure("INTERNAL", "boom"), TritonFailure("UNAVAILABLE", "down")]
    failed: list[Exception] = []

    def score() -> None:
        try:
            e.infer({"x": np.zeros((8, 3), dtype=np.float32)})
        except Exception as exc:
            failed.append(exc)

    scoring = threading.Thread(target=score, daemon=True)
    scoring.start()
    wait_for(lambda: len(server.waiting) == 2)
    for gate in server.waiting:
        gate.set()
    scoring.join(10)
    (failure,) = failed  # an outage goes before a refusal: the batch waits
    assert isinstance(failure, InferenceServerError) and "UNAVAILABLE: down" in str(failure)
    assert sorted(kinds) == ["model", "unavailable"]
    assert len(server.waiting) == 2 and server.in_flight == 0  # no more sent, none left


def test_one_call_in_flight_sends_the_parts_one_after_another() -> None:
    server = FakeTriton(max_batch_size=4)
    e = engine(server, max_calls_in_flight=1)
    e.infer({"x": np.zeros((10, 3), dtype=np.float32)})
    assert server.calls == [4, 4, 2] and not server.waiting


def test_a_per_row_output_comes_as_the_model_gives_it() -> None:
    """An output the server reshapes from ``[batch]`` (dims ``[1]``, reshape ``[]``) is
    handed on as ``[batch]``, as the same model run locally gives it; one declared
    ``[1]`` without reshape stays ``[batch, 1]``."""
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    scalar = engine(FakeTriton(per_row_score=True)).infer({"x": x})["score"]
    assert scalar.shape == (10,)
    np.testing.assert_array_equal(scalar, x.sum(axis=1))
    assert engine(FakeTriton()).infer({"x": x})["score"].shape == (10, 1)


def test_headers_go_with_every_call_and_never_print() -> None:
    server = FakeTriton()
    e = engine(server, headers={"authorization": "Bearer s3cret"})
    e.infer({"x": np.zeros((2, 3), dtype=np.float32)})
    assert server.headers[-1] == {"authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(spec(headers={"authorization": "Bearer s3cret"}))


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        ("UNAVAILABLE", "failed to connect to all addresses", InferenceServerError),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", InferenceServerError),
        ("RESOURCE_EXHAUSTED", "queue full", InferenceServerError),
        ("INTERNAL", "Request for unknown model: 'm' is not found", InferenceServerError),
        ("INTERNAL", "model 'm' version 2 is not ready", InferenceServerError),
        (None, "socket closed", InferenceServerError),
        ("INTERNAL", "Model execute error: bad input", EngineError),
        ("INVALID_ARGUMENT", "unexpected shape for input 'x'", EngineError),
    ],
)
def test_what_a_failed_call_means(code: str | None, message: str, kind: type) -> None:
    failure = call_failure(TritonFailure(code, message), "m:1 at h:1")
    assert type(failure) is kind
    assert message in str(failure) and "m:1 at h:1" in str(failure)


def test_a_backends_traceback_becomes_the_error_it_ends_with() -> None:
    message = (
        "Failed to process the request(s) for model 'm_0_0', message: TritonModelException: "
        "Model execute error: Traceback (most recent call last):\n"
        '  File "model.py", line 492, in execute\n    raise error\n'
        "ValueError: input x holds a value above 1e6\n\nAt:\n  model.py(492): execute\n"
    )
    failure = call_failure(TritonFailure("INTERNAL", message), "m:1 at h:1")
    assert isinstance(failure, EngineError)
    assert "refused the batch: INTERNAL: ValueError: input x holds a value above 1e6" in str(
        failure
    )
    assert len(str(failure)) < 400


def test_failed_calls_are_counted_by_kind() -> None:
    server = FakeTriton()
    kinds: list[str] = []
    e = TritonEngine(spec(), grpc=server.module(), on_error=kinds.append)
    server.failures = [TritonFailure("UNAVAILABLE", "down"), TritonFailure("INTERNAL", "boom")]
    feeds = {"x": np.zeros((2, 3), dtype=np.float32)}
    with pytest.raises(InferenceServerError):
        e.infer(feeds)
    with pytest.raises(EngineError):
        e.infer(feeds)
    assert kinds == ["unavailable", "model"]


def test_check_lines_say_the_server_is_live_and_the_model_ready() -> None:
    server = FakeTriton()
    e = engine(server)
    assert e.health() == [
        ("triton server", True, "10.0.0.1:8001 live"),
        ("triton model", True, "m:2 at 10.0.0.1:8001 ready"),
    ]
    server.failures = [TritonFailure("UNAVAILABLE", "connection refused")]
    ((what, ok, detail),) = e.health()
    assert (what, ok) == ("triton server", False) and "connection refused" in detail


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ({"engine": "triton"}, "needs a [pipelines.model.triton] table"),
        (
            {"engine": "triton", "path": "m.onnx", "triton": {"url": "h:1"}},
            "runs the server's model; remove path",
        ),
        ({"path": "m.onnx", "triton": {"url": "h:1"}}, 'needs engine = "triton"'),
        ({}, "path: the ONNX model file"),
        ({"engine": "triton", "triton": {"url": "no port"}}, "url"),
        ({"engine": "triton", "triton": {"url": "h:1", "version": "latest"}}, "version"),
        ({"engine": "triton", "triton": {"url": "h:1", "timeout_s": 0}}, "timeout_s"),
        ({"engine": "triton", "triton": {"url": "h:1", "max_calls_in_flight": 0}}, "in_flight"),
        (
            {"engine": "triton", "triton": {"url": "h:1", "root_certificates": "ca.pem"}},
            "need ssl = true",
        ),
        (
            {"engine": "triton", "triton": {"url": "h:1", "ssl": True, "private_key": "k.pem"}},
            "go together",
        ),
    ],
)
def test_the_config_names_what_is_wrong(model: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem.replace("[", r"\[").replace("(", r"\(")):
        ModelSpec.model_validate({"name": "m", **model})


class DownEngine(WrappedEngine):
    """The real engine behind a server that cannot answer the first ``down`` calls."""

    def __init__(self, inner: Any, down: int) -> None:
        super().__init__(inner)
        self.down = down

    def infer(self, feeds: Feeds) -> Outputs:
        self.calls.append(len(matrix(feeds)))
        if self.down > 0:
            self.down -= 1
            raise InferenceServerError("inference server m:1 at h:1: UNAVAILABLE: down")
        return self.inner.infer(feeds)


@pytest.fixture
def abort() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_a_batch_waits_for_the_server_and_nothing_is_dead_lettered(
    make_pipeline: base.PipelineFactory,
    onnx_engine: Any,
    sink: FakeSink,
    classifier: DemoModel,
    abort: threading.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = DownEngine(onnx_engine, down=3)
    readiness = Readiness()
    health = HealthState()
    heard = health.inference_server_for("p")

    def on_server(ok: bool, why: str | None) -> None:
        readiness(ok, why)
        heard(ok, why)

    pipeline = make_pipeline(down, abort=abort, on_inference_server=on_server)
    batch = rows(classifier, range(8))
    base.handle(pipeline, batch, sink)
    assert down.calls == [8, 8, 8, 8]  # the whole batch each time, never bisected
    assert [s.topic for s in sink.sent] == ["res"] * 8
    ok, why = readiness.heard[0]
    assert not ok and why is not None and "UNAVAILABLE" in why
    assert readiness.heard[-1] == (True, None)
    assert not health.inference_server_problems


def test_readiness_names_the_server_while_it_cannot_answer() -> None:
    health = HealthState(models_loaded=True, joined=True, broker_ok=True)
    on_server = health.inference_server_for("fraud")
    on_server(False, "inference server m:1 at h:1: UNAVAILABLE: down")
    assert health.not_ready_reasons() == [
        "pipeline fraud: inference server m:1 at h:1: UNAVAILABLE: down"
    ]
    on_server(True, None)
    assert health.not_ready_reasons() == []


def test_the_docs_example_loads(tmp_path: Path) -> None:
    """The how-to's TOML example is a config the worker accepts."""
    page = Path(__file__).parents[3] / "docs" / "how-to" / "triton.md"
    (block,) = re.findall(r"```toml\n(.*?)```", page.read_text(), flags=re.S)
    path = tmp_path / "worker.toml"
    path.write_text(block)
    (tmp_path / "ca.pem").write_text("")
    cfg = load_config(path, environ={})
    model = cfg.pipelines[0].model
    assert model.engine == "triton" and model.triton is not None
    assert model.triton.root_certificates == tmp_path / "ca.pem"
    assert model.watch is True  # no version pinned: the server's newest is followed


def test_the_reloader_follows_the_servers_highest_ready_version() -> None:
    server = FakeTriton(versions=["1"], ready={"1"})
    config = one_pipeline({"engine": "triton", "triton": {"url": "h:1"}})
    assert config.model.watch is True  # no version pinned: the server's newest is followed

    def load(cfg: PipelineConfig, model: ModelSpec) -> LoadedModel:
        served = TritonEngine(model, grpc=server.module())
        plan = FeedPlan.build(cfg.model_copy(update={"model": model}), served.inputs)
        served.warm_up([1], served.example(plan.widths()))
        return LoadedModel(served, plan)

    live = load(config, config.model)
    slot = ModelSlot(LiveModel.of(config.model, live.engine))
    registry = Metrics(CollectorRegistry())
    shown = show_model(registry, "p", slot.for_batch().identity, "triton", hide=None)
    watch = ModelWatch(config, slot, live, registry, shown=shown, load=load)

    def reloads(result: str) -> float:
        found = registry.registry.get_sample_value(
            "streamfer_model_reloads_total", {"pipeline": "p", "result": result}
        )
        return found or 0.0

    assert slot.for_batch().identity.version == "1"
    assert watch.look() is Look.IDLE
    server.versions, server.ready = ["1", "2"], {"1", "2"}
    assert watch.look() is Look.LOADED
    assert slot.for_batch().identity.version == "2" and reloads("loaded") == 1
    server.versions, server.ready, server.width = ["1", "2", "3"], {"1", "2", "3"}, 4
    assert watch.look() is Look.REFUSED  # fed otherwise: four columns for three features
    assert watch.look() is Look.IDLE  # not tried again
    assert slot.for_batch().identity.version == "2" and reloads("refused") == 1
    server.failures = [TritonFailure("UNAVAILABLE", "down")]
    assert watch.look() is Look.IDLE  # the batches wait out an outage, not the reloader


def candidate_config(candidate: dict[str, Any], model: dict[str, Any] | None = None) -> Any:
    model = model or {"engine": "triton", "triton": {"url": "h:1"}}
    return one_pipeline(model, canary={"percent": 50, **candidate})


def test_a_canary_is_another_version_of_the_model_on_the_server() -> None:
    server = FakeTriton(versions=["1", "2"], ready={"1", "2"})
    config = candidate_config({"version": "1"})
    assert config.canary is not None
    model = config.canary.model_spec(config.model)
    assert model.triton is not None and model.triton.version == "1" and model.triton.url == "h:1"
    served = TritonEngine(config.model, grpc=server.module())
    live = LoadedModel(served, FeedPlan.build(config, served.inputs))

    def load_model(cfg: PipelineConfig, spec: ModelSpec, **_kw: Any) -> LoadedModel:
        engine = TritonEngine(spec, grpc=server.module())
        return LoadedModel(engine, FeedPlan.build(cfg, engine.inputs))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("worker.models.candidates.load_model", load_model)
        canary, _shadow = load_candidates(config, live)
    assert canary is not None and canary.identity.version == "1"
    assert served.served_version == "2"


def test_a_canary_may_be_another_model_on_the_server_and_its_results_name_it() -> None:
    config = candidate_config({"server_model": "fraud_b", "version": "3"})
    assert config.canary is not None
    model = config.canary.model_spec(config.model)
    assert model.triton is not None and model.triton.url == "h:1"
    assert (model.triton.model, model.triton.version, model.name) == ("fraud_b", "3", "fraud_b")
    named = candidate_config({"server_model": "fraud_b", "version": "3", "name": "next"})
    assert named.canary is not None and named.canary.model_spec(named.model).name == "next"


@pytest.mark.parametrize(
    ("candidate", "model", "problem"),
    [
        ({"model": "v2.onnx", "version": "2"}, None, "canary.model: the pipeline's model is on"),
        ({}, None, "canary.version: name the version of the model on the server"),
        ({"version": "2"}, {"path": "m.onnx"}, "canary.model: the candidate ONNX"),
        (
            {"model": "v2.onnx", "server_model": "b"},
            {"path": "m.onnx"},
            "canary.server_model: the pipeline's model is no Triton server's",
        ),
    ],
)
def test_a_candidate_names_what_it_lacks(
    candidate: dict[str, Any], model: dict[str, Any] | None, problem: str, tmp_path: Path
) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    if model is not None:
        model = {**model, "path": str(tmp_path / "m.onnx")}
    with pytest.raises(ConfigError, match=problem):
        candidate_config(candidate, model)
