"""Importing what a config names as ``package.module:attribute`` (hooks, a Protobuf
message class): one error that names the field and why."""

from __future__ import annotations

import importlib
from typing import Any

from worker.errors import ConfigError

__all__ = ["import_target"]


def import_target(target: str, field: str) -> Any:
    """The attribute ``target`` names, or None when the module lacks it. Raises
    ConfigError naming ``field`` when the module does not import."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs the user's module: anything may fail
        raise ConfigError(
            f"{field}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); it must "
            "be installed or on PYTHONPATH"
        ) from exc
    return getattr(module, attr, None)
