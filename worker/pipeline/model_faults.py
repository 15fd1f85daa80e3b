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
backoff (1 s to 30 s), at once when a reload brings another model version. It holds
without blocking: each time the batch may not be tried yet the infer step raises
``Parked`` (``worker.core.parked``), so the stage thread the pipelines share serves the
other pipelines' batches meanwhile and comes back to this one later; this pipeline's
later batches wait behind it, and the worker pauses its partitions (``worker.loop``):
the stream waits for a model instead of being dead-lettered. The hold ends when the
batch goes through (ready again, the partitions resume) or when ``abort`` is set (the
worker is stopping; the next try raises the fault, the batch is not committed and is
served again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from worker.core import Clock, Deadline, Parked, monotonic_clock
from worker.errors import EngineError
from worker.inference import ModelIdentity
from worker.pipeline.feeds import Feeds

__all__ = ["KnownGood", "ModelFault", "ModelFaultWait", "ModelFaults"]

log = logging.getLogger(__name__)


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
    """Holds a batch that met a ModelFault until the model takes it (see the module).

    Used by one thread at a time: the one running the pipeline's infer step."""

    RETRY_S = (1.0, 30.0)
    """First and longest wait between tries of the held batch on the same model."""
    LOOK_S = 0.25
    """How often a held batch looks for a reloaded model (and for ``abort``)."""

    def __init__(
        self,
        pipeline: str,
        *,
        abort: threading.Event,
        paused: Gauge,
        on_model: Callable[[bool, str | None], None],
        model: Callable[[], ModelIdentity],
        clock: Clock = monotonic_clock,
    ) -> None:
        self._pipeline = pipeline
        self._abort = abort
        self._paused = paused
        self._on_model = on_model
        self._model = model
        self._clock = clock
        self._fault: ModelFault | None = None
        self._tried_on: ModelIdentity | None = None
        self._delay = 0.0
        self._due = Deadline(0.0, clock)

    @property
    def holding(self) -> bool:
        """Whether a batch is held: the next batch to try is that one."""
        return self._fault is not None

    def try_now(self) -> bool:
        """Whether the held batch may be tried now: the model is no longer the one that
        met the fault, or its wait is over. Raises that fault once ``abort`` is set,
        ending the hold."""
        fault = self._fault
        assert fault is not None, "nothing is held"
        if self._abort.is_set():
            self._end()
            raise fault
        if self._model() != self._tried_on:
            self._delay = 0.0  # a new model: the next wait starts again from the first
            return True
        return self._due.passed()

    def held(self, fault: ModelFault, tried_on: ModelIdentity) -> Parked:
        """A try of the batch on ``tried_on`` met ``fault``: hold it (reporting the first
        fault and any other one) and return the ``Parked`` for the caller to raise."""
        name = self._pipeline
        first, longest = self.RETRY_S
        if self._fault is None:
            self._paused.set(1)
            self._on_model(False, f"pipeline {name}: {fault}")
            log.error(
                "pipeline %s: %s; its batches wait for the model (nothing is dead-lettered, "
                "the other pipelines go on): fix the model or its hooks and reload",
                name,
                fault,
            )
            self._delay = first
        else:
            if str(fault) != str(self._fault):
                log.error("pipeline %s: %s", name, fault)
                self._on_model(False, f"pipeline {name}: {fault}")
            self._delay = first if self._delay == 0.0 else min(self._delay * 2, longest)
        self._fault, self._tried_on = fault, tried_on
        self._due = Deadline.after(self._delay, self._clock)
        return self.parked()

    def parked(self) -> Parked:
        """The ``Parked`` of the held batch: look again at its next try, or sooner for a
        reloaded model or ``abort``."""
        wait = min(self.LOOK_S, self._due.remaining())
        return Parked(f"pipeline {self._pipeline}: waiting for its model", wait)

    def released(self) -> None:
        """The held batch went through: the pipeline takes batches again."""
        if self._fault is not None:
            log.info("pipeline %s: the model takes its batches again", self._pipeline)
            self._end()

    def _end(self) -> None:
        self._fault = self._tried_on = None
        self._paused.set(0)
        self._on_model(True, None)
