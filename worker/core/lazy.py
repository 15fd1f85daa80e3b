"""Names a package face hands out on first use, for faces whose light callers must not
pay for a heavy module (``confluent_kafka``, ``numpy``) they never touch.

A face lists such names in ``__all__`` and, for the type checker and the layer test,
under ``if TYPE_CHECKING:``; ``__getattr__ = lazy_names(__name__, {...})`` imports the
module a name lives in when the name is first asked for. Nothing is cached in the face,
so the name always reads what its own module holds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``name`` is read from the module
    ``package.homes[name]``, imported then; any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    return __getattr__
