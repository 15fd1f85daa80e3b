"""A batch's second step, the model: which engines score which rows of one ``Prepared``
batch.

It is a module of its own because it is where the model version is fixed: the step reads
the ``ModelSlot`` once, so the whole batch runs on (and names) one model version even
while ``worker.models.reloader`` swaps it. From there it picks one of three ways through
``ModelCalls`` (``worker.pipeline.model_calls``): the rows the output cache lacks, a
canary's share and the rest, or the whole batch; a failing row is isolated by bisection
and refused alone, and a batch that meets a fault of the model waits for it
(``worker.pipeline.model_faults``): the step raises ``Parked`` and is called again with
the same batch, which is then tried on the model the slot holds. A batch whose inference
server cannot answer (``InferenceServerError``) waits for it the same way
(``worker.pipeline.server_outage``), each try on the model the slot holds then, so a
version the reloader found meanwhile takes it. It runs on the second stage thread and
produces nothing.
"""

from __future__ import annotations

import time

from worker.cache import OutputCache
from worker.errors import InferenceServerError
from worker.inference import ModelSlot
from worker.ops import PipelineMetrics
from worker.pipeline.canary import Canary
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.model_calls import ModelCalls
from worker.pipeline.model_faults import ModelFault, ModelFaults, ModelFaultWait
from worker.pipeline.prepare import Prepared
from worker.pipeline.server_outage import ServerOutage
from worker.pipeline.shadow import ShadowRunner

__all__ = ["InferStep"]

_perf = time.perf_counter


class InferStep:
    """Runs one pipeline's model on its batches; the pipeline's second stage thread."""

    def __init__(
        self,
        *,
        slot: ModelSlot,
        hooks: BatchHooks,
        metrics: PipelineMetrics,
        cache: OutputCache | None = None,
        canary: Canary | None = None,
        shadow: ShadowRunner | None = None,
        faults: tuple[ModelFaults, ModelFaultWait],
        outage: ServerOutage | None = None,
    ) -> None:
        self._slot = slot
        self._hooks = hooks
        self._calls = ModelCalls(hooks, faults[0])
        self._wait = faults[1]
        self._outage = outage
        self._metrics = metrics
        self._cache = cache
        self._canary = canary
        self._shadow = shadow

    def __call__(self, prepared: Prepared) -> Prepared:
        """Score ``prepared``'s rows; see ``Pipeline.infer``. Raises ``Parked`` while the
        model is at fault or its inference server cannot answer: call again with the same
        batch (and no other of this pipeline) once its wait is over."""
        if not len(prepared.good):
            live = self._slot.for_batch()
            prepared.model, prepared.engine = live.identity, live.engine
            return prepared
        wait, outage = self._wait, self._outage
        if wait.holding and not wait.try_now():
            raise wait.parked()
        if outage is not None and outage.holding and not outage.try_now():
            raise outage.parked()
        started = _perf()
        try:
            self._score(prepared)
        except ModelFault as fault:
            assert prepared.model is not None
            raise wait.held(fault, prepared.model) from None
        except InferenceServerError as down:
            if outage is None:
                raise
            assert prepared.model is not None
            raise outage.held(down, prepared.model) from None
        wait.released()
        if outage is not None:
            outage.released()
        prepared.timings.infer_ms = (_perf() - started) * 1000.0
        self._metrics.infer_seconds.observe(prepared.timings.infer_ms / 1000.0)
        if self._shadow is None:
            prepared.feeds = {}
        return prepared

    def _score(self, prepared: Prepared) -> None:
        """One try of the batch on the model the slot holds now."""
        live = self._slot.for_batch()
        prepared.model, prepared.engine = live.identity, live.engine
        docs = prepared.decoded.docs
        shadow = self._shadow
        wants = self._hooks.active or (shadow is not None and shadow.wants_requests)
        requests = [docs[g] for g in prepared.good.tolist()] if wants else []
        split = prepared.canary
        if prepared.cached is not None:
            assert self._cache is not None
            prepared.failed = self._calls.uncached(
                self._cache, prepared.cached, prepared.feeds, live.engine
            )
        elif split is None or self._canary is None:
            prepared.outputs, prepared.failed = self._calls.run(
                live.engine, prepared.feeds, requests, watched=True
            )
        else:
            candidate = self._canary.slot.for_batch()
            prepared.candidate = candidate.identity
            prepared.candidate_engine = candidate.engine
            prepared.outputs, prepared.failed = self._calls.split(
                (live.engine, candidate.engine), prepared.feeds, requests, split
            )
            self._metrics.canary_records.inc(int(split.sum()))
        if shadow is not None and wants:
            prepared.requests = requests
