"""Rows of model inputs read from a CSV file: what ``streamfer model optimize``
calibrates and compares on.

The file has a header row, then one example per row. Its columns fill the model's
inputs in the model's input order, each input taking its width: one column for a
``[batch]`` input, ``W`` for a ``[batch, W]`` one, and whatever is left for the one
input whose width the model leaves open. Numeric inputs parse as finite numbers
(integral for integer inputs), bool inputs as 0/1/true/false, and string inputs take the
text as it is. A wrong column count or a cell that does not parse raises a
``ConfigError`` naming the file, line and column, before any model is converted.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.errors import ConfigError
from worker.inference import TensorInput

__all__ = ["ModelRows", "read_model_rows"]

Feeds = dict[str, npt.NDArray[Any]]

_BOOLS = {"0": False, "1": True, "false": False, "true": True}


@dataclass(frozen=True, slots=True)
class ModelRows:
    """One array per model input, all with ``count`` rows, ready to feed."""

    feeds: Feeds
    count: int

    def take(self, rows: npt.NDArray[np.intp]) -> ModelRows:
        return ModelRows({k: v[rows] for k, v in self.feeds.items()}, len(rows))

    def split_every(self, n: int) -> tuple[ModelRows, ModelRows]:
        """(the other rows, every ``n``-th row): the ``n``-th, ``2n``-th ... are held out."""
        index = np.arange(self.count)
        held = index % n == n - 1
        return self.take(index[~held]), self.take(index[held])

    def batches(self, size: int) -> Iterator[Feeds]:
        for start in range(0, self.count, size):
            yield {k: v[start : start + size] for k, v in self.feeds.items()}

    def tiled(self, size: int) -> Feeds:
        """``size`` rows, cycling through these ones: a full batch from fewer rows."""
        index = np.arange(size) % self.count
        return {k: v[index] for k, v in self.feeds.items()}


def read_model_rows(path: Path, inputs: Sequence[TensorInput]) -> ModelRows:
    """Read ``path`` into arrays for ``inputs``; raises ConfigError naming what is wrong."""
    header, lines, cells = _read_csv(path)
    widths = _widths(path, inputs, len(header))
    feeds: Feeds = {}
    start = 0
    for spec, width in zip(inputs, widths, strict=True):
        block = cells[:, start : start + width]
        values = _parse(path, spec, block, lines, header, start)
        feeds[spec.name] = values.reshape(len(lines)) if spec.rank == 1 else values
        start += width
    return ModelRows(feeds, len(lines))


def _read_csv(path: Path) -> tuple[list[str], list[int], npt.NDArray[np.str_]]:
    """(header, the line number of each row, the cells as a text matrix)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise ConfigError(f"{path}: the file is empty (a header row comes first)")
            for record in reader:
                if not record:
                    continue
                if len(record) != len(header):
                    raise ConfigError(
                        f"{path}: line {reader.line_num} has {len(record)} columns, "
                        f"the header has {len(header)}"
                    )
                rows.append(record)
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: cannot read it as CSV: {exc}") from exc
    if not rows:
        raise ConfigError(f"{path}: no rows after the header")
    return header, lines, np.array(rows, dtype=str).reshape(len(rows), len(header))


def _widths(path: Path, inputs: Sequence[TensorInput], columns: int) -> list[int]:
    """How many CSV columns each input takes; the one open width takes the rest."""
    for spec in inputs:
        if spec.dtype is None:
            raise ConfigError(f"input {spec.name!r} is {spec.onnx_type}, which rows cannot fill")
        if spec.rank not in (1, 2):
            raise ConfigError(
                f"input {spec.name!r} has rank {spec.rank}; CSV rows fill [batch] or "
                "[batch, width] inputs only"
            )
    fixed = sum(spec.width or 0 for spec in inputs)
    open_ = [spec.name for spec in inputs if spec.width is None]
    if len(open_) > 1:
        raise ConfigError(
            f"inputs {open_} all leave their width open: cannot tell how the {columns} "
            f"columns of {path} divide between them"
        )
    if (open_ and columns <= fixed) or (not open_ and columns != fixed):
        described = ", ".join(spec.describe() for spec in inputs)
        raise ConfigError(
            f"{path}: the header has {columns} columns; the model's inputs ({described}) "
            f"take {fixed}{' and at least one more' if open_ else ''}"
        )
    return [spec.width or columns - fixed for spec in inputs]


def _parse(
    path: Path,
    spec: TensorInput,
    block: npt.NDArray[np.str_],
    lines: list[int],
    header: list[str],
    first_column: int,
) -> npt.NDArray[Any]:
    """The cells of one input as its dtype; the whole block at once, and only when that
    fails cell by cell, to name the first bad one."""
    assert spec.dtype is not None
    kind = spec.dtype.kind

    def bad(row: int, column: int, why: str) -> ConfigError:
        where = first_column + column
        return ConfigError(
            f"{path}: line {lines[row]}, column {where + 1} ({header[where]!r}): "
            f"{block[row, column][:32]!r} {why} (input {spec.name!r} is {spec.onnx_type})"
        )

    if kind == "O":
        return block.astype(object)
    if kind == "b":
        lowered = np.char.lower(np.char.strip(block))
        known = np.isin(lowered, list(_BOOLS))
        if not known.all():
            r, c = (int(i) for i in np.argwhere(~known)[0])
            raise bad(r, c, "is not a bool (0, 1, true or false)")
        return np.isin(lowered, ["1", "true"])
    try:
        numbers = block.astype(np.float64)
    except ValueError:
        for (r, c), text in np.ndenumerate(block):
            try:
                float(text)
            except ValueError:
                raise bad(r, c, "is not a number") from None
        raise
    finite = np.isfinite(numbers)
    if not finite.all():
        r, c = (int(i) for i in np.argwhere(~finite)[0])
        raise bad(r, c, "is not finite")
    if kind in "iu":
        info = np.iinfo(spec.dtype)
        fits = (numbers == np.round(numbers)) & (numbers >= info.min) & (numbers <= info.max)
        if not fits.all():
            r, c = (int(i) for i in np.argwhere(~fits)[0])
            raise bad(r, c, f"is not an integer that fits {spec.dtype}")
    return numbers.astype(spec.dtype)
