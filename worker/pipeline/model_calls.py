"""A batch's rows through a model: the hooks around it, bisection when it fails, and the
two ways only part of a batch reaches a model (rows the output cache lacks, a canary's
share).

``ModelCalls.run`` calls the hooks and the engine once for the whole batch; an
EngineError makes it try again on halves until the failing rows are isolated, so the
other rows still publish, unless the model itself is at fault
(``worker.pipeline.model_faults``). ``uncached`` runs only the rows neither cache tier holds, each
distinct input once; ``split`` runs a canary's rows on its engine and the others on the
pipeline's, and joins their outputs back in row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.cache import CachedRows, OutputCache, SettledRows
from worker.errors import EngineError
from worker.inference import InferenceEngine, Outputs
from worker.pipeline.feeds import Feeds
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.model_faults import ModelFaults

__all__ = ["ModelCalls"]

Failed = dict[int, str]
"""Row -> why the model refused it."""


class ModelCalls:
    """Runs one pipeline's batches (and parts of them) through an engine and its hooks.

    A batch on the pipeline's own model (``watched``) that fails as a whole is judged
    first (``worker.pipeline.model_faults``): a fault of the model raises ModelFault
    instead of dead-lettering every row."""

    def __init__(self, hooks: BatchHooks, faults: ModelFaults) -> None:
        self._hooks = hooks
        self._faults = faults

    def run(
        self,
        engine: InferenceEngine,
        feeds: Feeds,
        requests: list[dict[str, Any]],
        *,
        watched: bool = False,
    ) -> tuple[Outputs, Failed]:
        """Run the hooks and the model; on failure bisect so only the failing rows are
        refused."""
        faults = self._faults if watched else None
        try:
            outputs = self._call(engine, feeds, requests)
        except EngineError as exc:
            if faults is None:
                return self._bisect(engine, feeds, requests, exc)
            return self._judged(faults, engine, feeds, requests, exc)
        if faults is not None:
            faults.answered(feeds, requests)
        return outputs, {}

    def _call(
        self, engine: InferenceEngine, feeds: Feeds, requests: list[dict[str, Any]]
    ) -> Outputs:
        hooks = self._hooks
        if not hooks.active:
            return engine.infer(feeds)
        return hooks.after(requests, engine.infer(hooks.before(requests, feeds)))

    def _judged(
        self,
        faults: ModelFaults,
        engine: InferenceEngine,
        feeds: Feeds,
        requests: list[dict[str, Any]],
        exc: EngineError,
    ) -> tuple[Outputs, Failed]:
        """A batch the model refused as a whole: the model's fault (raised) or its rows'."""
        known = faults.known_good
        if known is not None:
            try:
                self._call(engine, known.feeds, known.requests)
            except EngineError as probe:
                raise faults.refused_known(str(exc), str(probe)) from exc
        outputs, failed = self._bisect(engine, feeds, requests, exc)
        n = len(next(iter(feeds.values())))
        if len(failed) < n:
            faults.answered(feeds, requests, next(r for r in range(n) if r not in failed))
        elif known is None:
            faults.refused_all(str(exc))
        return outputs, failed

    def _bisect(
        self,
        engine: InferenceEngine,
        feeds: Feeds,
        requests: list[dict[str, Any]],
        exc: EngineError,
    ) -> tuple[Outputs, Failed]:
        """Halves of a batch that failed as a whole, each run (and bisected) on its own."""
        n = len(next(iter(feeds.values())))
        if n == 1:
            return {}, {0: str(exc)}
        half = n // 2
        left, left_failed = self.run(
            engine, {k: v[:half] for k, v in feeds.items()}, requests[:half]
        )
        right, right_failed = self.run(
            engine, {k: v[half:] for k, v in feeds.items()}, requests[half:]
        )
        failed = dict(left_failed)
        failed.update({half + i: why for i, why in right_failed.items()})
        halves = ((np.arange(half), left), (np.arange(half, n), right))
        return _scatter(halves, n), failed

    def uncached(
        self, cache: OutputCache, rows: CachedRows, feeds: Feeds, engine: InferenceEngine
    ) -> SettledRows:
        """Run the model on the rows the cache does not hold, in one call (bisected on
        failure like any batch); the cache encodes and keeps what it computes."""
        plan = cache.to_run(rows, feeds, engine)
        outputs: Outputs = {}
        failed: Failed = {}
        if plan.run:
            whole = len(plan.run) == len(rows.keys)
            run = np.asarray(plan.run, dtype=np.intp)
            outputs, failed = self.run(
                engine,
                feeds if whole else {k: v[run] for k, v in feeds.items()},
                [],
                watched=True,
            )
        return cache.settle(plan, outputs, failed)

    def split(
        self,
        engines: tuple[InferenceEngine, InferenceEngine],
        feeds: Feeds,
        requests: list[dict[str, Any]],
        split: npt.NDArray[np.bool_],
    ) -> tuple[Outputs, Failed]:
        """Two engine calls: the rows ``split`` marks on the canary's engine, the others
        on the pipeline's; their outputs (of the same fields and shapes: checked when the
        canary loaded) joined back in row order."""
        parts: list[tuple[npt.NDArray[np.intp], Outputs]] = []
        failed: Failed = {}
        for engine, rows in zip(
            engines, (np.flatnonzero(~split), np.flatnonzero(split)), strict=True
        ):
            if not len(rows):
                continue
            part = {k: v[rows] for k, v in feeds.items()}
            outputs, refused = self.run(
                engine, part, [requests[r] for r in rows.tolist()] if requests else []
            )
            parts.append((rows, outputs))
            failed.update({int(rows[i]): why for i, why in refused.items()})
        return _scatter(parts, len(split)), failed


def _scatter(parts: Sequence[tuple[npt.NDArray[np.intp], Outputs]], n: int) -> Outputs:
    """Join the outputs of row subsets of one batch into the batch's row order; rows of a
    part that failed as a whole hold placeholders."""
    if len(parts) == 1 and len(parts[0][0]) == n:
        return parts[0][1]
    template = next((outputs for _rows, outputs in parts if outputs), None)
    if template is None:
        return {}
    joined: Outputs = {}
    for name, sample in template.items():
        dtype = np.result_type(*(o[name].dtype for _r, o in parts if name in o))
        fill = np.nan if dtype.kind == "f" else 0
        out = np.full((n, *sample.shape[1:]), fill, dtype=dtype)
        for rows, outputs in parts:
            if name in outputs:
                out[rows] = outputs[name]
        joined[name] = out
    return joined
