"""Models as users bring them, with the framework's own prediction to check streamfer by.

streamfer serves an ONNX file; users make that file with whatever they trained in. The
end-to-end test of "bring your own model" must therefore be fed files made the way users
make them (the exporters' default graphs, input names, types and output kinds, quirks
included), not files shaped to suit the worker, and it must compare every published
score with what the training framework itself predicts for the same named features.

``fraud_data`` makes a small fraud-style data set, deterministically from a seed: users
(stored numbers and strings), merchants (stored numbers), and requests with inline
numbers. Every number is exactly a float32, so a float32 model input, a Redis hash's
text, a packed float32 vector and JSON all carry the very value the framework saw.

Each recipe trains on that data, writes the ONNX file to a directory and returns a
:class:`Recipe`: the file, which features feed each model input (as a streamfer config
lists them), which model outputs become which result fields, and ``predict_proba``, the
framework's own class probabilities for rows of named features:

- ``sklearn_pipeline``: a scikit-learn ``ColumnTransformer`` (``StandardScaler`` on the
  numbers, ``OneHotEncoder`` on the strings) and ``LogisticRegression``, exported by
  skl2onnx with its default options (ZipMap on). Two inputs: ``numeric`` float
  ``[N, 5]`` and ``categorical`` string ``[N, 2]``.
- ``lightgbm_classifier``: ``lightgbm.LGBMClassifier`` on the five numbers, converted by
  onnxmltools with its default options (ZipMap on; its ``label`` output is declared with
  a fixed dimension of 1, which onnxruntime warns about at every run).
- ``torch_style_mlp``: a two-layer MLP with a softmax, written with ``onnx.helper`` node
  for node as ``torch.onnx.export`` (opset 17) writes it, torch not needed; the framework
  is its float64 numpy forward pass.

The training frameworks are imported only when a recipe runs: scikit-learn, skl2onnx
and onnx come with the ``demo`` extra, lightgbm and onnxmltools with ``dev``. This is a
test module, not part of the dev package: the demo extra need not bring a trainer that
only the suite uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "CATEGORICAL",
    "COUNTRIES",
    "NUMERIC",
    "SEGMENTS",
    "FraudData",
    "Recipe",
    "fraud_data",
    "lightgbm_classifier",
    "sklearn_pipeline",
    "torch_style_mlp",
]

NUMERIC = ["amount", "hour", "age_days", "risk", "volume_30d"]
"""The number features, in the column order of every recipe's numeric input."""
CATEGORICAL = ["country", "segment"]
"""The string features (the users' stored ``country`` and ``segment``)."""
COUNTRIES = ["FR", "DE", "US", "BR", "JP"]
SEGMENTS = ["retail", "smb", "vip"]

Row = dict[str, float | str]
Probabilities = npt.NDArray[np.float64]

# How each value moves the fraud log-odds (the label is drawn from the result).
_COUNTRY_RISK = {"FR": -0.2, "DE": -0.3, "US": 0.1, "BR": 0.8, "JP": -0.4}
_SEGMENT_RISK = {"retail": 0.0, "smb": 0.4, "vip": -0.8}


def _f32(x: float | np.number[Any], decimals: int = 2) -> float:
    """``x`` rounded, then to the nearest float32: a Python float equal to a float32."""
    return float(np.float32(round(float(x), decimals)).item())


@dataclass(frozen=True)
class FraudData:
    """Users and merchants (the stored features) and requests (the inline ones)."""

    users: dict[str, dict[str, float | str]]
    """User id -> ``{"age_days": float, "country": str, "segment": str}``."""
    merchants: dict[str, dict[str, float]]
    """Merchant id -> ``{"risk": float, "volume_30d": float}``."""
    requests: list[dict[str, float | str]]
    """``{"user": "u3", "merchant": "m1", "amount": float, "hour": float}``."""
    labels: list[int]
    """Fraud (1) or not (0), one per request: the recipes train on these."""

    def rows(self) -> list[Row]:
        """Each request joined with its user's and merchant's features: the seven
        features by name (``NUMERIC`` and ``CATEGORICAL``)."""
        out: list[Row] = []
        for req in self.requests:
            user = self.users[str(req["user"])]
            merchant = self.merchants[str(req["merchant"])]
            out.append(
                {
                    "amount": req["amount"],
                    "hour": req["hour"],
                    "age_days": user["age_days"],
                    "risk": merchant["risk"],
                    "volume_30d": merchant["volume_30d"],
                    "country": user["country"],
                    "segment": user["segment"],
                }
            )
        return out


