"""Models for the model tools' tests, made here from data that ships with scikit-learn.

- ``helper_mlp``: an MLP written node for node with ``onnx.helper``, as a training
  framework's exporter writes one: input ``input`` float ``[batch, n]`` (dynamic batch),
  Gemm / Relu / Gemm / Softmax, output ``probabilities``. Its weights are a scikit-learn
  ``MLPClassifier``'s, fitted on the standardised digits data (64 features, 10 classes).
- ``sklearn_mlp``: ``StandardScaler`` + ``MLPClassifier`` on the breast-cancer data, as
  skl2onnx exports it by default: ZipMap on, so the scores are one ``{class: p}`` map
  per row, and the scaler is an ai.onnx.ml op.
- ``sklearn_regressor``: ``StandardScaler`` + ``MLPRegressor`` on the diabetes data, as
  skl2onnx exports it by default: one output column, values up to about 300.
- ``near_tie_mlp``: a random MLP of the same shape whose two classes' logits differ by
  about 1e-3, so any quantization flips labels; ``regression_mlp``: one output column.
- ``random_mlp``: a small random MLP; the same shape with another seed is another
  version of one model (the reload, canary and shadow tests), which
  ``three_feature_pipeline`` serves from features ``a``, ``b`` and ``c``.

Each returns the model's path and rows for it (the ones it was fitted on).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.config import FeatureSpec, ModelSpec, PipelineConfig

Rows = npt.NDArray[np.float64]

__all__ = [
    "helper_mlp",
    "near_tie_mlp",
    "random_mlp",
    "regression_mlp",
    "sklearn_mlp",
    "sklearn_regressor",
    "three_feature_pipeline",
    "write_csv",
]


def write_csv(path: Path, rows: npt.NDArray[np.generic], header: list[str] | None = None) -> Path:
    """``rows`` under a header (``c0, c1 ...`` unless given), numbers written exactly."""
    names = header or [f"c{i}" for i in range(rows.shape[1])]
    lines = [",".join(names)] + [",".join(repr(v) for v in row.tolist()) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_mlp(path: Path, w1: Rows, b1: Rows, w2: Rows, b2: Rows, *, softmax: bool = True) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_in, n_out = w1.shape[0], w2.shape[1]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], name="/fc1/Gemm"),
            helper.make_node("Relu", ["h"], ["r"], name="/relu/Relu"),
            helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["z"], name="/fc2/Gemm"),
            helper.make_node("Softmax", ["z"], ["probabilities"], name="/Softmax", axis=1)
            if softmax
            else helper.make_node("Identity", ["z"], ["value"], name="/Identity"),
        ],
        "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch_size", n_in])],
        [
            helper.make_tensor_value_info(
                "probabilities" if softmax else "value", TensorProto.FLOAT, ["batch_size", n_out]
            )
        ],
        initializer=[
            numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)
            for a, name in (
                (w1, "fc1.weight"),
                (b1, "fc1.bias"),
                (w2, "fc2.weight"),
                (b2, "fc2.bias"),
            )
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="pytorch"
    )
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def helper_mlp(path: Path) -> tuple[Path, Rows]:
    """The digits MLP (64 -> 32 -> 10) and the standardised digits rows."""
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    data = load_digits()
    x = data.data.astype(np.float64)
    x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    mlp = MLPClassifier(hidden_layer_sizes=(32,), max_iter=20, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(x, data.target)
    (w1, w2), (b1, b2) = mlp.coefs_, mlp.intercepts_
    return _write_mlp(path, w1, b1, w2, b2), x.astype(np.float32).astype(np.float64)


def near_tie_mlp(path: Path, rows: int = 400) -> tuple[Path, Rows]:
    """A random 8 -> 32 -> 2 MLP whose two logits differ by ~1e-3, and random rows."""
    rng = np.random.default_rng(7)
    w1, b1 = rng.normal(0, 0.5, (8, 32)), rng.normal(0, 0.1, 32)
    column = rng.normal(0, 0.5, (32, 1))
    w2 = np.hstack([column, column + rng.normal(0, 1e-3, (32, 1))])
    x = rng.normal(0, 1, (rows, 8)).astype(np.float32).astype(np.float64)
    return _write_mlp(path, w1, b1, w2, np.zeros(2)), x


def regression_mlp(path: Path, rows: int = 100) -> tuple[Path, Rows]:
    """A random 8 -> 32 -> 1 MLP with no softmax (output ``value``), and random rows."""
    rng = np.random.default_rng(3)
    w1, b1, w2 = rng.normal(0, 0.5, (8, 32)), rng.normal(0, 0.1, 32), rng.normal(0, 0.5, (32, 1))
    x = rng.normal(0, 1, (rows, 8)).astype(np.float32).astype(np.float64)
    return _write_mlp(path, w1, b1, w2, np.zeros(1), softmax=False), x


def random_mlp(path: Path, n_in: int = 3, *, seed: int = 0, softmax: bool = True) -> Path:
    """A random ``n_in -> 8 -> 2`` MLP with softmax (output ``probabilities``), or
    ``n_in -> 8 -> 1`` without (output ``value``); ``path``'s directory is made."""
    rng = np.random.default_rng(seed)
    n_out = 2 if softmax else 1
    w1, b1 = rng.normal(0, 0.5, (n_in, 8)), rng.normal(0, 0.1, 8)
    w2, b2 = rng.normal(0, 0.5, (8, n_out)), rng.normal(0, 0.1, n_out)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _write_mlp(path, w1, b1, w2, b2, softmax=softmax)


def three_feature_pipeline(model: Path, **fields: Any) -> PipelineConfig:
    """Pipeline ``p`` (``req`` -> ``res``, ``dlq``) serving ``model`` (a ``random_mlp`` of
    three inputs) as ``m`` version 1 from stored features ``a``, ``b`` and ``c``;
    ``fields`` add or replace pipeline fields."""
    return PipelineConfig(
        **{
            "name": "p",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": FeatureSpec(fields=["a", "b", "c"]),
            "model": ModelSpec(path=model, name="m", version="1"),
            **fields,
        }
    )


def sklearn_mlp(path: Path) -> tuple[Path, Rows]:
    """skl2onnx's default export of scaler + MLP on the breast-cancer data (ZipMap on)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.neural_network import MLPClassifier

    mlp = MLPClassifier(hidden_layer_sizes=(16,), max_iter=100, random_state=0)
    return _scaled_export(path, mlp, load_breast_cancer())


def sklearn_regressor(path: Path) -> tuple[Path, Rows]:
    """skl2onnx's default export of scaler + MLP regressor on the diabetes data."""
    from sklearn.datasets import load_diabetes
    from sklearn.neural_network import MLPRegressor

    mlp = MLPRegressor(hidden_layer_sizes=(16,), max_iter=200, random_state=0)
    return _scaled_export(path, mlp, load_diabetes())


def _scaled_export(path: Path, estimator: Any, data: Any) -> tuple[Path, Rows]:
    """``StandardScaler`` + ``estimator`` fitted on ``data`` (a scikit-learn dataset),
    exported by skl2onnx with its defaults."""
    from skl2onnx import to_onnx
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = data.data.astype(np.float32)
    model = make_pipeline(StandardScaler(), estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, data.target)
    path.write_bytes(to_onnx(model, x[:1]).SerializeToString())
    return path, x.astype(np.float64)
