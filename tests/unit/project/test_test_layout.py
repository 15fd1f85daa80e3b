"""The unit tests mirror the code: the tests of ``worker/<unit>/`` are in
``tests/unit/<unit>/``, those of ``benchmarks/`` in ``bench/``, of ``streamfer_dev/`` in
``dev/``, and the checks of the whole project in ``project/``. What tests share is a
fixture (``tests/unit/conftest.py``) or a fake (``tests/fakes/``): a test module never
imports another test module, so each can move, split or go without breaking another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNIT_TESTS = ROOT / "tests" / "unit"
FAKES = ROOT / "tests" / "fakes"

FOLDERS = {
    *(p.parent.name for p in (ROOT / "worker").glob("*/__init__.py")),
    *(p.stem for p in (ROOT / "worker").glob("*.py") if not p.stem.startswith("__")),
    "bench",
    "dev",
    "project",
}
"""A folder per unit of ``worker`` (``compose`` and ``errors`` are units too), and the
three beside them."""


def test_every_unit_test_sits_in_the_folder_of_what_it_tests() -> None:
    misplaced = [
        str(p.relative_to(UNIT_TESTS))
        for p in sorted(UNIT_TESTS.rglob("test_*.py"))
        if len(p.relative_to(UNIT_TESTS).parts) != 2 or p.parent.name not in FOLDERS
    ]
    assert not misplaced, f"place these in tests/unit/<unit>/ ({sorted(FOLDERS)}): {misplaced}"


def imported_test_modules(source: str, name: str) -> list[str]:
    """The test modules (``test_*``, ``conftest``) that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [base, *(f"{base}.{a.name}" for a in node.names)]
        found += [
            m for m in modules if m.split(".")[-1].startswith("test_") or "conftest" in m.split(".")
        ]
    return sorted(set(found))


@pytest.mark.parametrize(
    "path",
    sorted([*UNIT_TESTS.rglob("*.py"), *FAKES.rglob("*.py")]),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_test_module_imports_another(path: Path) -> None:
    imported = imported_test_modules(path.read_text(), str(path))
    assert not imported, f"import fakes from tests/fakes, fixtures from conftest: {imported}"


def test_the_check_sees_test_modules_and_conftest_however_imported() -> None:
    source = (
        "from tests.unit import test_pipeline as base\n"
        "from tests.unit.loop.test_threads import wait_for\n"
        "import tests.unit.conftest\n"
        "from tests.fakes.worker import FakeConsumer\n"
        "def f():\n"
        "    from conftest import MemoryStore\n"
    )
    assert imported_test_modules(source, "probe.py") == [
        "conftest",
        "conftest.MemoryStore",
        "tests.unit.conftest",
        "tests.unit.loop.test_threads",
        "tests.unit.test_pipeline",
    ]
