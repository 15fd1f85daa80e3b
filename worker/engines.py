"""Inference engines: one call per batch, one array per model input.

``InferenceEngine`` is the plug-in point; ``OnnxEngine`` runs ONNX Runtime on the
execution providers the config names (CPU by default; CUDA and TensorRT with
onnxruntime-gpu on a GPU). A session is created once per model, after its file's
SHA-256 is checked when pinned, and warmed up before the worker joins its group.
Inputs may be of any
type in ``ONNX_DTYPES`` (strings too), as ``worker.feeds`` assembles them.
``infer`` hands back plain arrays only (numbers, bools or str, one row per input row):
a ZipMap output, the list of ``{class: probability}`` dicts a skl2onnx classifier
exported with default options gives, becomes a float matrix in class order, once per
batch. ``warm_up`` proves every output encodes as JSON, so a model the worker could not
publish fails start-up, not the first live batch. ``ENGINES`` maps a name to a factory.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import orjson

from worker.config import ModelSpec
from worker.errors import EngineError
from worker.model_graph import string_examples, zipmap_classes

__all__ = [
    "ENGINES",
    "ONNX_DTYPES",
    "Feeds",
    "InferenceEngine",
    "OnnxEngine",
    "TensorInput",
    "file_sha256",
    "warm_up_sizes",
]

log = logging.getLogger(__name__)

Outputs = dict[str, npt.NDArray[np.generic]]
Feeds = Mapping[str, npt.NDArray[Any]]
Example = Callable[[int], Feeds]

ONNX_DTYPES: dict[str, np.dtype[Any]] = {
    f"tensor({onnx})": np.dtype(numpy)
    for onnx, numpy in (
        ("float", "float32"),
        ("double", "float64"),
        ("float16", "float16"),
        ("int64", "int64"),
        ("int32", "int32"),
        ("int16", "int16"),
        ("int8", "int8"),
        ("uint64", "uint64"),
        ("uint32", "uint32"),
        ("uint16", "uint16"),
        ("uint8", "uint8"),
        ("bool", "bool"),
        ("string", "object"),
    )
}
"""The input types a worker can feed, and the numpy dtype of each."""

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


@dataclass(frozen=True, slots=True)
class TensorInput:
    """One model input as the model declares it."""

    name: str
    onnx_type: str
    """As ONNX Runtime names it: ``tensor(float)``, ``tensor(string)`` ..."""
    dtype: np.dtype[Any] | None
    """The numpy dtype fed to it (object for strings); None when the worker cannot feed it."""
    rank: int
    width: int | None
    """Columns, when the model fixes them (rank 2), 1 for rank 1."""

    def describe(self) -> str:
        dims = "[batch]" if self.rank == 1 else f"[batch, {self.width or '?'}]"
        return f"{self.name} {self.onnx_type.removeprefix('tensor(').rstrip(')')}{dims}"


class InferenceEngine(Protocol):
    """Runs a model on a batch. ``infer`` may block; it is called from one thread."""

    @property
    def inputs(self) -> Sequence[TensorInput]:
        """The model's inputs, in its order."""
        ...

    @property
    def model_hash(self) -> str:
        """SHA-256 of the model file, for results and dead letters."""
        ...

    def infer(self, feeds: Feeds) -> Outputs:
        """Outputs keyed by result field name, each with one row per input row; ``feeds``
        holds one array per model input, all with the same number of rows."""
        ...

    def warm_up(self, batch_sizes: Iterable[int], example: Example | None = None) -> None:
        """Run once per batch size so the first real batch pays no setup cost;
        ``example(n)`` gives feeds of ``n`` rows the model accepts."""
        ...


