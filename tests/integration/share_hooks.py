"""Batch hooks for the share-group tests: ``prepare`` ends the process at once
(``os._exit``, as a segfault in a model would) in whichever worker's batch a request whose
id is ``POISON_ID`` lands; ``slow_prepare`` takes ``SLOW_S`` per batch (``SLOW_S_ENV``
sets another time for one worker), so that a worker always holds records when it is
killed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy.typing as npt

__all__ = ["POISON_ID", "SLOW_S", "SLOW_S_ENV", "prepare", "slow_prepare"]

POISON_ID = "poison"
SLOW_S = 0.05
SLOW_S_ENV = "SHARE_HOOKS_SLOW_S"


def prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    if any(r.get("id") == POISON_ID for r in requests):
        os._exit(3)
    return dict(inputs)


def slow_prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    time.sleep(float(os.environ.get(SLOW_S_ENV, SLOW_S)))
    return dict(inputs)
