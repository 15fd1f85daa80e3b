"""A batch hook that kills its worker, for the share-group tests: a request whose id is
``POISON_ID`` ends the process at once (``os._exit``, as a segfault in a model would),
in whichever worker's batch it lands."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy.typing as npt

__all__ = ["POISON_ID", "prepare"]

POISON_ID = "poison"


def prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    if any(r.get("id") == POISON_ID for r in requests):
        os._exit(3)
    return dict(inputs)
