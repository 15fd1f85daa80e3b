"""A model given as a directory of numbered versions: ``models/fraud/3/model.onnx``.

A version is a sub-directory whose name is a whole number and which holds a file called
``model.onnx``; any other entry (``latest``, ``3.tmp``, a folder still without its
file) is not a version and is ignored, so a new version can be prepared beside the live
ones and made visible with one rename. The worker serves the highest version, or the one
the config pins with ``version``; ``worker.models.reloader`` looks again while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker.errors import ConfigError

__all__ = ["MODEL_FILE", "ModelVersion", "list_versions", "resolve_version"]

MODEL_FILE = "model.onnx"
"""The file each version directory holds."""


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One version directory: its name as written (results carry it), its number (what
    orders versions) and its model file."""

    name: str
    number: int
    path: Path


def list_versions(directory: Path) -> list[ModelVersion]:
    """The versions in ``directory``, lowest first; empty when it cannot be read. Two
    names of one number (``3`` and ``03``) keep the one that sorts first as text."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    found: dict[int, ModelVersion] = {}
    for entry in entries:
        name = entry.name
        if not (name.isascii() and name.isdigit()):
            continue
        model = entry / MODEL_FILE
        if model.is_file():
            found.setdefault(int(name), ModelVersion(name, int(name), model))
    return [found[n] for n in sorted(found)]


def resolve_version(directory: Path, pinned: str | None, *, field: str) -> ModelVersion:
    """The highest version in ``directory``, or the ``pinned`` one. Raises ConfigError
    naming ``field`` (``pipelines[0].model.path`` or ``.version``) and the directory when
    there is none, or no version ``pinned``."""
    versions = list_versions(directory)
    if pinned is None:
        if not versions:
            raise ConfigError(
                f"{field}: {directory} is a directory but holds no model version (a "
                f"sub-directory named by a whole number, holding {MODEL_FILE})"
            )
        return versions[-1]
    text = pinned.strip()
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(
            f"{field}: {pinned!r} is not a version of {directory}: versions are whole "
            "numbers (the names of its sub-directories)"
        )
    for version in versions:
        if version.number == int(text):
            return version
    there = ", ".join(v.name for v in versions) or "none"
    raise ConfigError(
        f"{field}: no version {pinned} in {directory} (with a {MODEL_FILE}); versions there: "
        f"{there}"
    )