def fraud_data(
    n_requests: int, *, n_users: int = 50, n_merchants: int = 20, seed: int = 0
) -> FraudData:
    """A fraud-style data set, the same for the same arguments. Fraud is likelier for
    large amounts, night hours, risky merchants, young accounts, some countries and
    segments; the label is drawn from that probability (noise), and with two or more
    requests both classes are present (the likeliest row is made fraud, or the least
    likely legit, when the draw gave one class only)."""
    if n_requests < 1 or n_users < 1 or n_merchants < 1:
        raise ValueError("fraud_data needs at least one request, user and merchant")
    rng = np.random.default_rng(seed)
    users: dict[str, dict[str, float | str]] = {}
    for i in range(n_users):
        users[f"u{i}"] = {
            "age_days": _f32(rng.integers(1, 3651)),
            "country": str(rng.choice(COUNTRIES, p=[0.3, 0.25, 0.25, 0.1, 0.1])),
            "segment": str(rng.choice(SEGMENTS, p=[0.7, 0.22, 0.08])),
        }
    merchants: dict[str, dict[str, float]] = {}
    for j in range(n_merchants):
        merchants[f"m{j}"] = {
            "risk": _f32(rng.beta(2.0, 5.0)),
            "volume_30d": _f32(rng.lognormal(9.0, 1.0)),
        }
    requests: list[dict[str, float | str]] = []
    logits: list[float] = []
    for _ in range(n_requests):
        uid = f"u{int(rng.integers(n_users))}"
        mid = f"m{int(rng.integers(n_merchants))}"
        amount = _f32(rng.lognormal(3.5, 1.0) + 1.0)
        hour = _f32(rng.integers(0, 24))
        requests.append({"user": uid, "merchant": mid, "amount": amount, "hour": hour})
        user, merchant = users[uid], merchants[mid]
        logits.append(
            -1.0
            + 1.5 * math.log(amount / 40.0)
            + (2.0 if hour < 6 else 0.0)
            + 8.0 * (merchant["risk"] - 0.3)
            - 0.8 * float(user["age_days"]) / 1000.0
            - 0.3 * math.log(merchant["volume_30d"] / 8000.0)
            + 2.0 * _COUNTRY_RISK[str(user["country"])]
            + 2.0 * _SEGMENT_RISK[str(user["segment"])]
        )
    p = 1.0 / (1.0 + np.exp(-np.asarray(logits)))
    labels = [int(v) for v in rng.random(n_requests) < p]
    if n_requests >= 2 and sum(labels) == 0:
        labels[int(np.argmax(p))] = 1
    elif n_requests >= 2 and sum(labels) == n_requests:
        labels[int(np.argmin(p))] = 0
    return FraudData(users, merchants, requests, labels)


def fraud_lookup_tables(tag: str) -> str:
    """The TOML tables that feed a config from ``fraud_data`` as stored under key prefix
    ``tag``: the request's two entity ids, and their lookups (the user's hash, with text
    features, and the merchant's packed vector), as in the example of docs/how-to/own-model.md."""
    return f"""
[pipelines.request.entities]
user = "user.id"
merchant = "merchant_id"

[[pipelines.lookups]]
name = "user"
key_template = "{tag}:user:{{entity}}"
layout = "hash"
fields = ["age_days", "country", "segment"]

[[pipelines.lookups]]
name = "merchant"
key_template = "{tag}:merchant:{{entity}}"
layout = "packed"
fields = ["risk", "volume_30d"]
"""


@dataclass(frozen=True)
class Recipe:
    """A model file as a user brings it, how a streamfer config serves it, and what the
    framework it came from predicts."""

    name: str
    model_path: Path
    inputs: dict[str, list[str]]
    """ONNX input name -> the features filling its columns, in order (``model.inputs``)."""
    outputs: dict[str, str]
    """Result field -> ONNX output name (``model.outputs``)."""
    predict_proba: Callable[[list[Row]], Probabilities]
    """The framework's own prediction for rows of named features: ``(n, n_classes)``."""


