"""Execution providers: the config's choice as ONNX Runtime options, and why a requested
one does not serve.

ONNX Runtime takes providers as ``(name, {option: value})`` pairs in priority order and,
when one cannot be created (the CPU build of the wheel, a CUDA or TensorRT library
missing, no GPU), logs a line of its own and serves with the next one. ``provider_options``
builds the pairs from a ``ModelSpec`` in one pure function; ``why_not_serving`` names the
cause in words an operator can act on: which ONNX Runtime distribution is installed (both
``onnxruntime`` and ``onnxruntime-gpu`` at once is the known clash: the two wheels write
the same package, and the CUDA provider disappears), or which shared library the
provider's own library could not load (``libcudnn.so.9``, ``libnvinfer.so.10`` ...).
Nothing here needs a GPU.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.config import ModelSpec
from worker.inference.gpu_libraries import TENSORRT_HINT, cuda_major, missing, needed_libraries

__all__ = [
    "CPU",
    "CUDA",
    "GPU_PROVIDERS",
    "ORT_DISTRIBUTIONS",
    "TENSORRT",
    "InputShape",
    "input_shapes",
    "installed_runtimes",
    "profile_shapes",
    "provider_options",
    "why_not_serving",
]

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)

ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")
"""The wheels that install the ``onnxruntime`` package on Linux (CPU and CUDA builds)."""

# The provider's own shared library, beside ONNX Runtime's in onnxruntime/capi.
_PROVIDER_LIBRARIES = {
    CUDA: "libonnxruntime_providers_cuda.so",
    TENSORRT: "libonnxruntime_providers_tensorrt.so",
}
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class InputShape:
    """A model input as TensorRT's profiles need it: its name and its dimensions after
    the batch axis (None where the model leaves one open)."""

    name: str
    inner: tuple[int | None, ...]


def input_shapes(path: Path) -> list[InputShape]:
    """A model's numeric tensor inputs and their dimensions after the batch axis, read
    from a CPU session that skips graph optimisation (TensorRT needs them before its own
    session exists)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=[CPU])
    return [
        InputShape(i.name, tuple(d if isinstance(d, int) else None for d in (i.shape or [])[1:]))
        for i in session.get_inputs()
        if i.type.startswith("tensor(") and i.type != "tensor(string)"
    ]


def provider_options(
    spec: ModelSpec,
    providers: Sequence[str],
    *,
    batch_sizes: Sequence[int] = (),
    inputs: Sequence[InputShape] = (),
) -> list[tuple[str, dict[str, str]]]:
    """``providers`` (a subset of ``spec.providers``, in its order) with the options the
    config sets for each, as ``InferenceSession(providers=...)`` takes them.

    CUDA, as https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html
    names them: ``device_id``, ``cudnn_conv_algo_search``, ``arena_extend_strategy``,
    ``gpu_mem_limit`` (bytes). TensorRT, as
    https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html names
    them: ``trt_fp16_enable``, ``trt_engine_cache_enable`` / ``trt_engine_cache_path``,
    ``trt_timing_cache_enable`` / ``trt_timing_cache_path``, ``trt_max_workspace_size``
    (bytes), ``trt_builder_optimization_level``, and one optimisation profile over the
    warmed ``batch_sizes`` (``profile_shapes``). Booleans are written ``True``/``False``,
    as that page's Python example passes them (Runtime turns every value into a string).
    """
    cuda, trt = spec.cuda, spec.tensorrt
    out: list[tuple[str, dict[str, str]]] = []
    for name in providers:
        options: dict[str, str] = {}
        if name == CUDA:
            options = {
                "device_id": str(cuda.device_id),
                "cudnn_conv_algo_search": cuda.cudnn_conv_algo_search,
                "arena_extend_strategy": cuda.arena_extend_strategy,
            }
            if cuda.gpu_mem_limit_mb is not None:
                options["gpu_mem_limit"] = str(cuda.gpu_mem_limit_mb * _MIB)
        elif name == TENSORRT:
            options = {"device_id": str(cuda.device_id), "trt_fp16_enable": str(trt.fp16)}
            if trt.engine_cache_dir is not None:
                options["trt_engine_cache_enable"] = "True"
                options["trt_engine_cache_path"] = str(trt.engine_cache_dir)
            if trt.timing_cache_dir is not None:
                options["trt_timing_cache_enable"] = "True"
                options["trt_timing_cache_path"] = str(trt.timing_cache_dir)
            if trt.max_workspace_mb is not None:
                options["trt_max_workspace_size"] = str(trt.max_workspace_mb * _MIB)
            if trt.builder_optimization_level is not None:
                options["trt_builder_optimization_level"] = str(trt.builder_optimization_level)
            options.update(profile_shapes(inputs, batch_sizes))
        out.append((name, options))
    return out