def warm_up_sizes(max_batch_size: int) -> list[int]:
    """Every power of two up to ``max_batch_size``, and it: the sizes adaptive batching
    and the tail of a backlog or a replay hand to the model, each run once up front."""
    sizes = {max_batch_size}
    size = 1
    while size < max_batch_size:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class OnnxEngine:
    """ONNX Runtime session for one model; ``run`` releases the GIL while it computes."""

    def __init__(self, spec: ModelSpec) -> None:
        import onnxruntime as ort

        path = spec.path
        if not path.is_file():
            raise EngineError(f"model file not found: {path}")
        self._path = path
        self._hash = file_sha256(path)
        if spec.sha256 is not None and spec.sha256.lower() != self._hash:
            raise EngineError(
                f"model file {path} has SHA-256 {self._hash}, but the config pins {spec.sha256}"
            )
        available = ort.get_available_providers()
        providers = [p for p in spec.providers if p in available]
        if not providers:
            raise EngineError(
                f"none of the execution providers {spec.providers} is available here; "
                f"this onnxruntime offers {available}"
            )
        if len(providers) < len(spec.providers):
            log.warning(
                "providers %s unavailable, using %s",
                sorted(set(spec.providers) - set(providers)),
                providers,
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = spec.intra_op_threads
        options.inter_op_num_threads = 1
        self._session = _session(path, options, providers)
        self._inputs = [_tensor_input(i.name, i.type, i.shape) for i in self._session.get_inputs()]
        types = {o.name: o.type for o in self._session.get_outputs()}
        self.output_types: dict[str, str] = types
        self._outputs = _output_map(spec.outputs, list(types), path)
        self._wanted = list(self._outputs.values())
        one_row = [
            o.name
            for o in self._session.get_outputs()
            if o.name in self._wanted and o.shape and o.shape[0] == 1
        ]
        if one_row:
            # onnxmltools declares a LightGBM classifier's label as shape [1]: Runtime then
            # warns on every batch that the real shape differs. Its load-time warnings
            # were shown above; those of each run are not wanted.
            log.warning(
                "model %s declares outputs %s with one row but returns one per input row; "
                "ONNX Runtime's per-batch warnings about it are silenced",
                path.name,
                one_row,
            )
            options.log_severity_level = 3
            self._session = _session(path, options, providers)
        self._converters = _converters(self._wanted, types, path)
        self._class_names = _class_names(spec.class_names, self._outputs, types, path)
        self._run = self._session.run
        self.providers: list[str] = self._session.get_providers()

    @property
    def inputs(self) -> list[TensorInput]:
        return list(self._inputs)

    @property
    def outputs(self) -> dict[str, str]:
        """Result field -> model output name."""
        return dict(self._outputs)

    @property
    def model_hash(self) -> str:
        return self._hash

    def infer(self, feeds: Feeds | npt.NDArray[Any]) -> Outputs:
        """Run the model once on the batch and convert each output once. A model with
        one input also takes its array alone.

        Raises EngineError when the run fails or an output cannot be converted.
        """
        if isinstance(feeds, np.ndarray):
            feeds = {self._inputs[0].name: feeds}
        rows = len(next(iter(feeds.values()))) if feeds else 0
        try:
            values = self._run(self._wanted, feeds)
        except Exception as exc:
            raise EngineError(f"model run failed on {rows} rows: {exc}") from exc
        outputs: Outputs = {}
        for field, convert, value in zip(self._outputs, self._converters, values, strict=True):
            try:
                outputs[field] = convert(value)
            except (TypeError, ValueError, KeyError) as exc:
                raise EngineError(f"cannot convert output {field!r} of {rows} rows: {exc}") from exc
        if self._class_names is not None:
            try:
                outputs["label"] = _named_labels(outputs["label"], self._class_names)
            except (ValueError, IndexError) as exc:
                raise EngineError(f"cannot name the labels of {rows} rows: {exc}") from exc
        return outputs

    def example(self, widths: Mapping[str, int] | None = None) -> Example:
        """Feeds the model accepts, for warm-up: zeros, and for string columns a category
        read from the graph (``model_graph.string_examples``). ``widths`` gives the
        columns of inputs whose width the model leaves open."""
        given = widths or {}
        width_of = {t.name: t.width or given.get(t.name, 1) for t in self._inputs}
        texts = string_examples(
            self._path,
            {t.name: width_of[t.name] for t in self._inputs if t.onnx_type.endswith("(string)")},
        )

        def feeds(n: int) -> Feeds:
            out: dict[str, npt.NDArray[Any]] = {}
            for t in self._inputs:
                shape = (n,) if t.rank == 1 else (n, width_of[t.name])
                if t.name in texts:
                    row = np.array(texts[t.name], dtype=object)
                    out[t.name] = np.tile(row, (n, 1)).reshape(shape)
                else:
                    out[t.name] = np.zeros(shape, dtype=t.dtype)
            return out

        return feeds

    def warm_up(self, batch_sizes: Iterable[int], example: Example | None = None) -> None:
        """Run once per batch size (at least once) and check every output is publishable.

        Raises EngineError naming the output when one is not an array of numbers, bools
        or str with one row per input row, or when a row of it does not encode as JSON.
        """
        feeds = example or self.example()
        sizes = list(batch_sizes)
        started = time.perf_counter()
        for size in sizes or [1]:
            try:
                outputs = self.infer(feeds(size))
            except EngineError as exc:
                raise EngineError(
                    f"model {self._path} fails on warm-up rows (zeros, and a known category "
                    f"for string columns): {exc}"
                ) from exc
            for field, values in outputs.items():
                why = _unpublishable(values, size)
                if why is not None:
                    raise EngineError(
                        f"model {self._path}: output {field!r} ({self._outputs[field]}) "
                        f"cannot be published: {why}"
                    )
        log.info(
            "model %s warmed at batch sizes %s in %.0f ms",
            self._path.name,
            sizes,
            1000 * (time.perf_counter() - started),
        )


def _session(path: Path, options: Any, providers: Sequence[str]) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EngineError(f"cannot load model {path}: {exc}") from exc


def _tensor_input(name: str, onnx_type: str, shape: Sequence[Any] | None) -> TensorInput:
    rank = len(shape) if shape is not None else 0
    width = shape[-1] if shape and rank == 2 and isinstance(shape[-1], int) else None
    return TensorInput(name, onnx_type, ONNX_DTYPES.get(onnx_type), rank, 1 if rank == 1 else width)


def _class_names(
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


def _named_labels(labels: npt.NDArray[Any], names: npt.NDArray[np.object_]) -> npt.NDArray[Any]:
    if labels.size and (labels.min() < 0 or labels.max() >= len(names)):
        raise ValueError(f"a label is outside 0..{len(names) - 1}, the range of class_names")
    named: npt.NDArray[Any] = names[labels]
    return named


def _output_map(
    configured: Mapping[str, str] | None, names: list[str], path: Path
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


def _converters(wanted: list[str], types: Mapping[str, str], path: Path) -> list[Converter]:
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


def _unpublishable(values: object, rows: int) -> str | None:
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


ENGINES: dict[str, Callable[[ModelSpec], InferenceEngine]] = {"onnxruntime": OnnxEngine}
