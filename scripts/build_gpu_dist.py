"""Build ``streamfer-gpu``: the same code as ``streamfer``, on ``onnxruntime-gpu``.

``onnxruntime`` and ``onnxruntime-gpu`` install the same ``onnxruntime`` package, so one
environment must hold exactly one of them. An extra cannot arrange that: pip resolves the
base requirements for ``streamfer[gpu]`` too, so ``onnxruntime`` comes along whatever the
extra adds (a marker such as ``extra != "gpu"`` does not help, and default extras, PEP 771,
are not implemented). The GPU build is therefore a second distribution made from this
checkout's pyproject.toml, the way onnxruntime/onnxruntime-gpu are: every ``onnxruntime``
requirement becomes ``onnxruntime-gpu``, self-references become ``streamfer-gpu[...]`` and
the rest (version, packages, scripts, extras) is copied as it is, then checked by parsing.

    python scripts/build_gpu_dist.py project build/streamfer-gpu  # the project, to pip install
    python scripts/build_gpu_dist.py wheel                         # dist/streamfer_gpu-*.whl
    python scripts/build_gpu_dist.py lock                          # constraints-gpu.txt
    python scripts/build_gpu_dist.py lock --check                  # exit 1 if it is stale

Standard library only (tomllib), so it runs in an image's build stage and in CI as is.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

__all__ = [
    "GPU_CUDA_MAJOR",
    "GPU_DISTRIBUTION",
    "GPU_RUNTIME",
    "GPU_RUNTIME_REQUIREMENT",
    "IMAGE_CUDA_MAJOR",
    "IMAGE_GPU_RUNTIME_VERSION",
    "gpu_lock",
    "gpu_pyproject",
    "main",
    "write_project",
]

ROOT = Path(__file__).resolve().parents[1]
CPU_DISTRIBUTION = "streamfer"
GPU_DISTRIBUTION = "streamfer-gpu"
CPU_RUNTIME = "onnxruntime"
GPU_RUNTIME = "onnxruntime-gpu"
# onnxruntime-gpu on PyPI (read from each release's metadata): 1.18 is built for CUDA 11.8,
# 1.19 to 1.26 for CUDA 12 with cuDNN 9, 1.27 and later for CUDA 13. From 1.21 on it has the
# extras `cuda` (nvidia-cuda-runtime, -nvrtc, -cufft, -curand) and `cudnn` (nvidia-cudnn,
# which brings nvidia-cublas), NVIDIA's runtime libraries as wheels, and
# onnxruntime.preload_dlls() to load them: a host with only the NVIDIA driver then serves
# on CUDA. The range is the CUDA 12 builds that have them: CUDA 12 runs on r535 and newer
# drivers (r580 included); the CUDA 13 builds would need r580+.
GPU_RUNTIME_FLOOR = (1, 21)
GPU_RUNTIME_CEILING = (1, 27)
GPU_RUNTIME_EXTRAS = "cuda,cudnn"
GPU_CUDA_MAJOR = 12
# Dockerfile.gpu's runtime: the newest of that range (12.8, cuDNN 9, TensorRT 10). The image
# takes CUDA and cuDNN from its nvidia/cuda base, so its lock holds no NVIDIA wheels.
IMAGE_GPU_RUNTIME_VERSION = "1.26.0"
IMAGE_CUDA_MAJOR = GPU_CUDA_MAJOR
GPU_RUNTIME_REQUIREMENT = (
    f"{GPU_RUNTIME}[{GPU_RUNTIME_EXTRAS}]>={'.'.join(map(str, GPU_RUNTIME_FLOOR))},"
    f"<{'.'.join(map(str, GPU_RUNTIME_CEILING))}"
)
LOCK_HEADER = (
    "# The GPU image's runtime dependencies (Dockerfile.gpu): constraints.txt with {cpu}\n"
    "# swapped for {gpu}=={version}, the newest {gpu} built for CUDA {cuda}.\n"
    "# Generated: python scripts/build_gpu_dist.py lock (tests/deploy check it is current).\n"
)

_REQUIREMENT = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<extras>\[[^\]]*\])?(?P<rest>.*)"
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _gpu_requirement(requirement: str) -> str:
    """``onnxruntime>=1.18; m`` -> ``onnxruntime-gpu[cuda,cudnn]>=1.21,<1.27; m`` (a CPU
    floor above 1.21 is kept); ``streamfer[demo]`` -> ``streamfer-gpu[demo]``; anything
    else as it is."""
    match = _REQUIREMENT.fullmatch(requirement.strip())
    if match is None:
        raise SystemExit(f"build_gpu_dist: cannot read the requirement {requirement!r}")
    name = _canonical(match["name"])
    if name == CPU_DISTRIBUTION:
        return f"{GPU_DISTRIBUTION}{match['extras'] or ''}{match['rest']}"
    if name != CPU_RUNTIME:
        return requirement
    spec, sep, marker = match["rest"].partition(";")
    floor = re.fullmatch(r"\s*>=\s*(\d+)\.(\d+)(?:\.\d+)?\s*", spec)
    if floor is None or match["extras"]:
        raise SystemExit(
            f"build_gpu_dist: {requirement!r}: expected '{CPU_RUNTIME}>=X.Y', the form this "
            "script knows how to carry over to the GPU runtime"
        )
    version = max((int(floor[1]), int(floor[2])), GPU_RUNTIME_FLOOR)
    if version >= GPU_RUNTIME_CEILING:
        raise SystemExit(
            f"build_gpu_dist: {requirement!r} is above the CUDA {GPU_CUDA_MAJOR} builds of "
            f"{GPU_RUNTIME} (below {'.'.join(map(str, GPU_RUNTIME_CEILING))}): move the range"
        )
    ceiling = ".".join(map(str, GPU_RUNTIME_CEILING))
    return f"{GPU_RUNTIME}[{GPU_RUNTIME_EXTRAS}]>={version[0]}.{version[1]},<{ceiling}{sep}{marker}"


def _expected(cpu: dict[str, Any]) -> dict[str, Any]:
    """What the GPU pyproject must parse to: the CPU one with only the intended changes."""
    gpu = copy.deepcopy(cpu)
    project = gpu["project"]
    project["name"] = GPU_DISTRIBUTION
    project["dependencies"] = [_gpu_requirement(r) for r in project["dependencies"]]
    extras = project.get("optional-dependencies", {})
    extras.pop("gpu", None)
    for name, requirements in extras.items():
        extras[name] = [_gpu_requirement(r) for r in requirements]
    return gpu


def gpu_pyproject(text: str) -> str:
    """The streamfer-gpu pyproject.toml made from streamfer's, edited as text (comments and
    layout kept) and then proved by parsing: it must equal the CPU one with the name, the
    runtime and the self-references changed and the ``gpu`` extra gone, and nothing else."""
    cpu = tomllib.loads(text)
    if cpu["project"]["name"] != CPU_DISTRIBUTION:
        raise SystemExit(f"build_gpu_dist: expected project.name = {CPU_DISTRIBUTION!r}")
    out, renamed = re.subn(
        r'^(name\s*=\s*)"streamfer"', rf'\1"{GPU_DISTRIBUTION}"', text, count=1, flags=re.M
    )
    out = re.sub(r"^gpu\s*=\s*\[[^\]\n]*\]\s*\n", "", out, flags=re.M)
    out = re.sub(
        r'"((?:onnxruntime|streamfer)(?:\[[^\]"]*\])?[^"]*)"',
        lambda m: '"' + _gpu_requirement(m[1]) + '"',
        out,
    )
    expected = _expected(cpu)
    got = tomllib.loads(out)
    if not renamed or got != expected:
        raise SystemExit(
            "build_gpu_dist: the edited pyproject.toml is not the intended one; "
            f"expected {expected['project']}, got {got['project']}"
        )
    return out


def write_project(target: Path, root: Path = ROOT, *, gpu: bool = True) -> Path:
    """Lay the streamfer-gpu project (or with ``gpu=False`` streamfer's own) out in
    ``target`` (replaced): its pyproject.toml, the readme and license, and copies of the
    packages, so ``pip install target`` builds it without writing into the checkout."""
    pyproject_text = (root / "pyproject.toml").read_text()
    cpu = tomllib.loads(pyproject_text)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / "pyproject.toml").write_text(gpu_pyproject(pyproject_text) if gpu else pyproject_text)
    for name in (cpu["project"]["readme"], "LICENSE"):
        if (root / name).is_file():
            shutil.copy2(root / name, target / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in sorted({p.split(".")[0] for p in cpu["tool"]["setuptools"]["packages"]}):
        shutil.copytree(root / package, target / package, ignore=ignore)
    return target


def _pins(text: str) -> list[tuple[str, str]]:
    """(canonical name, line) of each requirement line of a lock file."""
    pins = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name = re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0]
            pins.append((_canonical(name), line.strip()))
    return pins


def gpu_lock(cpu_lock: str) -> str:
    """constraints-gpu.txt from constraints.txt: the same pins, the CPU runtime's line
    replaced by the image's GPU runtime."""
    pins = _pins(cpu_lock)
    if CPU_RUNTIME not in {name for name, _ in pins}:
        raise SystemExit(f"build_gpu_dist: constraints.txt pins no {CPU_RUNTIME}")
    image = tuple(int(p) for p in IMAGE_GPU_RUNTIME_VERSION.split(".")[:2])
    if not GPU_RUNTIME_FLOOR <= image < GPU_RUNTIME_CEILING:
        raise SystemExit(
            f"build_gpu_dist: the image's {GPU_RUNTIME} {IMAGE_GPU_RUNTIME_VERSION} is outside "
            f"the range streamfer-gpu requires ({GPU_RUNTIME_REQUIREMENT})"
        )
    swap = f"{GPU_RUNTIME}=={IMAGE_GPU_RUNTIME_VERSION}"
    header = LOCK_HEADER.format(
        cpu=CPU_RUNTIME, gpu=GPU_RUNTIME, version=IMAGE_GPU_RUNTIME_VERSION, cuda=IMAGE_CUDA_MAJOR
    )
    return header + "".join(f"{swap if n == CPU_RUNTIME else line}\n" for n, line in pins)


def _wheel(dist: Path, build: Path | None) -> int:
    with tempfile.TemporaryDirectory(prefix="streamfer-gpu-") as tmp:
        project = write_project(build or Path(tmp) / "project")
        dist.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(project)]
        return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    project = sub.add_parser("project", help="write the streamfer-gpu project into a folder")
    project.add_argument("target", type=Path)
    wheel = sub.add_parser("wheel", help="build the streamfer-gpu wheel (pip wheel --no-deps)")
    wheel.add_argument("--dist", type=Path, default=ROOT / "dist", help="default: dist/")
    wheel.add_argument("--build", type=Path, help="keep the project here (default: a temp dir)")
    lock = sub.add_parser("lock", help="write constraints-gpu.txt from constraints.txt")
    lock.add_argument("--check", action="store_true", help="only check that it is current")
    args = parser.parse_args(argv)
    if args.command == "project":
        print(write_project(args.target))
        return 0
    if args.command == "wheel":
        return _wheel(args.dist, args.build)
    wanted = gpu_lock((ROOT / "constraints.txt").read_text())
    path = ROOT / "constraints-gpu.txt"
    if args.check:
        if not path.is_file() or path.read_text() != wanted:
            print(
                f"{path.name} is stale: run python scripts/build_gpu_dist.py lock", file=sys.stderr
            )
            return 1
        return 0
    path.write_text(wanted)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