def profile_shapes(inputs: Sequence[InputShape], batch_sizes: Sequence[int]) -> dict[str, str]:
    """TensorRT's ``trt_profile_{min,opt,max}_shapes`` for one profile that covers every
    warmed batch size: min the smallest, opt and max the largest (a backlog runs at the
    largest, so that is the shape TensorRT tunes its kernels for). Written
    ``name:AxB,name2:AxC`` as the TensorRT provider parses them; that parser reads a name
    given twice as a second profile, which one profile over the range makes unnecessary.

    Empty (TensorRT then derives profiles from the shapes warm-up runs) when there are
    no sizes or inputs, when an input leaves a dimension after the batch open, or when a
    name holds ``:`` or ``,``, which that format cannot carry.
    """
    if not batch_sizes or not inputs:
        return {}
    lowest, highest = min(batch_sizes), max(batch_sizes)
    parts: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for shape in inputs:
        if any(d is None for d in shape.inner) or any(c in shape.name for c in ":,"):
            return {}
        inner = "".join(f"x{d}" for d in shape.inner)
        parts["min"].append(f"{shape.name}:{lowest}{inner}")
        parts["opt"].append(f"{shape.name}:{highest}{inner}")
        parts["max"].append(f"{shape.name}:{highest}{inner}")
    return {f"trt_profile_{kind}_shapes": ",".join(shapes) for kind, shapes in parts.items()}


def installed_runtimes() -> dict[str, str]:
    """The ONNX Runtime distributions installed here, name -> version."""
    found: dict[str, str] = {}
    for name in ORT_DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _load(path: str) -> None:
    ctypes.CDLL(path)


def why_not_serving(
    provider: str,
    available: Sequence[str],
    *,
    runtimes: Mapping[str, str] | None = None,
    capi_dir: Path | None = None,
    load: Callable[[str], None] = _load,
    cuda: int | None = None,
) -> str:
    """Why ``provider`` was asked for but does not serve, in one sentence.

    ``available`` is ``onnxruntime.get_available_providers()``; ``runtimes`` the installed
    distributions (default: ``installed_runtimes()``); ``capi_dir`` the folder of
    Runtime's libraries (default: the installed ``onnxruntime/capi``); ``load`` opens a
    shared library (``ctypes.CDLL``) and raises OSError naming what it lacks; ``cuda`` the
    CUDA major Runtime was built for (default: ``gpu_libraries.cuda_major``). When the
    provider's library does not load, every NVIDIA library it needs that ``load`` cannot
    open is listed, with what installs it. What to install in place of a CPU runtime is
    ``runtime_dist.gpu_install_hint``'s to say.
    """
    if provider not in available:
        found = installed_runtimes() if runtimes is None else runtimes
        listed = ", ".join(f"{n} {v}" for n, v in found.items()) or "no known distribution"
        if len(found) > 1:
            return (
                f"{listed} are both installed: the two wheels write the same onnxruntime "
                "package and the CPU build's files won (this Runtime offers "
                f"{list(available)})"
            )
        if "onnxruntime-gpu" not in found:
            return (
                f"this is the CPU build of ONNX Runtime ({listed} installed, not "
                "onnxruntime-gpu), which offers only "
                f"{list(available)}"
            )
        return f"{listed} does not offer it; it offers {list(available)}"
    library = _PROVIDER_LIBRARIES.get(provider)
    if library is None:
        return "ONNX Runtime did not create it (its log lines above say why)"
    if capi_dir is None or cuda is None:
        import onnxruntime

        capi_dir = capi_dir or Path(onnxruntime.__file__).parent / "capi"
        cuda = cuda_major(onnxruntime) if cuda is None else cuda
    path = capi_dir / library
    if not path.exists():
        return f"its library {library} is not in {capi_dir}"
    try:
        load(str(path))
    except OSError as exc:
        return f"its library {library} cannot be loaded: {exc}{_absent(provider, cuda, load)}"
    return (
        f"its library {library} loads, but ONNX Runtime did not create the provider (no "
        "usable GPU, or a driver older than its CUDA: its log lines above say which)"
    )


def _absent(provider: str, cuda: int | None, load: Callable[[str], None]) -> str:
    """``"; missing: ... (what installs them)"`` for the NVIDIA libraries ``provider``
    needs that ``load`` cannot open; empty when none is, or the CUDA major is unknown."""
    if cuda is None:
        return ""
    absent = missing(needed_libraries(provider, cuda), load)
    if not absent:
        return ""
    fixes = []
    tensorrt = [name for name in absent if name.startswith(("libnvinfer", "libnvonnxparser"))]
    if len(tensorrt) < len(absent):
        fixes.append(
            f"CUDA {cuda} and cuDNN 9 come with onnxruntime-gpu[cuda,cudnn] (streamfer-gpu "
            "requires it) or the host's CUDA toolkit and cuDNN"
        )
    if tensorrt:
        fixes.append(TENSORRT_HINT.format(cuda=cuda))
    return f"; missing: {', '.join(absent)} ({'; '.join(fixes)})"
