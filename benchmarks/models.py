"""The two benchmark models, made from the breast-cancer data that ships with scikit-learn.

``light`` is the demo's 16-tree random forest (``streamfer_dev.modelgen.make_classifier``): its
inference costs about as much as decoding a batch, so Redis and Kafka set the pace.
``heavy`` is a standardised MLP with four wide hidden layers (1024, 1024, 1024, 512),
converted with skl2onnx: at 256 rows one single-threaded ONNX Runtime call takes about
25 ms, roughly three times the ~9 ms Redis fetch of the same rows, so inference
dominates. Training the MLP takes a few seconds, so its ONNX file is cached under
``STREAMFER_CACHE`` (``~/.cache/streamfer``) keyed by its settings.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path
from typing import Literal

import numpy as np

from streamfer_dev.modelgen import DemoModel, feature_names, make_classifier
from streamfer_dev.stack import cache_dir

__all__ = ["HEAVY_LAYERS", "MODEL_NAMES", "ModelKind", "make_heavy", "make_model"]

ModelKind = Literal["light", "heavy"]

HEAVY_LAYERS: tuple[int, ...] = (1024, 1024, 1024, 512)
"""Hidden layers of the heavy MLP."""

MODEL_NAMES: dict[ModelKind, str] = {"light": "breast-cancer-rf", "heavy": "breast-cancer-mlp"}
"""The name each model carries in results."""

_HEAVY_ITERATIONS = 3  # enough for ~98% training accuracy; the weights' cost is what matters


def make_model(kind: ModelKind, directory: Path) -> DemoModel:
    """Write the chosen model to ``directory/<kind>.onnx``; return it with its features."""
    path = directory / f"{kind}.onnx"
    if kind == "light":
        return make_classifier(path)
    return make_heavy(path)


def make_heavy(path: Path, layers: tuple[int, ...] = HEAVY_LAYERS) -> DemoModel:
    """Train (or take from the cache) the heavy MLP and copy its ONNX file to ``path``."""
    from sklearn.datasets import load_breast_cancer

    x = load_breast_cancer().data.astype(np.float32)
    tag = hashlib.sha256(repr((layers, _HEAVY_ITERATIONS, 17)).encode()).hexdigest()[:12]
    cached = cache_dir() / "bench-models" / f"mlp-{tag}.onnx"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        partial.write_bytes(_train_mlp(layers))
        partial.replace(cached)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, path)
    return DemoModel(path, feature_names(x.shape[1]), x)


def _train_mlp(layers: tuple[int, ...]) -> bytes:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    mlp = MLPClassifier(hidden_layer_sizes=layers, max_iter=_HEAVY_ITERATIONS, random_state=0)
    model = make_pipeline(StandardScaler(), mlp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, data.target)
    onx = to_onnx(model, x[:1], options={id(mlp): {"zipmap": False}}, target_opset=17)
    return bytes(onx.SerializeToString())
