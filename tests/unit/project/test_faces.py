"""Each unit's face (``worker/<unit>/__init__.py``): every name of its ``__all__`` can be
imported from it, the names it hands out on first use (``worker.core.lazy``) included;
and the light paths (``import worker``, ``worker.cli`` and ``worker.config``, ``streamfer
--help``) load none of the heavy libraries a face could drag in.

``tests/unit/project/test_layers.py`` checks, from the source, that other units import only the
face; this imports it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "worker"
FACES = sorted(f"worker.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py"))

HEAVY = ["confluent_kafka", "numpy", "onnxruntime", "prometheus_client", "redis"]


@pytest.mark.parametrize("face", FACES)
def test_every_exported_name_imports_from_the_face(face: str) -> None:
    module = importlib.import_module(face)
    assert module.__all__, face
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{face} exports names it cannot give: {missing}"


def test_a_lazy_face_refuses_a_name_it_does_not_export() -> None:
    core = importlib.import_module("worker.core")
    with pytest.raises(AttributeError, match="no attribute 'tracker_of'"):
        getattr(core, "tracker_of")  # noqa: B009


def test_the_light_paths_load_no_heavy_library() -> None:
    probe = (
        "import contextlib, io, sys\n"
        "import worker, worker.cli, worker.config\n"
        "from worker.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
