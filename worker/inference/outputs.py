"""A model's outputs as the worker publishes them: which outputs, in what order, and each
ONNX Runtime value made an array once per batch (a ZipMap's list of dicts included), with
a classifier's labels named and anything orjson could not encode found before publish.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from worker.errors import EngineError
from worker.inference.graph import zipmap_classes

__all__ = [
    "CLASSIFIER_LABELS",
    "CLASSIFIER_SCORES",
    "Converter",
    "class_names",
    "converters",
    "named_labels",
    "output_map",
    "unpublishable",
]

# skl2onnx names a classifier's outputs one of these ways (ZipMap on or off).
CLASSIFIER_LABELS = ("output_label", "label")
CLASSIFIER_SCORES = ("output_probability", "probabilities")

# ONNX Runtime's type of a ZipMap output; the value type picks the scores' dtype.
_ZIPMAP_TYPE = re.compile(r"seq\(map\((?:int64|string),tensor\((float|double)\)\)\)")
_ZIPMAP_DTYPES: dict[str, type[np.floating[Any]]] = {"float": np.float32, "double": np.float64}

# Array kinds that ``ndarray.tolist`` turns into what orjson encodes: bool, int, uint,
# float and str (object arrays pass when they hold str, as ONNX string tensors do).
_PUBLISHABLE_KINDS = frozenset("biufU")

Converter = Callable[[Any], npt.NDArray[np.generic]]


def class_names(
    names: Sequence[str] | None, outputs: Mapping[str, str], types: Mapping[str, str], path: Path
) -> npt.NDArray[np.object_] | None:
    """``class_names`` as an array to index with the label output's class indices."""
    if names is None:
        return None
    if "label" not in outputs:
        raise EngineError(
            f"model {path}: class_names needs a result field 'label' (the class index output); "
            f"the outputs are {dict(outputs)}"
        )
    label_type = types[outputs["label"]]
    if label_type not in ("tensor(int64)", "tensor(int32)"):
        raise EngineError(
            f"model {path}: class_names maps class indices, but output {outputs['label']!r} "
            f"is {label_type}"
        )
    return np.array(list(names), dtype=object)


def named_labels(labels: npt.NDArray[Any], names: npt.NDArray[np.object_]) -> npt.NDArray[Any]:
    if labels.size and (labels.min() < 0 or labels.max() >= len(names)):
        raise ValueError(f"a label is outside 0..{len(names) - 1}, the range of class_names")
    named: npt.NDArray[Any] = names[labels]
    return named


def output_map(
    configured: Mapping[str, str] | None, names: list[str], path: Path | str
) -> dict[str, str]:
    if configured:
        unknown = sorted(set(configured.values()) - set(names))
        if unknown:
            raise EngineError(f"model {path} has no outputs {unknown}; it has {names}")
        return dict(configured)
    label = next((n for n in CLASSIFIER_LABELS if n in names), None)
    scores = next((n for n in CLASSIFIER_SCORES if n in names), None)
    if label and scores and len(names) == 2:
        return {"label": label, "scores": scores}
    return {name: name for name in names}


def _as_array(value: Any) -> npt.NDArray[np.generic]:
    return np.asarray(value)


class _ZipMapScores:
    """A ZipMap output as an (n_rows, n_classes) float array, columns in class order.

    ONNX Runtime returns a ZipMap output as a list with one ``{class: probability}`` dict
    per row, keyed by int or str class labels: orjson refuses int keys, and the pipeline
    needs numbers to check for NaN. The model's class order is the ZipMap node's class
    labels (skl2onnx writes sklearn's sorted ``classes_``), or, when they are not known
    (``classes`` None, see ``model_graph.zipmap_classes``), Runtime's own sorted order. Runtime
    builds every row's dict from the same sorted map, so all rows share the first row's
    key order and only that one is compared with the class order, once per batch.
    """

    __slots__ = ("_classes", "_columns", "_dtype", "_seen")

    def __init__(self, classes: Sequence[int | str] | None, dtype: type[np.floating[Any]]):
        self._classes = list(classes) if classes is not None else None
        self._dtype = dtype
        self._seen: list[int | str] = []
        self._columns: npt.NDArray[np.intp] = np.empty(0, dtype=np.intp)

    def __call__(self, rows: Sequence[dict[int | str, float]]) -> npt.NDArray[np.generic]:
        n = len(rows)
        if not n:
            return np.empty((0, len(self._classes or ())), dtype=self._dtype)
        keys = list(rows[0])
        k = len(keys)
        flat = np.fromiter(
            chain.from_iterable(map(dict.values, rows)), dtype=self._dtype, count=n * k
        )
        scores = flat.reshape(n, k)
        if self._classes is None or keys == self._classes:
            return scores
        if keys != self._seen:
            self._columns = self._reorder(keys)
            self._seen = keys
        return scores[:, self._columns]

    def _reorder(self, keys: list[int | str]) -> npt.NDArray[np.intp]:
        assert self._classes is not None
        if len(keys) != len(self._classes) or set(keys) != set(self._classes):
            raise ValueError(f"ZipMap gave classes {keys}, the model declares {self._classes}")
        where = {key: i for i, key in enumerate(keys)}
        return np.array([where[c] for c in self._classes], dtype=np.intp)


def converters(wanted: list[str], types: Mapping[str, str], path: Path) -> list[Converter]:
    """How each wanted output becomes an array: ZipMap outputs by ``_ZipMapScores``, the
    rest (tensors, which Runtime returns as arrays already) by ``np.asarray``."""
    zipmaps = {name: m[1] for name in wanted if (m := _ZIPMAP_TYPE.fullmatch(types[name]))}
    if not zipmaps:
        return [_as_array] * len(wanted)
    classes = zipmap_classes(path)
    return [
        _ZipMapScores(classes.get(name), _ZIPMAP_DTYPES[zipmaps[name]])
        if name in zipmaps
        else _as_array
        for name in wanted
    ]


def unpublishable(values: object, rows: int) -> str | None:
    """Why the pipeline could not publish ``values`` from a batch of ``rows`` rows (it
    sends ``values.tolist()[i]`` through orjson for row ``i``), or None when it can."""
    if not isinstance(values, np.ndarray):
        return f"it is a {type(values).__name__}, not an array"
    if values.ndim == 0 or len(values) != rows:
        return f"it has shape {values.shape} for {rows} input rows, not one row per input row"
    kind = values.dtype.kind
    if kind == "O":
        odd = next(((v,) for v in values.flat if not isinstance(v, str)), None)
        if odd is not None:
            return (
                f"it holds {type(odd[0]).__name__} values such as {odd[0]!r:.80}, "
                "not numbers or str"
            )
    elif kind not in _PUBLISHABLE_KINDS:
        return f"its dtype {values.dtype} is not a number, bool or str"
    for i, row in enumerate(values.tolist()):
        try:
            orjson.dumps(row)
        except orjson.JSONEncodeError as exc:
            return f"row {i} does not encode as JSON: {exc}"
    return None
