"""The ONNX Runtime engine on the demo classifier (built once per session, ~3 s)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest

from worker.config import ModelSpec
from worker.engines import ENGINES, OnnxEngine, file_sha256, warm_up_sizes
from worker.errors import EngineError
from worker.modelgen import DemoModel

SpecFactory = Callable[..., ModelSpec]


@pytest.fixture
def make_spec(classifier: DemoModel) -> SpecFactory:
    def make(**kw: Any) -> ModelSpec:
        args: dict[str, Any] = {"path": classifier.path, "name": "demo"}
        args.update(kw)
        return ModelSpec(**args)

    return make


@pytest.fixture(scope="module")
def engine(classifier: DemoModel) -> OnnxEngine:
    return OnnxEngine(ModelSpec(path=classifier.path, name="demo"))


def test_classifier_outputs(engine: OnnxEngine, classifier: DemoModel) -> None:
    batch = classifier.features[:8]
    out = engine.infer(batch)
    assert set(out) == {"label", "scores"}
    labels, scores = out["label"], out["scores"]
    assert labels.shape == (8,)
    assert labels.dtype.kind == "i"
    assert set(labels.tolist()) <= {0, 1}
    assert scores.shape == (8, 2)
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    # the label is the most probable class
    np.testing.assert_array_equal(labels, scores.argmax(axis=1))


def test_model_fits_its_training_data(engine: OnnxEngine, classifier: DemoModel) -> None:
    from sklearn.datasets import load_breast_cancer

    target = load_breast_cancer().target
    labels = engine.infer(classifier.features)["label"]
    assert labels.shape == target.shape
    assert (labels == target).mean() > 0.9


def test_metadata(engine: OnnxEngine, classifier: DemoModel) -> None:
    assert engine.n_features == 30
    assert len(classifier.fields) == 30
    assert engine.model_hash == file_sha256(classifier.path)
    assert len(engine.model_hash) == 64
    assert "CPUExecutionProvider" in engine.providers


def test_single_row_and_warm_up(
    engine: OnnxEngine, classifier: DemoModel, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="worker.engines"):
        engine.warm_up([1, 3, 64])
    assert f"model {classifier.path.name} warmed at batch sizes [1, 3, 64] in " in caplog.text
    out = engine.infer(classifier.features[:1])
    assert out["scores"].shape == (1, 2)


def test_warm_up_covers_every_power_of_two_and_the_maximum() -> None:
    assert warm_up_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert warm_up_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert warm_up_sizes(1) == [1]


def test_wrong_width_is_engine_error(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError, match="model run failed on 2 rows"):
        engine.infer(np.zeros((2, 5), dtype=np.float32))


def test_wrong_dtype_is_engine_error(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError):
        engine.infer(np.zeros((2, 30), dtype=np.float64))  # type: ignore[arg-type]


def test_missing_model_file_names_path(make_spec: SpecFactory, tmp_path: Path) -> None:
    missing = tmp_path / "absent.onnx"
    with pytest.raises(EngineError, match="model file not found") as info:
        OnnxEngine(make_spec(path=missing))
    assert str(missing) in str(info.value)


def test_sha256_pin_mismatch(make_spec: SpecFactory, classifier: DemoModel) -> None:
    with pytest.raises(EngineError, match="but the config pins") as info:
        OnnxEngine(make_spec(sha256="0" * 64))
    assert file_sha256(classifier.path) in str(info.value)


def test_sha256_pin_match(make_spec: SpecFactory, classifier: DemoModel) -> None:
    digest = file_sha256(classifier.path)
    engine = OnnxEngine(make_spec(sha256=digest.upper()))
    assert engine.model_hash == digest


def test_no_available_provider(make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    spec = make_spec(providers=["CUDAExecutionProvider", "TensorrtExecutionProvider"])
    with pytest.raises(EngineError, match="none of the execution providers") as info:
        OnnxEngine(spec)
    assert "CUDAExecutionProvider" in str(info.value)


def test_unavailable_provider_falls_back(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    engine = OnnxEngine(make_spec(providers=["CUDAExecutionProvider", "CPUExecutionProvider"]))
    assert engine.providers == ["CPUExecutionProvider"]


def test_corrupt_model_file(make_spec: SpecFactory, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(EngineError, match="cannot load model"):
        OnnxEngine(make_spec(path=bad))


def test_configured_outputs(make_spec: SpecFactory, classifier: DemoModel) -> None:
    engine = OnnxEngine(make_spec(outputs={"p": "probabilities"}))
    out = engine.infer(classifier.features[:3])
    assert list(out) == ["p"]
    assert out["p"].shape == (3, 2)


def test_configured_unknown_output(make_spec: SpecFactory) -> None:
    with pytest.raises(EngineError, match=r"has no outputs \['nope'\]"):
        OnnxEngine(make_spec(outputs={"x": "nope"}))


def test_engine_registry() -> None:
    assert ENGINES["onnxruntime"] is OnnxEngine
