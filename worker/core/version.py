"""The release this code is: stamped on results, dead letters and ``--version``.

A module of its own so that what stamps it never imports the package face (which loads
the worker lazily) and closes a cycle through it."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
"""Kept equal to pyproject's ``version`` (tests/deploy checks it)."""
