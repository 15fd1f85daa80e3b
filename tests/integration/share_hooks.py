"""Batch hooks for the share-group tests: ``prepare`` ends the process at once
(``os._exit``, as a segfault in a model would) in whichever worker's batch a request whose
id is ``POISON_ID`` lands; ``slow_prepare`` takes ``SLOW_S`` per batch, so that a worker
always holds records when it is killed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy.typing as npt

__all__ = ["POISON_ID", "SLOW_S", "prepare", "slow_prepare"]

POISON_ID = "poison"
SLOW_S = 0.05


def prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    if any(r.get("id") == POISON_ID for r in requests):
        os._exit(3)
    return dict(inputs)


def slow_prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    time.sleep(SLOW_S)
    return dict(inputs)
