"""MkDocs hook: the reference pages are written from the code at every build.

``mkdocs build`` and ``mkdocs serve`` call ``on_files``; the pages come from
``streamfer_dev.reference`` and exist only in the built site, never under ``docs/``.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from streamfer_dev.reference import PAGES


def on_files(files: Files, config: Any) -> Files:
    for path, write in PAGES.items():
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=write()))
    return files
