"""Execution providers: the config as ONNX Runtime's provider options, and the reason a
requested provider does not serve, told from what is really installed here (the CPU
build of ONNX Runtime) and from libraries that really fail to load."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import onnxruntime
import pytest

from streamfer_dev.modelgen import DemoModel
from worker.config import CudaOptions, ModelSpec, TensorrtOptions
from worker.inference.providers import (
    CPU,
    CUDA,
    TENSORRT,
    InputShape,
    input_shapes,
    installed_runtimes,
    profile_shapes,
    provider_options,
    why_not_serving,
)

ALL = [TENSORRT, CUDA, CPU]


def _spec(tmp_path: Path, **kw: object) -> ModelSpec:
    return ModelSpec(path=tmp_path / "m.onnx", name="m", providers=ALL, **kw)  # type: ignore[arg-type]


def test_defaults_map_to_runtimes_defaults_and_cpu_takes_no_options(tmp_path: Path) -> None:
    assert provider_options(_spec(tmp_path), ALL) == [
        (TENSORRT, {"device_id": "0", "trt_fp16_enable": "False"}),
        (
            CUDA,
            {
                "device_id": "0",
                "cudnn_conv_algo_search": "EXHAUSTIVE",
                "arena_extend_strategy": "kNextPowerOfTwo",
            },
        ),
        (CPU, {}),
    ]


def test_every_option_has_runtimes_name_and_unit(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        cuda=CudaOptions(
            device_id=2,
            cudnn_conv_algo_search="HEURISTIC",
            arena_extend_strategy="kSameAsRequested",
            gpu_mem_limit_mb=1024,
        ),
        tensorrt=TensorrtOptions(
            fp16=True,
            engine_cache_dir=tmp_path / "engines",
            timing_cache_dir=tmp_path / "timing",
            max_workspace_mb=512,
            builder_optimization_level=5,
        ),
    )
    inputs = [InputShape("X", (30,)), InputShape("mask", (4, 2))]
    trt, cuda = provider_options(spec, [TENSORRT, CUDA], batch_sizes=[1, 2, 4, 8], inputs=inputs)
    assert cuda == (
        CUDA,
        {
            "device_id": "2",
            "cudnn_conv_algo_search": "HEURISTIC",
            "arena_extend_strategy": "kSameAsRequested",
            "gpu_mem_limit": str(1024 * 1024 * 1024),
        },
    )
    assert trt == (
        TENSORRT,
        {
            "device_id": "2",
            "trt_fp16_enable": "True",
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(tmp_path / "engines"),
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(tmp_path / "timing"),
            "trt_max_workspace_size": str(512 * 1024 * 1024),
            "trt_builder_optimization_level": "5",
            "trt_profile_min_shapes": "X:1x30,mask:1x4x2",
            "trt_profile_opt_shapes": "X:8x30,mask:8x4x2",
            "trt_profile_max_shapes": "X:8x30,mask:8x4x2",
        },
    )


def test_only_the_providers_asked_for_in_the_given_order(tmp_path: Path) -> None:
    assert [name for name, _ in provider_options(_spec(tmp_path), [CUDA, CPU])] == [CUDA, CPU]


def test_one_profile_spans_the_warmed_sizes() -> None:
    shapes = profile_shapes([InputShape("input", (5,))], [1, 2, 4, 8, 16, 32, 64, 100])
    assert shapes == {
        "trt_profile_min_shapes": "input:1x5",
        "trt_profile_opt_shapes": "input:100x5",
        "trt_profile_max_shapes": "input:100x5",
    }
    assert profile_shapes([InputShape("ids", ())], [4]) == {
        "trt_profile_min_shapes": "ids:4",
        "trt_profile_opt_shapes": "ids:4",
        "trt_profile_max_shapes": "ids:4",
    }


@pytest.mark.parametrize(
    "inputs",
    [
        [InputShape("X", (None,))],  # an open width: TensorRT derives it from warm-up
        [InputShape("X", (3,)), InputShape("seq", (None, 8))],
        [InputShape("a:b", (3,))],  # the option's own separators cannot be in a name
        [InputShape("a,b", (3,))],
        [],
    ],
)
def test_no_explicit_profile_where_the_format_cannot_say_it(inputs: list[InputShape]) -> None:
    assert profile_shapes(inputs, [1, 2, 4]) == {}
    assert profile_shapes([InputShape("X", (3,))], []) == {}


def test_installed_runtimes_reads_the_real_distributions() -> None:
    found = installed_runtimes()
    assert found["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert "onnxruntime-gpu" not in found  # this machine has the CPU build only


def test_the_cpu_build_is_named_with_its_version() -> None:
    available = onnxruntime.get_available_providers()
    assert CUDA not in available
    why = why_not_serving(CUDA, available)
    version = importlib.metadata.version("onnxruntime")
    assert f"this is the CPU build of ONNX Runtime (onnxruntime {version} installed" in why
    assert "CPUExecutionProvider" in why


def test_both_wheels_installed_is_the_known_clash() -> None:
    why = why_not_serving(
        CUDA,
        [CPU],
        runtimes={"onnxruntime": "1.23.2", "onnxruntime-gpu": "1.23.2"},
    )
    assert why.startswith("onnxruntime 1.23.2, onnxruntime-gpu 1.23.2 are both installed")


def test_a_gpu_build_without_the_provider() -> None:
    why = why_not_serving(TENSORRT, [CUDA, CPU], runtimes={"onnxruntime-gpu": "1.23.2"})
    assert why == (
        "onnxruntime-gpu 1.23.2 does not offer it; it offers "
        "['CUDAExecutionProvider', 'CPUExecutionProvider']"
    )


def test_a_provider_library_that_is_not_there(tmp_path: Path) -> None:
    why = why_not_serving(CUDA, [CUDA, CPU], capi_dir=tmp_path)
    assert why == f"its library libonnxruntime_providers_cuda.so is not in {tmp_path}"


def test_a_provider_library_that_does_not_load_says_what_the_loader_said(tmp_path: Path) -> None:
    """A real dlopen failure: here the file is not a shared object at all; on a GPU
    host without cuDNN the loader names the library instead (libcudnn.so.9: cannot open
    shared object file), and that text is passed on the same way."""
    (tmp_path / "libonnxruntime_providers_tensorrt.so").write_bytes(b"not an ELF file")
    why = why_not_serving(TENSORRT, [TENSORRT, CUDA, CPU], capi_dir=tmp_path)
    assert why.startswith("its library libonnxruntime_providers_tensorrt.so cannot be loaded: ")
    assert "libonnxruntime_providers_tensorrt.so" in why.split("loaded: ", 1)[1]


def test_a_library_that_loads_points_at_runtimes_own_log(tmp_path: Path) -> None:
    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(b"")
    why = why_not_serving(CUDA, [CUDA, CPU], capi_dir=tmp_path, load=lambda _path: None)
    assert "loads, but ONNX Runtime did not create the provider" in why


def test_the_default_library_folder_is_runtimes_own() -> None:
    capi = Path(onnxruntime.__file__).parent / "capi"
    assert why_not_serving(CUDA, [CUDA, CPU]) == (
        f"its library libonnxruntime_providers_cuda.so is not in {capi}"
    )


def test_input_shapes_read_from_the_model(classifier: DemoModel, tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    assert input_shapes(classifier.path) == [InputShape("X", (30,))]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["out"])],
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T", 4]),
            helper.make_tensor_value_info("tag", TensorProto.STRING, ["N"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.INT64, ["N", "T", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "ids.onnx"
    path.write_bytes(model.SerializeToString())
    # strings never reach TensorRT; an open inner axis is None (then no explicit profile)
    assert input_shapes(path) == [InputShape("ids", (None, 4))]
    assert profile_shapes(input_shapes(path), [1, 8]) == {}


def test_a_cuda_provider_without_cudnn_names_it_and_what_installs_it(tmp_path: Path) -> None:
    """onnxruntime-gpu on a host with only the driver and no NVIDIA wheels: the loader
    names the first library it lacks; the reason lists every one, and where they come from."""
    library = tmp_path / "libonnxruntime_providers_cuda.so"
    library.write_bytes(b"")
    absent = {"libcudnn.so.9", "libcublasLt.so.12"}

    def load(name: str) -> None:
        if name == str(library):
            raise OSError("libcublasLt.so.12: cannot open shared object file: No such file")
        if name in absent:
            raise OSError(f"{name}: cannot open shared object file")

    why = why_not_serving(CUDA, [CUDA, CPU], capi_dir=tmp_path, load=load, cuda=12)
    assert why.startswith(
        "its library libonnxruntime_providers_cuda.so cannot be loaded: libcublasLt.so.12: "
    )
    assert "; missing: libcublasLt.so.12, libcudnn.so.9 (CUDA 12 and cuDNN 9 come with " in why
    assert "onnxruntime-gpu[cuda,cudnn]" in why
    assert "tensorrt" not in why


def test_a_tensorrt_provider_without_tensorrt_says_what_to_install(tmp_path: Path) -> None:
    library = tmp_path / "libonnxruntime_providers_tensorrt.so"
    library.write_bytes(b"")

    def load(name: str) -> None:
        if name in (str(library), "libnvinfer.so.10", "libnvonnxparser.so.10"):
            raise OSError("libnvinfer.so.10: cannot open shared object file: No such file")

    why = why_not_serving(TENSORRT, ALL, capi_dir=tmp_path, load=load, cuda=12)
    assert "; missing: libnvinfer.so.10, libnvonnxparser.so.10 (TensorRT 10 is not installed: " in (
        why
    )
    assert "pip install 'tensorrt-cu12-libs==10.*'" in why
    assert "tensorrt_libs folder on LD_LIBRARY_PATH" in why
    assert "cuDNN" not in why


def test_an_unknown_cuda_major_lists_nothing_more(tmp_path: Path) -> None:
    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(b"not an ELF file")
    why = why_not_serving(CUDA, [CUDA, CPU], capi_dir=tmp_path)  # the CPU build: no CUDA major
    assert "missing:" not in why
