"""The two images' Dockerfiles read as instructions, and the GPU build script as a module,
for the deployment and packaging tests (no Docker here: the files are linted)."""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

__all__ = ["CPU", "DOCKERFILES", "GPU", "ROOT", "gpu_dist", "instructions", "stages"]

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "Dockerfile"
GPU = ROOT / "Dockerfile.gpu"
DOCKERFILES = {"cpu": CPU, "gpu": GPU}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Stage name (or its index) -> its instructions, FROM first; the final stage is also
    under ``""``. Global ARGs before the first FROM are under ``"global"``."""
    found: dict[str, list[tuple[str, str]]] = {"global": []}
    current = found["global"]
    for word, rest in instructions(path):
        if word == "FROM":
            words = rest.split()
            named = len(words) > 2 and words[1].upper() == "AS"
            current = found.setdefault(words[2] if named else str(len(found) - 1), [])
        current.append((word, rest))
    found[""] = found[list(found)[-1]]
    return found


@cache
def gpu_dist() -> ModuleType:
    """scripts/build_gpu_dist.py (not a package: a script the images run)."""
    path = ROOT / "scripts" / "build_gpu_dist.py"
    spec = importlib.util.spec_from_file_location("build_gpu_dist", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look modules up by name
    spec.loader.exec_module(module)
    return module
