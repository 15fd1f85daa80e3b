"""Inference engines: one call per batch on a float32 matrix.

``InferenceEngine`` is the plug-in point; ``OnnxEngine`` runs ONNX Runtime on the
execution providers the config names (CPU by default; CUDA and TensorRT with
onnxruntime-gpu on a GPU). A session is created once per model, after its file's
SHA-256 is checked when pinned, and warmed up before the worker joins its group.
``ENGINES`` maps a name to a factory.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from worker.config import ModelSpec
from worker.errors import EngineError

__all__ = ["ENGINES", "InferenceEngine", "OnnxEngine", "file_sha256", "warm_up_sizes"]

log = logging.getLogger(__name__)

Outputs = dict[str, npt.NDArray[np.generic]]

# skl2onnx names a classifier's outputs one of these ways (ZipMap on or off).
CLASSIFIER_LABELS = ("output_label", "label")
CLASSIFIER_SCORES = ("output_probability", "probabilities")


class InferenceEngine(Protocol):
    """Runs a model on a batch. ``infer`` may block; it is called from one thread."""

    @property
    def n_features(self) -> int | None:
        """Width of the input matrix the model expects, when the model says."""
        ...

    @property
    def model_hash(self) -> str:
        """SHA-256 of the model file, for results and dead letters."""
        ...

    def infer(self, batch: npt.NDArray[np.float32]) -> Outputs:
        """Outputs keyed by result field name, each with one row per input row."""
        ...

    def warm_up(self, batch_sizes: Iterable[int]) -> None:
        """Run once per batch size so the first real batch pays no setup cost."""
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
        try:
            self._session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EngineError(f"cannot load model {path}: {exc}") from exc
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            raise EngineError(f"model {path} must have one input, has {len(inputs)}")
        self._input = inputs[0].name
        width = inputs[0].shape[-1] if inputs[0].shape else None
        self._n_features = width if isinstance(width, int) else None
        names = [o.name for o in self._session.get_outputs()]
        self._outputs = _output_map(spec.outputs, names, path)
        self._run = self._session.run
        self.providers: list[str] = self._session.get_providers()

    @property
    def n_features(self) -> int | None:
        return self._n_features

    @property
    def model_hash(self) -> str:
        return self._hash

    def infer(self, batch: npt.NDArray[np.float32]) -> Outputs:
        wanted = list(self._outputs.values())
        try:
            values = self._run(wanted, {self._input: batch})
        except Exception as exc:
            raise EngineError(f"model run failed on {len(batch)} rows: {exc}") from exc
        return {field: np.asarray(v) for field, v in zip(self._outputs, values, strict=True)}

    def warm_up(self, batch_sizes: Iterable[int]) -> None:
        width = self._n_features or 1
        sizes = list(batch_sizes)
        started = time.perf_counter()
        for size in sizes:
            self.infer(np.zeros((size, width), dtype=np.float32))
        log.info(
            "model %s warmed at batch sizes %s in %.0f ms",
            self._path.name,
            sizes,
            1000 * (time.perf_counter() - started),
        )


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


ENGINES: dict[str, Callable[[ModelSpec], InferenceEngine]] = {"onnxruntime": OnnxEngine}
