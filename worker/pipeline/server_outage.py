"""Holding a batch whose inference server cannot answer, without holding the others.

An ``InferenceServerError`` (the server down, overloaded, past the call's timeout, not
serving the model) is no fault of any record: the batch waits for the server, nothing of
it is dead-lettered. It waits the way a batch held for a fault of its model does
(``worker.pipeline.model_faults``): the infer step raises ``Parked``
(``worker.core.parked``) each time the batch may not be tried yet, so the stage thread
every pipeline shares serves the other pipelines' batches meanwhile, this pipeline's
later batches wait behind the held one and the worker pauses its partitions
(``worker.loop``). Readiness names the server for as long as it lasts
(``on_inference_server``). Tries come 0.1 s to 5 s apart, at once when the slot holds
another model (a version the reloader found). The hold ends when the batch goes through,
or when ``abort`` is set (the worker is stopping): the next try raises the outage, the
batch is not committed and is served again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from worker.core import Parked
from worker.errors import InferenceServerError
from worker.inference import ModelIdentity

__all__ = ["ServerOutage"]

log = logging.getLogger(__name__)


class ServerOutage:
    """One pipeline's batch held for its inference server (see the module).

    Used by one thread at a time: the one running the pipeline's infer step."""

    RETRY_S = (0.1, 5.0)
    """First and longest wait between tries of the held batch."""

    def __init__(
        self,
        pipeline: str,
        *,
        abort: threading.Event,
        on_inference_server: Callable[[bool, str | None], None],
        model: Callable[[], ModelIdentity],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pipeline = pipeline
        self._abort = abort
        self._on_server = on_inference_server
        self._model = model
        self._clock = clock
        self._outage: InferenceServerError | None = None
        self._tried_on: ModelIdentity | None = None
        self._delay = 0.0
        self._due = 0.0

    @property
    def holding(self) -> bool:
        """Whether a batch is held: the next batch to try is that one."""
        return self._outage is not None

    def try_now(self) -> bool:
        """Whether the held batch may be tried now: its wait is over or the slot holds
        another model. Raises the outage once ``abort`` is set, ending the hold."""
        outage = self._outage
        assert outage is not None, "nothing is held"
        if self._abort.is_set():
            self._end()
            raise outage
        return self._model() != self._tried_on or self._clock() >= self._due

    def held(self, outage: InferenceServerError, tried_on: ModelIdentity) -> Parked:
        """A try of the batch on ``tried_on`` met ``outage``: hold it (readiness hears
        each new reason) and return the ``Parked`` for the caller to raise."""
        first, longest = self.RETRY_S
        if self._outage is None or str(outage) != str(self._outage):
            self._on_server(False, str(outage))
        if self._outage is None:
            log.error(
                "pipeline %s: %s; its batches wait for the server (nothing is "
                "dead-lettered, the other pipelines go on)",
                self._pipeline,
                outage,
            )
        self._delay = min(self._delay * 2, longest) if self._delay else first
        self._outage, self._tried_on = outage, tried_on
        self._due = self._clock() + self._delay
        return self.parked()

    def parked(self) -> Parked:
        """The ``Parked`` of the held batch: look again at its next try."""
        why = f"pipeline {self._pipeline}: waiting for its inference server"
        return Parked(why, self._due - self._clock())

    def released(self) -> None:
        """The held batch went through: the server answers again."""
        if self._outage is not None:
            log.info("pipeline %s: the inference server answers again", self._pipeline)
            self._end()

    def _end(self) -> None:
        self._outage = self._tried_on = None
        self._delay = 0.0
        self._on_server(True, None)
