"""The layer order of ``worker``: every import (lazy ones too) runs down, never up or
sideways, so the tree shows the architecture and ``docs/architecture.md`` stays true;
another unit is reached only through its face (``worker.<unit>``, the names of its
``__all__``); and no runtime module imports the dev package ``streamfer_dev`` (its
``demo`` command reaches the command line as a plug-in, ``worker.cli.plugins``). The code
beside the runtime, ``benchmarks/`` and the dev package, uses ``worker`` as any other
program does: through the units' faces only.

Read from the source with ``ast``, not by importing: a lazy import inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "worker"

LAYERS: list[set[str]] = [
    {"errors"},
    {"core"},
    {"config"},
    {"kafka", "inference", "features", "ops", "registry"},
    {"cache"},
    {"pipeline"},
    {"models"},
    {"delivery"},
    {"loop"},
    {"compose"},
    {"tools"},
    {"replay"},
    {"cli"},
    {"__init__", "__main__"},
]
"""Lowest first. A unit may import its own unit and any unit of a lower layer; units of
one layer never import each other."""

RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

TOP_LEVEL = {"__init__", "__main__", "errors", "compose"}
"""The modules ``worker/`` holds directly (besides the ``cli`` package); everything else
lives in a subpackage."""


def unit_of(module: str) -> str:
    """``worker.kafka.sink`` -> ``kafka``; ``worker.cli`` -> ``cli``; ``worker`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


DEV_PACKAGE = "streamfer_dev"


def import_pairs(path: Path, name: str | None = None) -> set[tuple[str, str | None]]:
    """What ``path`` (module ``name``) imports, anywhere in its code, relative imports
    resolved: ``from m import n`` is ``(m, n)``, ``import m`` is ``(m, None)``."""
    tree = ast.parse(path.read_text(), str(path))
    package = (name or module_name(path)).split(".")
    if path.name != "__init__.py":
        package.pop()
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.update((base, a.name) for a in node.names)
    return found


def imports(path: Path, name: str | None = None) -> set[str]:
    """Every module, package or name that ``path`` (module ``name``) imports, anywhere in
    its code, relative imports resolved."""
    found: set[str] = set()
    for module, imported_name in import_pairs(path, name):
        found.add(module)
        if imported_name is not None:
            found.add(f"{module}.{imported_name}")
    return found


def imported(path: Path, name: str | None = None) -> set[str]:
    """Every ``worker`` module or package that ``path`` (module ``name``) imports,
    anywhere in its code."""
    return {m for m in imports(path, name) if m == "worker" or m.startswith("worker.")}


def dev_imports(path: Path, name: str | None = None) -> list[str]:
    """What ``path`` imports of the dev package, and every string of it that names one of
    its modules (``importlib.import_module("streamfer_dev.demo")``, an entry point)."""
    tree = ast.parse(path.read_text(), str(path))
    strings = {
        node.value.split(":")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    found = imports(path, name) | strings
    return sorted(m for m in found if m == DEV_PACKAGE or m.startswith(f"{DEV_PACKAGE}."))


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in MODULES}
    assert units == set(RANK), units ^ set(RANK)


def test_worker_holds_only_the_package_face_and_the_entry_points_directly() -> None:
    direct = {p.stem for p in PACKAGE.glob("*.py")}
    assert direct == TOP_LEVEL


def is_module(target: str) -> bool:
    """A module or package of ``worker``, not a name imported from one."""
    path = PACKAGE.parent / target.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").exists()


def wrong_way(name: str, targets: set[str]) -> list[str]:
    """The imports of module ``name`` that run up the layers or sideways."""
    own = unit_of(name)
    return sorted(
        t for t in targets if is_module(t) and unit_of(t) != own and RANK[unit_of(t)] >= RANK[own]
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_run_down_the_layers(path: Path) -> None:
    name = module_name(path)
    upward = wrong_way(name, imported(path))
    assert not upward, f"{name} ({unit_of(name)}) imports upward or sideways: {upward}"


def test_no_import_cycle_between_modules() -> None:
    names = {module_name(p): p for p in MODULES}
    graph = {
        name: {t for t in imported(path) if t in names and t != name}
        for name, path in names.items()
    }
    done: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> None:
        if node in stack:
            cycle = [*stack[stack.index(node) :], node]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)


def test_the_check_sees_lazy_relative_and_sideways_imports(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "from . import sink\n"
        "from worker.core.job import Job\n"
        "def f():\n"
        "    from worker.loop.worker import Worker\n"
        "    import worker.ops.metrics\n"
    )
    found = imported(module, "worker.kafka.probe")
    assert wrong_way("worker.kafka.probe", found) == ["worker.loop.worker", "worker.ops.metrics"]
    assert "worker.kafka.sink" in found


def face_name(unit: str) -> str:
    """The module other units import ``unit`` through: ``worker.<unit>``, or ``worker``."""
    return "worker" if unit == "__init__" else f"worker.{unit}"


def exported(unit: str) -> set[str]:
    """The names in the ``__all__`` of ``unit``'s face (a package's ``__init__.py``, or
    the module itself for ``errors`` and ``compose``), read with ``ast``."""
    package = PACKAGE if unit == "__init__" else PACKAGE / unit
    face = package / "__init__.py" if package.is_dir() else package.with_suffix(".py")
    if not face.exists():
        return set()
    for node in ast.parse(face.read_text(), str(face)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def past_the_face(name: str, pairs: set[tuple[str, str | None]]) -> list[str]:
    """The imports of module ``name`` that go around a face: a module of another unit
    deeper than ``worker.<unit>``, a name its face's ``__all__`` does not hold, or its own
    unit's face (siblings import each other by module path; the face imports them)."""
    own = unit_of(name)
    found = set()
    for module, imported_name in pairs:
        if module != "worker" and not module.startswith("worker."):
            continue
        unit = unit_of(module)
        if unit == own:
            if module == face_name(own) and name != module:
                found.add(module if imported_name is None else f"{module}.{imported_name}")
        elif module != face_name(unit):
            found.add(module)
        elif imported_name is not None and imported_name not in exported(unit):
            found.add(f"{module}.{imported_name}")
    return sorted(found)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_other_units_are_imported_through_their_face(path: Path) -> None:
    name = module_name(path)
    around = past_the_face(name, import_pairs(path))
    assert not around, f"{name} goes around a face (import the unit's __all__): {around}"


def test_every_subpackage_face_has_an_all() -> None:
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert [unit for unit in packages if not exported(unit)] == []


def test_the_face_check_sees_private_modules_and_unexported_names(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from worker.kafka import Sink, sink\n"
        "from worker.kafka.source import Source\n"
        "from worker.errors import ConfigError, log\n"
        "from worker.loop.threads import StageThreads\n"
        "from worker.loop import Worker\n"
        "if TYPE_CHECKING:\n"
        "    from worker.config import Frozen\n"
        "def f():\n"
        "    import worker.core.job\n"
        "    from ..pipeline.steps import Pipeline\n"
    )
    found = past_the_face("worker.loop.probe", import_pairs(module, "worker.loop.probe"))
    assert found == [
        "worker.config.Frozen",
        "worker.core.job",
        "worker.errors.log",
        "worker.kafka.sink",
        "worker.kafka.source",
        "worker.loop.Worker",
        "worker.pipeline.steps",
    ]


BESIDE = sorted(
    path
    for folder in ("benchmarks", DEV_PACKAGE)
    for path in (PACKAGE.parent / folder).rglob("*.py")
)
"""The benchmarks and the dev package: programs that use ``worker``, not parts of it."""

PATCHED_IN_PLACE = {"streamfer_dev.injected_aborts": {"worker.kafka.transactions"}}
"""Modules beside the runtime that reach past a face on purpose, with what they reach: the
fault harness replaces the producer class ``worker.kafka.transactions`` builds (the worker
has no switch for injected aborts), so it names that module."""


def beside_name(path: Path) -> str:
    """``benchmarks/run.py`` -> ``benchmarks.run``; ``streamfer_dev/__init__.py`` ->
    ``streamfer_dev``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def around_the_faces(pairs: set[tuple[str, str | None]]) -> list[str]:
    """The imports of a program beside ``worker`` that go around a face: a module deeper
    than ``worker.<unit>``, or a name its face's ``__all__`` does not hold."""
    found = set()
    for module, imported_name in pairs:
        if module != "worker" and not module.startswith("worker."):
            continue
        unit = unit_of(module)
        if module != face_name(unit):
            found.add(module)
        elif imported_name is not None and imported_name not in exported(unit):
            found.add(f"{module}.{imported_name}")
    return sorted(found)


@pytest.mark.parametrize("path", BESIDE, ids=beside_name)
def test_benchmarks_and_the_dev_package_import_only_faces(path: Path) -> None:
    name = beside_name(path)
    around = set(around_the_faces(import_pairs(path, name)))
    allowed = PATCHED_IN_PLACE.get(name, set())
    assert allowed <= around, f"{name} no longer reaches {sorted(allowed - around)}: drop it"
    assert not around - allowed, f"{name} goes around a face: {sorted(around - allowed)}"


def test_the_check_beside_worker_sees_private_modules_and_unexported_names(
    tmp_path: Path,
) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "import worker\n"
        "import worker.kafka.transactions\n"
        "from worker.kafka import Sink, sink\n"
        "from worker.replay.run import Replay\n"
        "def f():\n"
        "    from worker.ops.logs import setup_logging\n"
        "    from worker.ops import setup_logging\n"
        "    from worker.errors import ConfigError\n"
    )
    found = around_the_faces(import_pairs(module, "benchmarks.replay"))
    assert found == [
        "worker.kafka.sink",
        "worker.kafka.transactions",
        "worker.ops.logs",
        "worker.replay.run",
    ]


def test_the_runtime_never_imports_the_dev_package() -> None:
    found = {module_name(p): dev_imports(p) for p in MODULES}
    assert not {name: dev for name, dev in found.items() if dev}


def test_the_check_sees_lazy_imports_of_the_dev_package(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "import importlib\n"
        "def f():\n"
        "    from streamfer_dev.demo import run_demo\n"
        "    import streamfer_dev\n"
        "    return importlib.import_module('streamfer_dev.stack')\n"
    )
    assert dev_imports(module, "worker.cli.probe") == [
        "streamfer_dev",
        "streamfer_dev.demo",
        "streamfer_dev.demo.run_demo",
        "streamfer_dev.stack",
    ]
