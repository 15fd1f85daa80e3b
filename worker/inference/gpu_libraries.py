"""The NVIDIA libraries a GPU provider links: loading them from NVIDIA's wheels, and naming
the ones that are missing.

onnxruntime-gpu's CUDA provider links the CUDA runtime and cuBLAS of one CUDA major version
and cuDNN 9; its TensorRT provider links those and TensorRT 10 (``libnvinfer.so.10``,
``libnvonnxparser.so.10``). streamfer-gpu requires ``onnxruntime-gpu[cuda,cudnn]``, whose
extras install CUDA and cuDNN as wheels under ``site-packages/nvidia``, where the dynamic
loader does not look: ``preload`` runs ``onnxruntime.preload_dlls()`` (ONNX Runtime 1.21
and later) to load them before a GPU session opens. ``missing`` tries each library by the
name the provider asks for, so a warning can list every absent one rather than only the
first the loader tripped on. Runs once per model load, never per batch; needs no GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "TENSORRT_HINT",
    "TENSORRT_MAJOR",
    "cuda_major",
    "missing",
    "needed_libraries",
    "preload",
]

TENSORRT_MAJOR = 10
"""The TensorRT major the onnxruntime-gpu builds streamfer-gpu allows (1.21 to 1.26) link."""

TENSORRT_HINT = (
    f"TensorRT {TENSORRT_MAJOR} is not installed: pip install 'tensorrt-cu{{cuda}}-libs=="
    f"{TENSORRT_MAJOR}.*' (the PyPI package fetches NVIDIA's wheel from pypi.nvidia.com) and "
    "put its site-packages/tensorrt_libs folder on LD_LIBRARY_PATH, or install TensorRT "
    f"{TENSORRT_MAJOR} for CUDA {{cuda}} on the host"
)
"""What to install when the TensorRT libraries are missing; ``{cuda}`` is the CUDA major."""


def cuda_major(ort: Any) -> int | None:
    """The CUDA major version this onnxruntime was built for (``onnxruntime.cuda_version``,
    e.g. ``"12.8"``), or None for a build without CUDA or one too old to say."""
    version = str(getattr(ort, "cuda_version", "") or "")
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def needed_libraries(provider: str, cuda: int) -> list[str]:
    """The NVIDIA libraries (by soname) ``provider`` links for CUDA major ``cuda``."""
    libraries = [
        f"libcudart.so.{cuda}",
        f"libcublasLt.so.{cuda}",
        f"libcublas.so.{cuda}",
        "libcurand.so.10",
        f"libcufft.so.{cuda - 1}",  # cuFFT 11 ships with CUDA 12, 12 with CUDA 13
        "libcudnn.so.9",
    ]
    if provider == "TensorrtExecutionProvider":
        libraries += [f"libnvinfer.so.{TENSORRT_MAJOR}", f"libnvonnxparser.so.{TENSORRT_MAJOR}"]
    return libraries


def _load(name: str) -> None:
    ctypes.CDLL(name)


def missing(names: Sequence[str], load: Callable[[str], None] = _load) -> list[str]:
    """The ``names`` the dynamic loader cannot open (after ``preload`` those loaded from
    NVIDIA's wheels count as found: the loader matches an open library by its soname)."""
    absent = []
    for name in names:
        try:
            load(name)
        except OSError:
            absent.append(name)
    return absent


def preload(ort: Any) -> list[str]:
    """Load CUDA and cuDNN from NVIDIA's wheels (``onnxruntime.preload_dlls()``, a no-op
    on a CPU build) and return the lines it printed about libraries it could not load.

    ``preload_dlls`` prints to stdout; its lines are captured (briefly replacing
    ``sys.stdout`` for the process) so the caller logs them. Never raises: an
    onnxruntime without ``preload_dlls`` (before 1.21) or a failing one returns a line
    saying so, and the session then relies on the loader's own search path."""
    preload_dlls = getattr(ort, "preload_dlls", None)
    if preload_dlls is None:
        return []
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            preload_dlls()
    except Exception as exc:  # onnxruntime raises RuntimeError for a bad folder
        return [f"onnxruntime.preload_dlls() failed: {exc}"]
    return [line for line in printed.getvalue().splitlines() if line.startswith("Failed to")]
