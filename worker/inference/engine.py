"""Inference engines: one call per batch, one array per model input.

``InferenceEngine`` is the plug-in point; ``OnnxEngine`` runs ONNX Runtime on the
execution providers the config names (CPU by default; CUDA and TensorRT with
onnxruntime-gpu on a GPU). A session is created once per model, after its file's
SHA-256 is checked when pinned (``worker.inference.session`` opens it on the first
provider that serves), and warmed up before the worker joins its group.
Inputs may be of any
type in ``ONNX_DTYPES`` (strings too), as ``worker.pipeline.feeds`` assembles them.
``infer`` hands back plain arrays only (numbers, bools or str, one row per input row):
a ZipMap output, the list of ``{class: probability}`` dicts a skl2onnx classifier
exported with default options gives, becomes a float matrix in class order, once per
batch. ``warm_up`` proves every output encodes as JSON, so a model the worker could not
publish fails start-up, not the first live batch. ``ENGINES`` maps a name to a factory.

On a GPU (``worker.inference.providers`` builds the provider options and explains a provider that
does not serve) a batch runs at one of the warmed bucket sizes (``worker.inference.buckets``),
through per-bucket bound host buffers (``worker.inference.device_io``), and a device out-of-memory
error halves it and retries each half. TensorRT builds its engine while warm-up runs,
before the worker joins its group; the time it took is logged.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from worker.config import ModelSpec
from worker.errors import EngineError
from worker.inference.buckets import Buckets, PaddedFeeds, rows_of
from worker.inference.device_io import BoundRunner, OutputSpec, host_buffers
from worker.inference.graph import string_examples
from worker.inference.outputs import (
    class_names,
    converters,
    named_labels,
    output_map,
    unpublishable,
)
from worker.inference.providers import CUDA, GPU_PROVIDERS, TENSORRT
from worker.inference.session import EngineCache, open_session

__all__ = [
    "ENGINES",
    "ONNX_DTYPES",
    "Feeds",
    "InferenceEngine",
    "OnnxEngine",
    "Outputs",
    "ServingEngine",
    "TensorInput",
    "file_sha256",
    "is_device_oom",
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

Runner = Callable[[Feeds, int], list[Any]]

DEFAULT_MAX_BATCH_SIZE = 256
"""``BatchPolicy.max_batch_size``'s default: the buckets of an engine made without sizes."""

