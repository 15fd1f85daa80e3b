"""What to type to install an extra that a command needs, in a form that works today.

``pip install 'streamfer[tools]'`` works only once streamfer is on the package index; the
requirements the extra stands for (``onnx>=1.15``) install from anywhere, and ``.[tools]``
does in a checkout. Both are read from the installed distribution's metadata, so the
message follows pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex

__all__ = ["extra_requirements", "install_command"]

_DISTRIBUTIONS = ("streamfer", "streamfer-gpu")


def extra_requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds to the installed streamfer (or streamfer-gpu), as
    pip takes them; empty when neither is installed with metadata."""
    marker = re.compile(rf"""^(.*?)\s*;\s*extra\s*==\s*["']{re.escape(extra)}["']\s*$""")
    for name in _DISTRIBUTIONS:
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found = [m.group(1) for r in requires if (m := marker.match(r))]
        return [r for r in found if not r.startswith(_DISTRIBUTIONS)]
    return []


def install_command(extra: str) -> str:
    """``pip install 'onnx>=1.15' (or, in a streamfer checkout, pip install '.[tools]')``."""
    checkout = f"pip install '.[{extra}]'"
    requirements = extra_requirements(extra)
    if not requirements:
        return f"{checkout} in a streamfer checkout"
    named = " ".join(shlex.quote(r) for r in requirements)
    return f"pip install {named} (or, in a streamfer checkout, {checkout})"
