"""Opening a model's ONNX Runtime session: which of the configured execution providers
serves it, with what options, and what TensorRT's engine cache held before.

The providers this onnxruntime lacks are left out (when none is left, ``EngineError``
says why each is missing), the session loads with the options
``worker.inference.providers`` builds, and the first requested provider the session
really has serves; a warning says why each one asked for before it does not, and how to
install a runtime that has it. Before a GPU session opens, the CUDA and cuDNN libraries of
NVIDIA's wheels are loaded (``worker.inference.gpu_libraries``); while a session with a
TensorRT engine cache opens, that cache is locked against other processes
(``worker.inference.engine_lock``). An older TensorRT provider that refuses the explicit shape
profiles gets the session again without them. Everything here runs once per model, on the
thread that loads it (``worker.inference.engine``); nothing here runs a batch.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from worker.config import ModelSpec
from worker.errors import EngineError
from worker.inference.engine_lock import LOCK_FILE, engine_cache_lock
from worker.inference.gpu_libraries import preload
from worker.inference.providers import (
    GPU_PROVIDERS,
    TENSORRT,
    input_shapes,
    provider_options,
    why_not_serving,
)
from worker.inference.runtime_dist import gpu_install_hint

__all__ = ["EngineCache", "ModelSession", "open_session"]

log = logging.getLogger(__name__)

ProviderOptions = Sequence[tuple[str, dict[str, str]]]


@dataclass(frozen=True, slots=True)
class EngineCache:
    """TensorRT's engine cache folder and the files it held before the session opened."""

    folder: Path
    before: frozenset[str]

    def report(self, model: str) -> None:
        """Log whether TensorRT built an engine (and which files it wrote) or took it from
        the cache; called once, after warm-up, when the engine exists."""
        written = sorted(_files(self.folder) - self.before)
        if written:
            log.info(
                "model %s: TensorRT built its engine and wrote %s to the cache %s",
                model,
                written,
                self.folder,
            )
        else:
            log.info(
                "model %s: TensorRT engine taken from the cache %s (nothing new written)",
                model,
                self.folder,
            )


@dataclass(frozen=True, slots=True)
class ModelSession:
    """A model's open session, the provider that serves it, and how to open it again."""

    session: Any
    provider: str
    """The requested provider that serves (the session may add CPU for some nodes)."""
    providers: list[str]
    """Every provider the session has, in its order."""
    engine_cache: EngineCache | None
    """Where TensorRT keeps its engines, when TensorRT serves and the config names a folder."""
    path: Path
    options: Any
    provider_options: ProviderOptions

    def without_row_warnings(self, wanted: Sequence[str]) -> Any:
        """The session, or, when one of the ``wanted`` outputs is declared with one row,
        the session opened again with ONNX Runtime's warnings off (errors only).

        onnxmltools declares a LightGBM classifier's label as shape [1]: Runtime then
        warns on every batch that the real shape differs. Its load-time warnings were
        shown already; those of each run are not wanted."""
        one_row = [
            o.name
            for o in self.session.get_outputs()
            if o.name in wanted and o.shape and o.shape[0] == 1
        ]
        if not one_row:
            return self.session
        log.warning(
            "model %s declares outputs %s with one row but returns one per input row; "
            "ONNX Runtime's per-batch warnings about it are silenced",
            self.path.name,
            one_row,
        )
        self.options.log_severity_level = 3
        return _session(self.path, self.options, self.provider_options)


def open_session(spec: ModelSpec, sizes: Sequence[int]) -> ModelSession:
    """The session of ``spec.path`` on the first of ``spec.providers`` that serves, with
    TensorRT's profile (when it is among them) covering ``sizes``. Raises EngineError when
    no provider is available or serves, or the model does not load."""
    import onnxruntime as ort

    path = spec.file
    available = ort.get_available_providers()
    chain = [p for p in spec.providers if p in available]
    if not chain:
        reasons = "; ".join(f"{p}: {why_not_serving(p, available)}" for p in spec.providers)
        raise EngineError(
            f"none of the execution providers {spec.providers} is available here; "
            f"this onnxruntime offers {available} ({reasons})"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = spec.intra_op_threads
    options.inter_op_num_threads = 1
    shapes = input_shapes(path) if TENSORRT in chain else []
    trt_cache = spec.tensorrt.engine_cache_dir if TENSORRT in chain else None
    providers = provider_options(spec, chain, batch_sizes=sizes, inputs=shapes)
    if any(p in GPU_PROVIDERS for p in chain):
        for line in preload(ort):
            log.warning("model %s: loading NVIDIA's libraries: %s", path.name, line)
    started = time.perf_counter()
    locked = engine_cache_lock(trt_cache) if trt_cache is not None else contextlib.nullcontext()
    with locked:  # what the cache held is read under the lock: another may have just built
        cached = _files(trt_cache) if trt_cache is not None else frozenset()
        session = _session(path, options, providers)
    served: list[str] = session.get_providers()
    provider = _serving(spec.providers, served, available, path)
    if provider in GPU_PROVIDERS:
        log.info(
            "model %s: %s session created in %.1f s",
            path.name,
            provider,
            time.perf_counter() - started,
        )
    cache = (
        EngineCache(trt_cache, cached) if trt_cache is not None and provider == TENSORRT else None
    )
    return ModelSession(session, provider, served, cache, path, options, providers)


# An older TensorRT provider refuses explicit profiles that leave a TensorRT subgraph's
# dynamic input (an inner tensor, when the graph is partitioned) without one.
_PROFILE_REFUSED = "no associated shape profiles"


def _session(path: Path, options: Any, providers: ProviderOptions) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own untyped errors
        if _PROFILE_REFUSED in str(exc):
            log.warning(
                "model %s: TensorRT wants profiles for inner tensors too (%s); letting it "
                "derive them from the warm-up shapes instead",
                path.name,
                str(exc).strip().splitlines()[-1][:300],
            )
            plain = [
                (name, {k: v for k, v in opts.items() if not k.startswith("trt_profile_")})
                for name, opts in providers
            ]
            return _session(path, options, plain)
        raise EngineError(f"cannot load model {path}: {exc}") from exc


def _serving(
    requested: Sequence[str], served: Sequence[str], available: Sequence[str], path: Path
) -> str:
    """The first requested provider the session has; a warning for each one before it,
    saying why it does not serve. Raises EngineError when none of them serves."""
    for at, name in enumerate(requested):
        if name in served:
            for lost, then in pairwise(requested[: at + 1]):
                # A runtime without the provider is mended by installing another: the
                # pip commands go once, after the last warning, on lines of their own.
                missing = then == name and any(p not in available for p in requested[:at])
                fix = f"\n{gpu_install_hint()}" if missing else ""
                log.warning(
                    "model %s: %s does not serve: %s; %s%s",
                    path.name,
                    lost,
                    why_not_serving(lost, available),
                    f"{then} serves instead" if then == name else f"falling back to {then}",
                    fix,
                )
            return name
    reasons = "; ".join(f"{p}: {why_not_serving(p, available)}" for p in requested)
    raise EngineError(
        f"model {path}: none of the execution providers {list(requested)} serves "
        f"(the session has {list(served)}): {reasons}"
    )


def _files(folder: Path) -> frozenset[str]:
    try:
        return frozenset(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
    except OSError:
        return frozenset()
