"""A batch's outputs as the rows a result publishes: one ``{field: value}`` dict per row.

The pipeline encodes these inside each result; the output cache encodes the same dicts
on their own and keeps the bytes, so a cached row publishes exactly what the model's
row would have. Both build them here, once per batch: each output array is turned into
Python values with one ``tolist`` and zipped, and rows the model answered with NaN or
infinity are found with one numpy pass per output.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["finite_rows", "row_outputs"]


def finite_rows(outputs: Mapping[str, npt.NDArray[Any]], n: int) -> npt.NDArray[np.bool_]:
    """Which of the ``n`` rows hold only finite numbers in every float output."""
    finite = np.ones(n, dtype=np.bool_)
    for values in outputs.values():
        if values.dtype.kind == "f":
            finite &= np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    return finite


def row_outputs(outputs: Mapping[str, npt.NDArray[Any]], n: int) -> Iterable[dict[str, Any]]:
    """Each of the ``n`` rows' result fields, in output order."""
    names = list(outputs)
    cols = [values.tolist() for values in outputs.values()]
    if not cols:
        return itertools.repeat({}, n)
    if len(cols) == 1:
        single = names[0]
        return [{single: v} for v in cols[0]]
    if len(cols) == 2:  # a classifier's label and scores: a literal, 3x dict(zip(...))'s speed
        first, second = names
        return [{first: a, second: b} for a, b in zip(cols[0], cols[1], strict=True)]
    return [dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)]
