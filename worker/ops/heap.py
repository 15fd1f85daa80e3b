"""The worker process's garbage collector, set for a stream of short-lived batches.

Everything loaded at start-up (modules, config, the model's session) lives as long as the
process, yet CPython's cyclic collector scans it all again on every full collection,
and it runs one whenever objects of in-flight batches (decoded requests, results, their
records) have survived into the oldest generation in numbers: tens of milliseconds per
collection on a small machine, several microseconds per record. ``settle_heap`` moves
the start-up heap out of the collector's view (``gc.freeze``) and lets the youngest
generation fill up further before a collection, so that a batch's objects are mostly
freed (by reference counting) before the collector first looks at them. Cycles are
still collected; only their timing moves.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_heap"]

YOUNG_THRESHOLD = 10_000
"""Allocations less deallocations of tracked objects between two collections of the
youngest generation (CPython's default is 700, about three records' worth)."""


def settle_heap() -> None:
    """Collect what start-up left behind, then freeze the rest and raise the youngest
    generation's threshold. Once per worker process, after its models and clients are
    loaded and before it consumes."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
