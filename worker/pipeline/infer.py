"""A batch's second step, the model: which engines score which rows of one ``Enriched``
batch, answered as a ``Scored`` value (``worker.pipeline.values``).

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

import dataclasses
import time

from worker.cache import OutputCache
from worker.errors import InferenceServerError
from worker.inference import ModelSlot, Outputs
from worker.pipeline.canary import Canary
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.metrics import PipelineMetrics
from worker.pipeline.model_calls import ModelCalls
from worker.pipeline.model_faults import ModelFault, ModelFaults, ModelFaultWait
from worker.pipeline.server_outage import ServerOutage
from worker.pipeline.shadow import ShadowRunner
from worker.pipeline.values import Enriched, Scored

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

    def __call__(self, enriched: Enriched) -> Scored:
        """Score ``enriched``'s rows; see ``Pipeline.infer``. Raises ``Parked`` while the
        model is at fault or its inference server cannot answer: call again with the same
        batch (and no other of this pipeline) once its wait is over."""
        if not len(enriched.rows.good):
            return Scored(enriched.rows, enriched.timings, self._slot.for_batch(), {}, {})
        wait, outage = self._wait, self._outage
        if wait.holding and not wait.try_now():
            raise wait.parked()
        if outage is not None and outage.holding and not outage.try_now():
            raise outage.parked()
        started = _perf()
        scored = self._score(enriched)
        wait.released()
        if outage is not None:
            outage.released()
        infer_ms = (_perf() - started) * 1000.0
        self._metrics.infer_seconds.observe(infer_ms / 1000.0)
        return dataclasses.replace(
            scored, timings=dataclasses.replace(enriched.timings, infer_ms=infer_ms)
        )

    def _score(self, enriched: Enriched) -> Scored:
        """One try of the batch on the model the slot holds now; a fault of the model
        or a server that cannot answer holds the batch (raises ``Parked``)."""
        live = self._slot.for_batch()
        rows, feeds = enriched.rows, enriched.feeds
        shadow = self._shadow
        wants = self._hooks.active or (shadow is not None and shadow.wants_requests)
        docs = rows.decoded.docs
        requests = [docs[g] for g in rows.good.tolist()] if wants else []
        split = rows.canary
        candidate = settled = None
        outputs: Outputs = {}
        try:
            if rows.cached is not None:
                assert self._cache is not None
                settled = self._calls.uncached(self._cache, rows.cached, feeds, live.engine)
                failed = settled.failed
            elif split is None or self._canary is None:
                outputs, failed = self._calls.run(live.engine, feeds, requests, watched=True)
            else:
                candidate = self._canary.slot.for_batch()
                engines = (live.engine, candidate.engine)
                outputs, failed = self._calls.split(engines, feeds, requests, split)
                self._metrics.canary_records.inc(int(split.sum()))
        except ModelFault as fault:
            raise self._wait.held(fault, live.identity) from None
        except InferenceServerError as down:
            if self._outage is None:
                raise
            raise self._outage.held(down, live.identity) from None
        if shadow is None:  # the feeds are let go here: nothing after the model reads them
            return Scored(rows, enriched.timings, live, outputs, failed, candidate, settled)
        return Scored(
            rows, enriched.timings, live, outputs, failed, candidate, settled, feeds, requests
        )