# How ONNX Runtime and the libraries under it say a device (or arena) allocation failed:
# BFCArena::AllocateRawInternal's "Failed to allocate memory for requested buffer of size
# N" (microsoft/onnxruntime#9939, #16307, #22702) and, under a memory limit (CUDA's
# gpu_mem_limit, a capped CPU arena), "Available memory of N is smaller than requested
# bytes of M"; "CUDA failure 2: out of memory"; cuBLAS's and cuDNN's
# "..._STATUS_ALLOC_FAILED"; cudaErrorMemoryAllocation; TensorRT's "Cuda Error in
# allocate: 2 (out of memory)" (microsoft/onnxruntime#10770) and "Cuda Runtime (out of
# memory)".
_DEVICE_OOM = re.compile(
    r"out of memory|Failed to allocate memory|BFCArena::AllocateRawInternal"
    r"|is smaller than requested bytes|_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)


def is_device_oom(exc: BaseException) -> bool:
    """Whether an ONNX Runtime error says a device or arena allocation failed: the batch
    may fit when smaller."""
    return bool(_DEVICE_OOM.search(str(exc)))


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


class ServingEngine(InferenceEngine, Protocol):
    """What start-up, ``streamfer check`` and the reloader read of a pipeline's engine
    beyond its batches: ``OnnxEngine`` in the worker, or ``TritonEngine`` on a server."""

    provider: str
    """Where it runs, as ``streamfer_inference_provider`` says (an execution provider, or
    ``triton``)."""
    providers: list[str]
    requested: list[str]
    output_types: dict[str, str]
    """Model output name -> its type, as ONNX Runtime names it."""

    @property
    def outputs(self) -> dict[str, str]:
        """Result field -> model output name."""
        ...

    def example(self, widths: Mapping[str, int] | None = None) -> Example:
        """Feeds of ``n`` rows the model accepts (zeros), for warm-up and checks."""
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
    """ONNX Runtime session for one model; ``run`` releases the GIL while it computes.

    ``batch_sizes`` are the sizes warm-up runs (``warm_up_sizes`` of the pipeline's
    ``max_batch_size``): the buckets batches are padded to, and TensorRT's profile.
    ``on_device_oom`` is called each time a batch is halved after a device
    out-of-memory error (the worker counts it in a metric).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        batch_sizes: Sequence[int] | None = None,
        on_device_oom: Callable[[], None] | None = None,
    ) -> None:
        path = spec.file
        if not path.is_file():
            raise EngineError(f"model file not found: {path}")
        self._path = path
        self._hash = file_sha256(path)
        if spec.sha256 is not None and spec.sha256.lower() != self._hash:
            raise EngineError(
                f"model file {path} has SHA-256 {self._hash}, but the config pins {spec.sha256}"
            )
        sizes = sorted(set(batch_sizes or warm_up_sizes(DEFAULT_MAX_BATCH_SIZE)))
        self._on_oom = on_device_oom or (lambda: None)
        self._oom_logged = False
        self.requested: list[str] = list(spec.providers)
        opened = open_session(spec, sizes)
        self._session = opened.session
        self.providers: list[str] = opened.providers
        self.provider: str = opened.provider
        """The requested provider that serves (the session may add CPU for some nodes)."""
        self._trt_cache: EngineCache | None = opened.engine_cache
        self._inputs = [_tensor_input(i.name, i.type, i.shape) for i in self._session.get_inputs()]
        declared = self._session.get_outputs()
        types = {o.name: o.type for o in declared}
        self.output_types: dict[str, str] = types
        self._outputs = output_map(spec.outputs, list(types), path)
        self._wanted = list(self._outputs.values())
        self._session = opened.without_row_warnings(self._wanted)
        self._converters = converters(self._wanted, types, path)
        self._class_names = class_names(spec.class_names, self._outputs, types, path)
        self._run = self._session.run
        self.padded = False
        self.io_binding = False
        self.io_path = "session.run"
        """How batches reach the model, in words, for the log and the device check."""
        self._buckets: Buckets | None = None
        # Runners reach the engine through a weak reference: none makes a reference cycle,
        # so an engine no batch holds any more (one a reload replaced) is freed at once.
        self._runner: Runner = _plain_runner(weakref.ref(self))
        self._pick_runner(spec, sizes, declared)

    def _pick_runner(self, spec: ModelSpec, sizes: Sequence[int], declared: Sequence[Any]) -> None:
        """Plain ``session.run`` (the CPU default), padded to buckets, or padded and
        bound: the config's choice, or, by default, what the serving provider gains from."""
        on_gpu = self.provider in GPU_PROVIDERS
        self.padded = on_gpu if spec.pad_to_buckets is None else spec.pad_to_buckets
        if self.padded:
            self._buckets = Buckets(sizes)
            self._runner = self._padded_runner(self._buckets)
            wanted_io = on_gpu if spec.io_binding is None else spec.io_binding
            unbindable = _unbindable(self._inputs, self.output_types, self._wanted)
            if wanted_io and unbindable is not None:
                log.info(
                    "model %s: no IOBinding (%s); batches go through session.run",
                    self._path.name,
                    unbindable,
                )
            elif wanted_io:
                self._runner = self._bound_runner(self._buckets, spec, declared)
                self.io_binding = True
        if self.padded or on_gpu:
            log.info(
                "model %s: %s serves; batches %s; %s",
                self._path.name,
                self.provider,
                f"padded to sizes {list(sizes)}" if self.padded else "run at their own size",
                self.io_path,
            )

    def _padded_runner(self, buckets: Buckets) -> Runner:
        padded = PaddedFeeds(buckets)
        self.io_path = "session.run on reused padded buffers"
        engine = weakref.ref(self)

        def run(feeds: Feeds, rows: int) -> list[Any]:
            me = engine()
            assert me is not None  # the engine owns this runner
            size, held = padded.fill(feeds, rows)
            return [rows_of(v, rows, size) for v in me._run(me._wanted, held)]

        return run

    def _bound_runner(self, buckets: Buckets, spec: ModelSpec, declared: Sequence[Any]) -> Runner:
        # TensorRT runs on CUDA's device: CUDA's host-accessible memory is as good
        sources = [self.provider, CUDA] if self.provider == TENSORRT else [self.provider]
        host, note = host_buffers(sources, spec.cuda.device_id)
        by_name = {o.name: o for o in declared}
        outputs = [
            OutputSpec(name, by_name[name].shape, ONNX_DTYPES[by_name[name].type])
            for name in self._wanted
        ]
        self.io_path = f"IOBinding with {note}, outputs bound to host memory"
        return BoundRunner(self._session, outputs, buckets, host)

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
        """Run the model on the batch and convert each output once. A model with one
        input also takes its array alone. With buckets, a batch larger than the largest
        runs in slices of it; a device out-of-memory error halves the rows and retries.

        Raises EngineError when the run fails (on one row, for out-of-memory) or an
        output cannot be converted.
        """
        if isinstance(feeds, np.ndarray):
            feeds = {self._inputs[0].name: feeds}
        rows = len(next(iter(feeds.values()))) if feeds else 0
        self._oom_logged = False
        buckets = self._buckets
        if buckets is None or rows <= buckets.largest:
            return self._infer_rows(feeds, rows)
        return _joined(
            [
                self._infer_rows({k: v[start:stop] for k, v in feeds.items()}, stop - start)
                for start, stop in buckets.spans(rows)
            ]
        )

    def _infer_rows(self, feeds: Feeds, rows: int) -> Outputs:
        try:
            values = self._runner(feeds, rows)
        except Exception as exc:
            if rows > 1 and is_device_oom(exc):
                return self._halved(feeds, rows, exc)
            raise EngineError(f"model run failed on {rows} rows: {exc}") from exc
        outputs: Outputs = {}
        for field, convert, value in zip(self._outputs, self._converters, values, strict=True):
            try:
                outputs[field] = convert(value)
            except (TypeError, ValueError, KeyError) as exc:
                raise EngineError(f"cannot convert output {field!r} of {rows} rows: {exc}") from exc
        if self._class_names is not None:
            try:
                outputs["label"] = named_labels(outputs["label"], self._class_names)
            except (ValueError, IndexError) as exc:
                raise EngineError(f"cannot name the labels of {rows} rows: {exc}") from exc
        return outputs

    def _halved(self, feeds: Feeds, rows: int, exc: Exception) -> Outputs:
        """The batch as two halves, each retried (and halved again while it does not fit)."""
        self._on_oom()
        half = rows // 2
        if not self._oom_logged:
            self._oom_logged = True
            log.warning(
                "model %s: out of device memory on %d rows (%s); retrying in halves",
                self._path.name,
                rows,
                str(exc).strip().splitlines()[-1][:300],
            )
        return _joined(
            [
                self._infer_rows({k: v[:half] for k, v in feeds.items()}, half),
                self._infer_rows({k: v[half:] for k, v in feeds.items()}, rows - half),
            ]
        )

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
        order = sizes or [1]
        if self.provider in GPU_PROVIDERS and len(order) > 1:
            # the largest first: TensorRT's engine (and the CUDA arena) sized for it once
            largest = max(order)
            order = [largest, *(s for s in order if s != largest)]
        started = time.perf_counter()
        for i, size in enumerate(order):
            try:
                outputs = self.infer(feeds(size))
            except EngineError as exc:
                raise EngineError(
                    f"model {self._path} fails on warm-up rows (zeros, and a known category "
                    f"for string columns): {exc}"
                ) from exc
            for field, values in outputs.items():
                why = unpublishable(values, size)
                if why is not None:
                    raise EngineError(
                        f"model {self._path}: output {field!r} ({self._outputs[field]}) "
                        f"cannot be published: {why}"
                    )
            if i == 0 and self.provider == TENSORRT:
                log.info(
                    "model %s: TensorRT engine ready after the first run (batch %d) in %.1f s",
                    self._path.name,
                    size,
                    time.perf_counter() - started,
                )
        log.info(
            "model %s warmed at batch sizes %s in %.0f ms",
            self._path.name,
            sizes,
            1000 * (time.perf_counter() - started),
        )
        if self._trt_cache is not None:
            self._trt_cache.report(self._path.name)
            self._trt_cache = None


def _plain_runner(engine: weakref.ref[OnnxEngine]) -> Runner:
    def run(feeds: Feeds, rows: int) -> list[Any]:
        me = engine()
        assert me is not None  # the engine owns this runner
        values: list[Any] = me._run(me._wanted, feeds)
        return values

    return run


def _unbindable(
    inputs: Sequence[TensorInput], types: Mapping[str, str], wanted: Sequence[str]
) -> str | None:
    """Why a model's batches cannot go through IOBinding, or None when they can: every
    input and wanted output must be a numeric tensor (strings and ZipMap's maps cannot
    sit in a bound buffer)."""
    for t in inputs:
        if t.dtype is None or t.dtype.kind == "O" or t.rank not in (1, 2):
            return f"input {t.name!r} is {t.onnx_type}"
    for name in wanted:
        dtype = ONNX_DTYPES.get(types[name])
        if dtype is None or dtype.kind == "O":
            return f"output {name!r} is {types[name]}"
    return None


def _joined(parts: Sequence[Outputs]) -> Outputs:
    """Outputs of consecutive slices of one batch, as one batch's."""
    if len(parts) == 1:
        return parts[0]
    try:
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    except ValueError as exc:  # an output without a row per input row
        raise EngineError(f"cannot join the outputs of {len(parts)} slices: {exc}") from exc


def _tensor_input(name: str, onnx_type: str, shape: Sequence[Any] | None) -> TensorInput:
    rank = len(shape) if shape is not None else 0
    width = shape[-1] if shape and rank == 2 and isinstance(shape[-1], int) else None
    return TensorInput(name, onnx_type, ONNX_DTYPES.get(onnx_type), rank, 1 if rank == 1 else width)


ENGINES: dict[str, Callable[[ModelSpec], InferenceEngine]] = {"onnxruntime": OnnxEngine}
