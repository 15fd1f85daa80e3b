"""Demo and test models, made here from data that ships with scikit-learn.

``make_classifier`` trains a small random forest on the Wisconsin breast-cancer data set
(569 rows, 30 features, bundled with scikit-learn, so nothing is downloaded) and converts
it with skl2onnx to a float32 ONNX model whose probabilities are a plain tensor.
``seed_entities`` writes each row's features to a Redis hash, one entity per row.
``make_mean`` writes the smallest ensemble head: the mean of several equal inputs, for
a graph that averages two classifiers' probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import redis

from worker.features import pack_vector

__all__ = ["DemoModel", "feature_names", "make_classifier", "make_mean", "seed_entities"]


@dataclass(frozen=True, slots=True)
class DemoModel:
    path: Path
    fields: list[str]
    features: npt.NDArray[np.float32]
    """One row per entity, in ``fields`` order."""


def feature_names(n: int) -> list[str]:
    return [f"f{i}" for i in range(n)]


def make_classifier(
    path: Path, *, n_estimators: int = 16, max_depth: int = 6, zipmap: bool = False
) -> DemoModel:
    """Train and convert; returns where the model is and the data set's features. With
    ``zipmap``, skl2onnx's default export: probabilities as one {class: p} map per row."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import RandomForestClassifier

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    model = RandomForestClassifier(
        n_estimators=n_estimators, max_depth=max_depth, random_state=0, n_jobs=1
    ).fit(x, data.target)
    options = {} if zipmap else {id(model): {"zipmap": False}}
    onx = to_onnx(model, x[:1], options=options, target_opset=17)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(onx.SerializeToString())
    return DemoModel(path, feature_names(x.shape[1]), x)


def make_mean(path: Path, inputs: list[str], width: int, output: str = "mean") -> Path:
    """An ONNX model of float32 inputs ``inputs``, each ``[batch, width]``, whose one
    output ``output`` is their element-wise mean (ONNX's Mean operator)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mean", inputs, [output])],
        "mean",
        [helper.make_tensor_value_info(i, TensorProto.FLOAT, ["batch", width]) for i in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", width])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def seed_entities(
    client: redis.Redis,
    model: DemoModel,
    *,
    key_template: str = "features:{entity}",
    prefix: str = "e",
    layout: str = "hash",
) -> list[str]:
    """One entity per data-set row, as a hash or a packed vector; returns the entity ids
    (``e0``, ``e1`` ...)."""
    entities = [f"{prefix}{i}" for i in range(len(model.features))]
    pipe = client.pipeline(transaction=False)
    for entity, row in zip(entities, model.features.tolist(), strict=True):
        key = key_template.replace("{entity}", entity)
        if layout == "packed":
            pipe.set(key, pack_vector(row))
        else:
            pipe.hset(key, mapping=dict(zip(model.fields, map(repr, row), strict=True)))
    pipe.execute()
    return entities
