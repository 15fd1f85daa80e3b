"""The values a batch's steps hand each other: what was decoded and enriched (prepare ->
infer, ``Enriched``), and what the model answered (infer -> publish, ``Scored``); what
was published goes to the batch's tracker as ``worker.core.Published``.

Each step makes a new value and never changes the one it was given, so what a stage
thread reads is never written by another, and a reader knows what exists at each point.
They hold per-batch arrays and lists, never an object per record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from worker.cache import CachedRows, SettledRows
from worker.core import DecodedRequests, StageTimings
from worker.inference import LiveModel, Outputs
from worker.pipeline.feeds import Feeds

__all__ = ["BatchRows", "Enriched", "Scored"]


def _no_rows() -> npt.NDArray[np.intp]:
    return np.zeros(0, dtype=np.intp)


@dataclass(frozen=True, slots=True)
class BatchRows:
    """Which records of a batch reach the model, fixed once decoded and enriched.

    ``good`` indexes ``decoded.rows`` (the requests that reach the model); every array a
    later step adds about rows (feeds, outputs, ``canary``) is aligned with it.
    ``rejected``: (row of ``decoded.rows``, code, reason) of the requests whose features
    were refused. With an output cache, ``cached`` holds each row's key and what the
    cache held for it; with a canary, ``canary`` marks the rows of ``good``
    it scores (None: none).
    """

    batch: Sequence[Message]
    decoded: DecodedRequests
    rejected: Sequence[tuple[int, str, str]] = ()
    good: npt.NDArray[np.intp] = field(default_factory=_no_rows)
    cached: CachedRows | None = None
    canary: npt.NDArray[np.bool_] | None = None


@dataclass(frozen=True, slots=True)
class Enriched:
    """A batch decoded and enriched (prepare -> infer): its rows and their model inputs."""

    rows: BatchRows
    feeds: Feeds
    """The model's inputs of the rows of ``rows.good``."""
    timings: StageTimings


@dataclass(frozen=True, slots=True)
class Scored:
    """What the model answered for a batch (infer -> publish).

    ``model`` is the model the infer step read from the slot, once for the whole batch;
    its engine is held here until the batch is published, so a replaced engine lives
    until its last batch is out. ``outputs`` and ``failed`` (row of ``good`` -> why the
    model refused it) are aligned with ``rows.good``; with a canary, ``candidate`` is
    the canary's model that scored its rows. With an output cache, ``settled`` holds
    every row's encoded outputs (and ``outputs`` is empty).
    """

    rows: BatchRows
    timings: StageTimings
    model: LiveModel
    outputs: Outputs
    failed: Mapping[int, str]
    candidate: LiveModel | None = None
    settled: SettledRows | None = None
    feeds: Feeds | None = None
    """The model's inputs, kept only for a shadow (None without one)."""
    requests: Sequence[dict[str, Any]] = ()
    """The rows' decoded requests, kept only for a shadow's hooks."""
