"""``streamfer model inspect``: a default skl2onnx export with a float and a string input
and a ZipMap output, an onnx.helper MLP end to end, and files that are no model."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from tests.fakes.onnx_models import near_tie_mlp
from tests.integration.recipes import fraud_data, sklearn_pipeline
from worker.cli import main
from worker.tools.model_inspect import inspect_model

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scaler + one-hot + logistic regression: ``numeric`` float [N, 5], ``categorical``
    string [N, 2]; outputs ``output_label`` and a ZipMap ``output_probability``."""
    return sklearn_pipeline(tmp_path_factory.mktemp("inspect"), fraud_data(80)).model_path


def test_a_float_and_a_string_input_and_a_zipmap_output(two_inputs: Path) -> None:
    info = inspect_model(two_inputs)
    assert [(t.name, t.type, t.shape, t.feeds) for t in info.inputs] == [
        ("numeric", "tensor(float)", [None, 5], "float32"),
        ("categorical", "tensor(string)", [None, 2], "str"),
    ]
    assert {t.name: t.type for t in info.outputs} == {
        "output_label": "tensor(int64)",
        "output_probability": "seq(map(int64,tensor(float)))",
    }
    assert set(info.opsets) == {"ai.onnx", "ai.onnx.ml"}
    assert {"Scaler", "OneHotEncoder", "LinearClassifier", "ZipMap"} <= set(info.ops["ai.onnx.ml"])
    assert info.producer.startswith("skl2onnx ")
    assert info.sha256 == hashlib.sha256(two_inputs.read_bytes()).hexdigest()
    assert info.size_bytes == two_inputs.stat().st_size


def test_every_provider_is_checked_and_cpu_loads_it(two_inputs: Path) -> None:
    checks = {p.name: p for p in inspect_model(two_inputs).providers}
    assert {"TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"} <= set(
        checks
    )
    available = ort.get_available_providers()
    for check in checks.values():
        assert check.offered == (check.name in available), check
        assert (check.loads is None) == (not check.offered), check
    assert checks["CPUExecutionProvider"].loads is True
    if "CUDAExecutionProvider" not in available:
        assert checks["CUDAExecutionProvider"].note == "not in this onnxruntime build"


def test_the_text_names_each_input_how_it_is_fed(
    two_inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "inspect", str(two_inputs)]) == 0
    out = capsys.readouterr().out
    assert "numeric  tensor(float)[?, 5]  (fed as float32)" in out
    assert "categorical  tensor(string)[?, 2]  (fed as str)" in out
    assert "output_probability  seq(map(int64,tensor(float)))" in out
    assert "CPUExecutionProvider       loads the model" in out
    assert "opsets    ai.onnx " in out and "ai.onnx.ml 1" in out


def test_json_from_the_command_line(tmp_path: Path) -> None:
    path, _ = near_tie_mlp(tmp_path / "mlp.onnx")
    done = subprocess.run(
        [sys.executable, "-m", "worker", "model", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["inputs"] == [
        {"name": "input", "type": "tensor(float)", "shape": ["batch_size", 8], "feeds": "float32"}
    ]
    assert doc["outputs"][0]["shape"] == ["batch_size", 2]
    assert doc["opsets"] == {"ai.onnx": 17} and doc["ir_version"] == 8
    assert doc["ops"] == {"ai.onnx": {"Gemm": 2, "Relu": 1, "Softmax": 1}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "model file not found: "),
        (b"", "is not an ONNX model"),
        (b"this is, not; a model\n", "is not a readable ONNX model"),
    ],
    ids=["missing", "empty", "text"],
)
def test_a_file_that_is_no_model_exits_2_naming_it(
    tmp_path: Path, content: bytes | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    assert main(["model", "inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err
