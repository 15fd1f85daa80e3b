"""Opening a model's session on a GPU runtime, simulated on the CPU: the CUDA provider
whose libraries are missing (the fallback warning and the refusal name them), NVIDIA's
wheels loaded first, and the TensorRT engine cache locked while the session opens.

ONNX Runtime here is the CPU build; the tests make it look like onnxruntime-gpu for CUDA
12 (its providers listed, its ``cuda_version``, a provider library in its folder), the
loader refuse chosen libraries, and the session open on the CPU."""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import onnxruntime
import pytest

from streamfer_dev.modelgen import DemoModel
from worker.config import ModelSpec, TensorrtOptions
from worker.errors import EngineError
from worker.inference import gpu_libraries, providers, session
from worker.inference.engine_lock import LOCK_FILE
from worker.inference.providers import CPU, CUDA, TENSORRT
from worker.inference.session import open_session

CUDNN_MISSING = "libcudnn.so.9: cannot open shared object file: No such file or directory"


@pytest.fixture
def gpu_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """This onnxruntime as a CUDA 12 build on a host without cuDNN; returns the log of the
    libraries the loader was asked for."""
    package = tmp_path / "site-packages" / "onnxruntime"
    (package / "capi").mkdir(parents=True)
    for name in ("libonnxruntime_providers_cuda.so", "libonnxruntime_providers_tensorrt.so"):
        (package / "capi" / name).write_bytes(b"")
    asked: list[str] = []

    def cdll(name: str) -> None:
        asked.append(name)
        if name.endswith("_providers_cuda.so") or name == "libcudnn.so.9":
            raise OSError(CUDNN_MISSING)

    def preload_dlls() -> None:
        print(f"Failed to load libcudnn.so.9: {CUDNN_MISSING}")

    loader = SimpleNamespace(CDLL=cdll)
    monkeypatch.setattr(providers, "ctypes", loader)
    monkeypatch.setattr(gpu_libraries, "ctypes", loader)
    monkeypatch.setattr(onnxruntime, "__file__", str(package / "__init__.py"))
    monkeypatch.setattr(onnxruntime, "cuda_version", "12.8", raising=False)
    monkeypatch.setattr(onnxruntime, "preload_dlls", preload_dlls, raising=False)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [TENSORRT, CUDA, CPU])
    return asked


def on_the_cpu(monkeypatch: pytest.MonkeyPatch, served: list[str] | None = None) -> None:
    """Sessions open on the CPU whatever they ask for (or report ``served``)."""

    def cpu_session(path: Path, options: Any, chain: Any) -> Any:
        opened = onnxruntime.InferenceSession(str(path), providers=[CPU])
        if served is None:
            return opened
        return SimpleNamespace(get_providers=lambda: served, get_outputs=opened.get_outputs)

    monkeypatch.setattr(session, "_session", cpu_session)


def test_cuda_falling_back_to_the_cpu_names_the_missing_library(
    classifier: DemoModel,
    gpu_runtime: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    on_the_cpu(monkeypatch)
    spec = ModelSpec(path=classifier.path, name="m", providers=[CUDA, CPU])
    with caplog.at_level(logging.WARNING, logger="worker.inference.session"):
        opened = open_session(spec, [1, 8])
    assert opened.provider == CPU
    warnings = [r.getMessage() for r in caplog.records]
    assert (
        "model m.onnx: loading NVIDIA's libraries: Failed to load libcudnn.so.9: " in (warnings[0])
    )
    (fallback,) = warnings[1:]
    assert fallback.startswith(
        "model m.onnx: CUDAExecutionProvider does not serve: its library "
        f"libonnxruntime_providers_cuda.so cannot be loaded: {CUDNN_MISSING}; "
        "missing: libcudnn.so.9 (CUDA 12 and cuDNN 9 come with onnxruntime-gpu[cuda,cudnn]"
    )
    assert fallback.endswith("CPUExecutionProvider serves instead")
    assert {"libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"} <= set(gpu_runtime)


def test_without_a_cpu_fallback_the_refusal_names_the_missing_library(
    classifier: DemoModel, gpu_runtime: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    on_the_cpu(monkeypatch)
    spec = ModelSpec(path=classifier.path, name="m", providers=[CUDA])
    with pytest.raises(EngineError, match=r"missing: libcudnn\.so\.9 \(CUDA 12 and cuDNN 9"):
        open_session(spec, [1, 8])


def test_the_tensorrt_engine_cache_is_locked_while_the_session_opens(
    classifier: DemoModel,
    gpu_runtime: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "engines"
    held: list[bool] = []

    def build(path: Path, options: Any, chain: Any) -> Any:
        with (cache / LOCK_FILE).open("a") as other:  # another open file: flock conflicts
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
        (cache / "m_engine.trt").write_bytes(b"engine")
        return SimpleNamespace(get_providers=lambda: [TENSORRT, CPU])

    monkeypatch.setattr(session, "_session", build)
    spec = ModelSpec(
        path=classifier.path,
        name="m",
        providers=[TENSORRT, CPU],
        tensorrt=TensorrtOptions(engine_cache_dir=cache),
    )
    opened = open_session(spec, [1, 8])
    assert held == [True], "the session opened without the cache's lock"
    assert opened.provider == TENSORRT
    assert opened.engine_cache is not None
    assert opened.engine_cache.before == frozenset()  # the lock file is not an engine
    with (cache / LOCK_FILE).open("a") as after:
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: does not raise


def test_a_cpu_only_model_neither_preloads_nor_locks(
    classifier: DemoModel, gpu_runtime: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_the_cpu(monkeypatch)
    cache = tmp_path / "engines"
    spec = ModelSpec(
        path=classifier.path,
        name="m",
        providers=[CPU],
        tensorrt=TensorrtOptions(engine_cache_dir=cache),
    )
    assert open_session(spec, [1, 8]).provider == CPU
    assert gpu_runtime == [] and not cache.exists()
