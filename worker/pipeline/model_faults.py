"""Telling a model that fails from records that fail it, and waiting out the first.

A batch the model refuses as a whole is tried once more on a row the model answered
before (the first row of the last batch that went through whole, with its request for
the hooks): that row was valid input, and reloads keep the inputs, so if the model
refuses it too the model is at fault (a hook returning the wrong dtype, a device error
that persists, a new version that cannot take the inputs) and ``ModelFault`` is raised
after two engine calls instead of bisecting into 2n-1 calls that dead-letter every
request. If it answers, the batch's own rows are at fault and are isolated by bisection.
Before any row has gone through there is nothing to test against: batches are bisected,
and the ``pause_after``-th in a row of which no row went through is taken for a fault of
the model as well.

``ModelFaultWait`` holds the batch that met the fault: the pipeline reports not ready
with the reason, ``streamfer_model_paused`` is 1 and the batch is tried again with
backoff (1 s to 30 s), at once when a reload brings another model version. The held
batch blocks the infer stage, so the records behind it fill the worker's in-flight bound
and their partitions pause (``worker.loop.pausing``): the stream waits for a model
instead of being dead-lettered. It ends when the batch goes through (ready again, the
partitions resume as it drains) or when ``abort`` is set (the worker is stopping; the
batch is not committed and is served again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge

from worker.errors import EngineError
from worker.inference import ModelIdentity
from worker.pipeline.feeds import Feeds

__all__ = ["KnownGood", "ModelFault", "ModelFaultWait", "ModelFaults"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelFault(EngineError):
    """The model refused a whole batch and a row it answered before, or ``pause_after``
    batches in a row: the model is at fault, not the records."""


@dataclass(frozen=True, slots=True)
class KnownGood:
    """One row the model answered: its feeds, and its request for the hooks (or none
    when no hook runs)."""

    feeds: Feeds
    requests: list[dict[str, Any]]


class ModelFaults:
    """One pipeline's evidence about its model: a row it answered and how many batches
    in a row it answered no row of."""

    def __init__(self, pause_after: int, failed_batches: Counter) -> None:
        if pause_after < 1:
            raise ValueError("pause_after must be at least 1")
        self._pause_after = pause_after
        self._failed_batches = failed_batches
        self._known: KnownGood | None = None
        self._refused_in_a_row = 0

    @property
    def known_good(self) -> KnownGood | None:
        return self._known

    def answered(self, feeds: Feeds, requests: list[dict[str, Any]], row: int = 0) -> None:
        """The model answered ``row`` of this batch: keep it (a one-row copy per batch,
        never a reference that pins the batch's arrays)."""
        self._refused_in_a_row = 0
        self._known = KnownGood(
            {name: column[row : row + 1].copy() for name, column in feeds.items()},
            [requests[row]] if requests else [],
        )

    def refused_all(self, why: str) -> None:
        """No row of a batch went through and nothing tested the model: the batch's
        requests are dead-lettered unless this is the ``pause_after``-th such batch in a
        row, which raises ModelFault."""
        self._failed_batches.inc()
        self._refused_in_a_row += 1
        if self._refused_in_a_row >= self._pause_after:
            raise ModelFault(
                f"the model refused every row of {self._refused_in_a_row} batches in a row: {why}"
            )
        log.warning(
            "the model refused every row of a batch (%d in a row; at %d the pipeline pauses): %s",
            self._refused_in_a_row,
            self._pause_after,
            why,
        )

    def refused_known(self, why: str, probe_why: str) -> ModelFault:
        """The model refused a batch and the row it answered before."""
        self._failed_batches.inc()
        that_row = "" if probe_why == why else f" (that row: {probe_why})"
        return ModelFault(
            f"the model refused a whole batch and a row it answered before: {why}{that_row}"
        )


class ModelFaultWait:
    """Holds a batch that met a ModelFault until the model takes it (see the module)."""

    RETRY_S = (1.0, 30.0)
    """First and longest wait between tries of the held batch on the same model."""
    LOOK_S = 0.25
    """How often a held batch looks for a reloaded model."""

    def __init__(
        self,
        pipeline: str,
        *,
        abort: threading.Event,
        paused: Gauge,
        on_model: Callable[[bool, str | None], None],
        model: Callable[[], ModelIdentity],
    ) -> None:
        self._pipeline = pipeline
        self._abort = abort
        self._paused = paused
        self._on_model = on_model
        self._model = model

    def hold(self, fault: ModelFault, tried_on: ModelIdentity, attempt: Callable[[], T]) -> T:
        """``attempt()`` again (with backoff, or at once when the model is no longer
        ``tried_on``, the one that met ``fault``) until it returns; raises the last
        ModelFault once ``abort`` is set."""
        name = self._pipeline
        self._paused.set(1)
        self._on_model(False, f"pipeline {name}: {fault}")
        log.error(
            "pipeline %s: %s; its batches wait for the model (nothing is dead-lettered): "
            "fix the model or its hooks and reload",
            name,
            fault,
        )
        first, longest = self.RETRY_S
        delay = first
        try:
            while True:
                due = time.monotonic() + delay
                while time.monotonic() < due and self._model() == tried_on:
                    if self._abort.wait(self.LOOK_S):
                        raise fault
                if self._abort.is_set():
                    raise fault
                reloaded = self._model() != tried_on
                tried_on = self._model()
                delay = first if reloaded else min(delay * 2, longest)
                try:
                    answer = attempt()
                except ModelFault as again:
                    if str(again) != str(fault):
                        log.error("pipeline %s: %s", name, again)
                        self._on_model(False, f"pipeline {name}: {again}")
                    fault = again
                    continue
                log.info("pipeline %s: the model takes its batches again", name)
                return answer
        finally:
            self._paused.set(0)
            self._on_model(True, None)