def _numbers(rows: Sequence[Row]) -> npt.NDArray[np.float64]:
    """The ``NUMERIC`` columns as float64, ``[n, 5]``."""
    return np.array([[float(r[c]) for c in NUMERIC] for r in rows], dtype=np.float64).reshape(
        len(rows), len(NUMERIC)
    )


def _mixed(rows: Sequence[Row]) -> npt.NDArray[np.object_]:
    """``NUMERIC`` (floats) then ``CATEGORICAL`` (str) columns, one object matrix."""
    out = np.empty((len(rows), len(NUMERIC) + len(CATEGORICAL)), dtype=object)
    for i, r in enumerate(rows):
        out[i, : len(NUMERIC)] = [float(r[c]) for c in NUMERIC]
        out[i, len(NUMERIC) :] = [str(r[c]) for c in CATEGORICAL]
    return out


def _write(directory: Path, filename: str, model: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_bytes(model.SerializeToString())
    return path


def sklearn_pipeline(directory: Path, data: FraudData) -> Recipe:
    """Scaler + one-hot encoder + logistic regression, exported by skl2onnx's defaults.

    The ColumnTransformer selects columns by position in a ``NUMERIC + CATEGORICAL``
    matrix: selecting them by name needs a DataFrame, and pandas is no dependency here.
    skl2onnx cannot guess the inputs of a matrix mixing numbers and strings (it makes one
    string input, which the scaler refuses), so the inputs are declared, and with
    positions skl2onnx splits them over several inputs by their widths: ``numeric`` (float
    ``[N, 5]``, positions 0-4) and ``categorical`` (string ``[N, 2]``, positions 5-6).
    Converter options are the defaults: ZipMap on, outputs ``output_label`` (int64) and
    ``output_probability`` (one {class: p} map per row). (From a pandas DataFrame the
    default export would instead have one ``[N, 1]`` input per column, named after it,
    double for float64 columns and string for object ones.)
    """
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    n_num, n_cat = len(NUMERIC), len(CATEGORICAL)
    prep = ColumnTransformer(
        [
            ("num", StandardScaler(), list(range(n_num))),
            ("cat", OneHotEncoder(handle_unknown="ignore"), list(range(n_num, n_num + n_cat))),
        ]
    )
    model = Pipeline([("prep", prep), ("clf", LogisticRegression(max_iter=1000))])
    model.fit(_mixed(data.rows()), np.asarray(data.labels))
    onx = to_onnx(
        model,
        initial_types=[
            ("numeric", FloatTensorType([None, n_num])),
            ("categorical", StringTensorType([None, n_cat])),
        ],
    )

    def predict_proba(rows: list[Row]) -> Probabilities:
        return np.asarray(model.predict_proba(_mixed(rows)), dtype=np.float64)

    return Recipe(
        name="fraud-sklearn-pipeline",
        model_path=_write(directory, "fraud_sklearn_pipeline.onnx", onx),
        inputs={"numeric": list(NUMERIC), "categorical": list(CATEGORICAL)},
        outputs={"label": "output_label", "scores": "output_probability"},
        predict_proba=predict_proba,
    )


def lightgbm_classifier(directory: Path, data: FraudData) -> Recipe:
    """A LightGBM classifier on the five numbers, converted by onnxmltools's defaults:
    one float input ``input`` ``[N, 5]``; outputs ``label`` (int64, declared ``[1]``
    although it has one row per input row) and ``probabilities`` (ZipMap: one
    {class: p} map per row)."""
    import lightgbm
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    model = lightgbm.LGBMClassifier(n_estimators=30, verbose=-1)
    model.fit(_numbers(data.rows()), np.asarray(data.labels))
    onx = onnxmltools.convert_lightgbm(
        model, initial_types=[("input", FloatTensorType([None, len(NUMERIC)]))]
    )

    def predict_proba(rows: list[Row]) -> Probabilities:
        return np.asarray(model.predict_proba(_numbers(rows)), dtype=np.float64)

    return Recipe(
        name="fraud-lightgbm",
        model_path=_write(directory, "fraud_lightgbm.onnx", onx),
        inputs={"input": list(NUMERIC)},
        outputs={"label": "label", "scores": "probabilities"},
        predict_proba=predict_proba,
    )


def _softmax(z: npt.NDArray[np.float64]) -> Probabilities:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return np.asarray(e / e.sum(axis=1, keepdims=True), dtype=np.float64)


def torch_style_mlp(directory: Path, data: FraudData, *, hidden: int = 16) -> Recipe:
    """``Linear(5, hidden) -> ReLU -> Linear(hidden, 2) -> softmax`` as
    ``torch.onnx.export(model, x, f, opset_version=17, input_names=["input"],
    output_names=["output"], dynamic_axes={"input": {0: "batch_size"}, "output": {0:
    "batch_size"}})`` writes it: Gemm (transB=1) / Relu / Gemm / Softmax(axis=1) nodes
    named ``/fc1/Gemm`` ..., initializers ``fc1.weight`` ``[hidden, 5]`` ..., graph
    ``main_graph``, IR version 8. The weights are fitted for a few hundred steps of
    full-batch gradient descent from a fixed seed on standardised numbers, then the
    standardisation is folded into ``fc1``, so the model takes raw numbers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = _numbers(data.rows())
    y = np.asarray(data.labels, dtype=np.int64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    xs = (x - mean) / std
    rng = np.random.default_rng(1234)
    n_in = len(NUMERIC)
    bound1, bound2 = 1.0 / math.sqrt(n_in), 1.0 / math.sqrt(hidden)  # torch's Linear init
    w1 = rng.uniform(-bound1, bound1, (hidden, n_in))
    b1 = rng.uniform(-bound1, bound1, hidden)
    w2 = rng.uniform(-bound2, bound2, (2, hidden))
    b2 = rng.uniform(-bound2, bound2, 2)
    onehot = np.eye(2)[y]
    for _ in range(300):
        z1 = xs @ w1.T + b1
        h = np.maximum(z1, 0.0)
        dz2 = (_softmax(h @ w2.T + b2) - onehot) / len(xs)
        dz1 = (dz2 @ w2) * (z1 > 0)
        w2 -= 0.5 * (dz2.T @ h)
        b2 -= 0.5 * dz2.sum(axis=0)
        w1 -= 0.5 * (dz1.T @ xs)
        b1 -= 0.5 * dz1.sum(axis=0)
    # fold (x - mean) / std into fc1; the file holds float32 weights, as torch's does
    fc1_w = (w1 / std).astype(np.float32)
    fc1_b = (b1 - (w1 / std) @ mean).astype(np.float32)
    fc2_w, fc2_b = w2.astype(np.float32), b2.astype(np.float32)

    graph = helper.make_graph(
        [
            helper.make_node(
                "Gemm",
                ["input", "fc1.weight", "fc1.bias"],
                ["/fc1/Gemm_output_0"],
                name="/fc1/Gemm",
                alpha=1.0,
                beta=1.0,
                transB=1,
            ),
            helper.make_node(
                "Relu", ["/fc1/Gemm_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"
            ),
            helper.make_node(
                "Gemm",
                ["/relu/Relu_output_0", "fc2.weight", "fc2.bias"],
                ["/fc2/Gemm_output_0"],
                name="/fc2/Gemm",
                alpha=1.0,
                beta=1.0,
                transB=1,
            ),
            helper.make_node(
                "Softmax", ["/fc2/Gemm_output_0"], ["output"], name="/Softmax", axis=1
            ),
        ],
        "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch_size", n_in])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch_size", 2])],
        initializer=[
            numpy_helper.from_array(fc1_w, "fc1.weight"),
            numpy_helper.from_array(fc1_b, "fc1.bias"),
            numpy_helper.from_array(fc2_w, "fc2.weight"),
            numpy_helper.from_array(fc2_b, "fc2.bias"),
        ],
    )
    onx = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
        producer_name="pytorch",
        producer_version="2.1.0",
    )
    onnx.checker.check_model(onx)

    weights = [a.astype(np.float64) for a in (fc1_w, fc1_b, fc2_w, fc2_b)]

    def predict_proba(rows: list[Row]) -> Probabilities:
        w1_, b1_, w2_, b2_ = weights
        hidden_ = np.maximum(_numbers(rows) @ w1_.T + b1_, 0.0)
        return _softmax(hidden_ @ w2_.T + b2_)

    return Recipe(
        name="fraud-torch-mlp",
        model_path=_write(directory, "fraud_torch_mlp.onnx", onx),
        inputs={"input": list(NUMERIC)},
        outputs={"scores": "output"},
        predict_proba=predict_proba,
    )
