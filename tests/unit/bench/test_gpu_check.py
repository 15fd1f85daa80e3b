"""The device check (benchmarks/gpu_check.py) on this machine, which has no GPU: the
weights its PyTorch rows use are the ONNX file's, its FP16 model agrees with the FP32
one, and a whole run gives the CPU rows and names every row it skipped and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from benchmarks.gpu_check import main, make_fp16, mlp_forward, mlp_weights
from benchmarks.models import make_heavy


@pytest.fixture(scope="module")
def small_mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The heavy model's recipe (skl2onnx's MLPClassifier graph) with small layers."""
    model = make_heavy(tmp_path_factory.mktemp("mlp") / "mlp.onnx", layers=(32, 16))
    return model.path, model.features


def test_the_weights_read_back_give_runtimes_scores(small_mlp: tuple[Path, np.ndarray]) -> None:
    path, x = small_mlp
    weights = mlp_weights(path)
    assert [w.shape for w, _b in weights["layers"]] == [(30, 32), (32, 16), (16, 1)]
    want = ort.InferenceSession(str(path)).run(["probabilities"], {"X": x})[0]
    np.testing.assert_allclose(mlp_forward(weights, x), want, atol=1e-5)


def test_the_fp16_model_keeps_float_inputs_and_agrees(
    small_mlp: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, x = small_mlp
    half = make_fp16(path, tmp_path / "half.onnx")
    assert half is not None
    session = ort.InferenceSession(str(half))
    assert session.get_inputs()[0].type == "tensor(float)"
    labels, scores = session.run(["label", "probabilities"], {"X": x})
    want_labels, want = ort.InferenceSession(str(path)).run(["label", "probabilities"], {"X": x})
    assert scores.dtype == np.float32
    assert float(np.abs(scores - want).max()) < 1e-2
    assert (labels == want_labels).mean() > 0.98


def test_a_run_without_a_gpu_gives_the_cpu_rows_and_says_what_it_skipped(
    small_mlp: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _x = small_mlp
    half = make_fp16(path, tmp_path / "half.onnx") or tmp_path / "none.onnx"
    out = tmp_path / "check.json"
    args = ["--model", str(path), "--fp16-model", str(half), "--budget-s", "0.01"]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert {
        "ORT CPU, 1 thread",
        "streamfer CPU (default: 1 thread, unpadded)",
        "streamfer CPU, padded + IOBinding",
    } <= set(rows)
    assert all(r["rps"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in rows.values())
    assert all(r["max_diff"] == 0.0 for n, r in rows.items() if n.startswith("streamfer CPU"))
    assert len(report["ragged"]) == 3
    skipped = dict(report["skipped"])
    for name in ("ORT CUDA FP32", "ORT TensorRT FP16", "streamfer CUDA FP32, unpadded"):
        assert "this is the CPU build of ONNX Runtime" in skipped[name]
    assert "ORT CUDA FP16" in skipped  # for want of CUDA, or of an FP16 model
    assert "PyTorch CUDA rows" in skipped
    printed = capsys.readouterr().out
    assert "skipped:" in printed and "255,569,273 bytes" in printed
