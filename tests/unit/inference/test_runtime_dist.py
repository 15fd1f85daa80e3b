"""runtime_dist: which ONNX Runtime distribution provides ``onnxruntime``, and the exact
commands when two do (or when streamfer and streamfer-gpu both provide ``worker``)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from worker.inference.runtime_dist import (
    gpu_install_hint,
    installed_owners,
    runtime_distribution,
    runtime_problem,
)

PY = "/opt/venv/bin/python"


def owners(runtimes: dict[str, str], workers: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    return {"onnxruntime": list(runtimes.items()), "worker": list(workers.items())}


def commands(message: str) -> list[str]:
    return [line.strip().split("  (")[0] for line in message.splitlines() if line.startswith("  ")]


@pytest.mark.parametrize("runtime", ["onnxruntime", "onnxruntime-gpu"])
@pytest.mark.parametrize("dist", ["streamfer", "streamfer-gpu", None])
def test_one_owner_each_is_no_problem(runtime: str, dist: str | None) -> None:
    found = owners({runtime: "1.26.0"}, {dist: "0.1.0"} if dist else {})
    assert runtime_problem(found, PY) is None
    assert runtime_distribution(found) == (runtime, "1.26.0")


def test_both_runtimes_under_streamfer_give_the_switch_to_streamfer_gpu_and_the_cpu_way() -> None:
    found = owners({"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.26.0"}, {"streamfer": "0.1.0"})
    message = runtime_problem(found, PY)
    assert message is not None
    assert "onnxruntime 1.32.0 and onnxruntime-gpu 1.26.0 are both installed" in message
    assert "'onnxruntime' package" in message and "CUDA" in message
    assert commands(message) == [
        f"{PY} -m pip uninstall -y streamfer onnxruntime",
        f"{PY} -m pip install --force-reinstall --no-deps onnxruntime-gpu==1.26.0",
        f"{PY} -m pip install streamfer-gpu==0.1.0",
        f"{PY} -m pip uninstall -y onnxruntime-gpu",
        f"{PY} -m pip install --force-reinstall --no-deps onnxruntime==1.32.0",
    ]
    assert message.index("For the GPU") < message.index("For the CPU runtime only")
    assert "build_gpu_dist.py wheel" in message
    assert runtime_distribution(found) is None


def test_both_runtimes_under_streamfer_gpu_keep_the_gpu_one_only() -> None:
    found = owners(
        {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.26.0"}, {"streamfer-gpu": "0.1.0"}
    )
    message = runtime_problem(found, PY)
    assert message is not None
    assert commands(message) == [
        f"{PY} -m pip uninstall -y onnxruntime",
        f"{PY} -m pip install --force-reinstall --no-deps onnxruntime-gpu==1.26.0",
    ]
    assert "CPU runtime only" not in message


def test_streamfer_and_streamfer_gpu_both_installed_are_named() -> None:
    found = owners({"onnxruntime-gpu": "1.26.0"}, {"streamfer": "0.1.0", "streamfer-gpu": "0.2.0"})
    message = runtime_problem(found, PY)
    assert message is not None
    assert "streamfer 0.1.0 and streamfer-gpu 0.2.0 are both installed" in message
    assert "'worker' package" in message
    assert commands(message) == [
        f"{PY} -m pip uninstall -y streamfer streamfer-gpu",
        f"{PY} -m pip install streamfer-gpu==0.2.0",
    ]
    # with the CPU runtime the CPU distribution is the one to keep
    cpu = runtime_problem(owners({"onnxruntime": "1.32.0"}, dict(found["worker"])), PY)
    assert cpu is not None and commands(cpu)[-1] == f"{PY} -m pip install streamfer==0.1.0"


def test_other_onnxruntime_builds_clash_too_and_the_special_build_is_kept() -> None:
    found = owners({"onnxruntime": "1.32.0", "onnxruntime-openvino": "1.23.0"}, {})
    message = runtime_problem(found, PY)
    assert message is not None and "onnxruntime-openvino 1.23.0" in message
    assert commands(message) == [
        f"{PY} -m pip uninstall -y onnxruntime",
        f"{PY} -m pip install --force-reinstall --no-deps onnxruntime-openvino==1.23.0",
    ]


def test_gpu_install_hint_says_what_to_install() -> None:
    cpu = owners({"onnxruntime": "1.32.0"}, {"streamfer": "0.1.0"})
    assert commands(gpu_install_hint(cpu, PY)) == [
        f"{PY} -m pip uninstall -y streamfer onnxruntime",
        f"{PY} -m pip install streamfer-gpu==0.1.0",
    ]
    checkout = owners({"onnxruntime": "1.32.0"}, {})
    assert commands(gpu_install_hint(checkout, PY)) == [
        f"{PY} -m pip uninstall -y onnxruntime",
        f"{PY} -m pip install onnxruntime-gpu",
    ]
    gpu = owners({"onnxruntime-gpu": "1.26.0"}, {"streamfer-gpu": "0.1.0"})
    assert "libraries (CUDA, cuDNN or TensorRT)" in gpu_install_hint(gpu, PY)
    both = owners({"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.26.0"}, {})
    assert gpu_install_hint(both, PY) == runtime_problem(both, PY)


def fake_distribution(site: Path, name: str, version: str, top_level: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{top_level}\n")


def test_installed_owners_reads_the_installed_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = installed_owners()
    assert runtime_problem(real) is None, "this environment itself has a clash"
    name, version = runtime_distribution(real) or ("", "")
    assert name in {"onnxruntime", "onnxruntime-gpu"}
    assert version == importlib.metadata.version(name)

    fake_distribution(tmp_path, "onnxruntime_gpu", "9.9.0", "onnxruntime")
    fake_distribution(tmp_path, "streamfer-gpu", "9.8.0", "worker")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = installed_owners()
    assert ("onnxruntime-gpu", "9.9.0") in found["onnxruntime"]
    assert ("streamfer-gpu", "9.8.0") in found["worker"]
    message = runtime_problem(found, PY)
    assert message is not None and "onnxruntime-gpu 9.9.0" in message
