"""NVIDIA's libraries for the GPU providers: loading them through ONNX Runtime's
``preload_dlls`` and naming the missing ones, told with a fake loader (this machine has
neither a GPU nor CUDA) and with the real CPU build of ONNX Runtime."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import onnxruntime
import pytest

from worker.inference.gpu_libraries import cuda_major, missing, needed_libraries, preload


def refuse(*absent: str) -> Callable[[str], None]:
    """A loader that opens everything but ``absent``, as ctypes.CDLL fails on them."""

    def load(name: str) -> None:
        if name in absent:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    return load


@pytest.mark.parametrize(
    ("version", "major"), [("12.8", 12), ("13.0", 13), ("", None), (None, None), ("x", None)]
)
def test_the_cuda_major_comes_from_runtimes_build_info(version: str | None, major: int) -> None:
    assert cuda_major(SimpleNamespace(cuda_version=version)) == major
    assert cuda_major(SimpleNamespace()) is None  # an onnxruntime older than 1.21


def test_the_cpu_build_of_runtime_has_no_cuda_major() -> None:
    assert cuda_major(onnxruntime) is None


def test_the_libraries_each_provider_links() -> None:
    cuda = needed_libraries("CUDAExecutionProvider", 12)
    assert {"libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libcudnn.so.9"} <= set(cuda)
    assert "libcufft.so.11" in cuda  # what onnxruntime-gpu 1.26's CUDA provider links
    trt = needed_libraries("TensorrtExecutionProvider", 12)
    assert trt[: len(cuda)] == cuda
    assert trt[len(cuda) :] == ["libnvinfer.so.10", "libnvonnxparser.so.10"]


def test_missing_lists_every_library_the_loader_refuses() -> None:
    names = needed_libraries("CUDAExecutionProvider", 12)
    load = refuse("libcudnn.so.9", "libcublasLt.so.12")
    assert missing(names, load) == ["libcublasLt.so.12", "libcudnn.so.9"]
    assert missing(names, refuse()) == []


def test_missing_with_the_real_loader_names_what_is_not_here() -> None:
    assert missing(["libc.so.6", "libstreamfer-not-a-library.so.1"]) == [
        "libstreamfer-not-a-library.so.1"
    ]


def test_preload_returns_what_runtime_could_not_load() -> None:
    def preload_dlls() -> None:
        print("Failed to load libcudnn.so.9: libcudnn.so.9: cannot open shared object file")
        print("Please follow https://onnxruntime.ai/docs/install/#cuda-and-cudnn to install CUDA.")

    lines = preload(SimpleNamespace(preload_dlls=preload_dlls))
    assert lines == ["Failed to load libcudnn.so.9: libcudnn.so.9: cannot open shared object file"]


def test_preload_never_raises() -> None:
    def broken() -> None:
        raise RuntimeError("Invalid parameter of directory=None. The directory does not exist!")

    assert preload(SimpleNamespace(preload_dlls=broken)) == [
        "onnxruntime.preload_dlls() failed: Invalid parameter of directory=None. "
        "The directory does not exist!"
    ]
    assert preload(SimpleNamespace()) == []  # before onnxruntime 1.21


def test_preload_on_the_real_cpu_build_loads_nothing_and_says_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert preload(onnxruntime) == []
    assert capsys.readouterr().out == ""
