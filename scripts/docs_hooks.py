"""MkDocs hook: the reference pages are written from the code at every build, and the
benchmarks' charts and JSON join the site.

``mkdocs build`` and ``mkdocs serve`` call ``on_files``; the pages come from
``streamfer_dev.reference`` and exist only in the built site, never under ``docs/``. The
results log (``benchmarks/RESULTS.md``, included as ``docs/benchmarks/RESULTS.md``) links
its artefacts as ``results/...``, so ``benchmarks/results/`` is served at
``benchmarks/results/`` beside it, without a copy under ``docs/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from streamfer_dev.reference import PAGES


def on_files(files: Files, config: Any) -> Files:
    for path, write in PAGES.items():
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=write()))
    results = Path(config["config_file_path"]).parent / "benchmarks" / "results"
    for artefact in sorted(results.rglob("*")):
        if artefact.suffix in (".png", ".json"):
            uri = f"benchmarks/results/{artefact.relative_to(results).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(artefact)))
    return files
