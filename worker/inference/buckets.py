"""Batch-size buckets: the few batch sizes a model is warmed at, and every batch run at one.

A GPU provider pays for each new input shape it sees: cuDNN searches its kernels, the
CUDA arena grows, TensorRT builds (or rebuilds) an engine. With ``pad_to_buckets`` a batch
of ``n`` rows runs at the smallest warmed size ``>= n`` (``warm_up_sizes``: the powers of
two up to ``max_batch_size``, and it), padded with copies of its own first row (always a
row the model accepts, strings too), and the outputs are cut back to ``n`` rows; a batch
larger than the largest size is run in slices of that size. So after warm-up no new shape
reaches the device. ``PaddedFeeds`` keeps one buffer per bucket and input, reused batch
after batch; it is called from one thread (the engine's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Buckets", "PaddedFeeds", "rows_of"]

Array = npt.NDArray[Any]
Allocate = Callable[[tuple[int, ...], "np.dtype[Any]"], Array]


class Buckets:
    """Sorted distinct batch sizes; ``bucket(n)`` is the smallest that holds ``n`` rows."""

    __slots__ = ("_of", "largest", "sizes")

    def __init__(self, sizes: Iterable[int]) -> None:
        self.sizes: tuple[int, ...] = tuple(sorted(set(sizes)))
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"bucket sizes must be positive, got {self.sizes}")
        self.largest = self.sizes[-1]
        # n -> its bucket, for every n up to the largest: one list index per batch
        of = [0] * (self.largest + 1)
        size = iter(self.sizes)
        current = next(size)
        for n in range(1, self.largest + 1):
            if n > current:
                current = next(size)
            of[n] = current
        self._of = of

    def bucket(self, rows: int) -> int:
        """The size a batch of ``rows`` (1 .. largest) runs at."""
        return self._of[rows]

    def spans(self, rows: int) -> list[tuple[int, int]]:
        """``[start, stop)`` slices of at most ``largest`` rows covering ``rows``."""
        step = self.largest
        return [(start, min(start + step, rows)) for start in range(0, rows, step)]

    def __repr__(self) -> str:
        return f"Buckets({list(self.sizes)})"


def _empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
    return np.empty(shape, dtype=dtype)


class PaddedFeeds:
    """One reusable buffer per bucket and input; ``fill`` copies a batch into its
    bucket's buffers and pads the rest with the batch's first row.

    ``allocate(shape, dtype)`` makes each buffer (``worker.inference.device_io`` passes one that
    hands out pinned host memory); a buffer is made the first time its bucket is used,
    which warm-up does for every bucket before the worker serves.
    """

    __slots__ = ("_allocate", "_buffers", "buckets")

    def __init__(self, buckets: Buckets, allocate: Allocate = _empty) -> None:
        self.buckets = buckets
        self._allocate = allocate
        self._buffers: dict[int, dict[str, Array]] = {}

    def buffers(self, size: int, like: Mapping[str, Array]) -> dict[str, Array]:
        """The buffers of bucket ``size``, shaped as ``like``'s arrays with ``size`` rows."""
        held = self._buffers.get(size)
        if held is None:
            held = {name: self._allocate((size, *a.shape[1:]), a.dtype) for name, a in like.items()}
            self._buffers[size] = held
        return held

    def fill(self, feeds: Mapping[str, Array], rows: int) -> tuple[int, dict[str, Array]]:
        """Copy ``rows`` rows (at most the largest bucket) into their bucket's buffers;
        rows past them repeat row 0, so nothing from an earlier batch stays behind."""
        size = self.buckets.bucket(rows)
        held = self.buffers(size, feeds)
        for name, values in feeds.items():
            buf = held[name]
            if buf.shape[1:] != values.shape[1:] or buf.dtype != values.dtype:
                buf = self._allocate((size, *values.shape[1:]), values.dtype)
                held[name] = buf
            buf[:rows] = values
            if rows < size:
                buf[rows:] = values[:1]
        return size, held


def rows_of(values: Sequence[Any] | Array, rows: int, size: int) -> Any:
    """The first ``rows`` rows of one output of a run at bucket ``size`` (arrays and
    ZipMap lists alike). An output without one row per padded row (a scalar, or two rows
    per input row) is returned whole, so that warm-up refuses it as it would unpadded."""
    if isinstance(values, np.generic) or (isinstance(values, np.ndarray) and values.ndim == 0):
        return values
    if len(values) != size:
        return values
    return values[:rows]
