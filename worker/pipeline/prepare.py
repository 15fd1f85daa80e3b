"""A batch's first step, decode and enrich, and ``Prepared``, the record the batch then
travels in through the infer step (``worker.pipeline.infer``) and the publish step
(``worker.pipeline.publish``).

It is a module of its own because it is the one step that waits on I/O: it decodes the
requests (``worker.pipeline.codec``; a bad record becomes a ``Rejection``), assembles
the model's feeds with one round trip for every lookup (``worker.pipeline.feeds``),
retrying while the feature store cannot serve (``worker.features.store_wait``), and
looks the rows up in the output cache or splits them for the canary. Nothing is produced
here. It runs on the first stage thread, inside a ``streamfer.batch`` span where the
OpenTelemetry API is installed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from worker.cache import CachedRows, OutputCache
from worker.config import PipelineConfig
from worker.core import DecodedRequests, StageTimings
from worker.features import StoreWait
from worker.inference import InferenceEngine, ModelIdentity, ModelSlot, Outputs
from worker.pipeline.canary import Canary
from worker.pipeline.codec import decode_requests
from worker.pipeline.feeds import BatchFetcher, FeedPlan, Feeds, assemble
from worker.pipeline.metrics import PipelineMetrics
from worker.pipeline.request_shape import RequestShape
from worker.registry import FramedRequests

__all__ = ["PrepareStep", "Prepared"]

_perf = time.perf_counter


class _NoSpan:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _NoTracer:
    """Stands in when the OpenTelemetry API is not installed: spans cost nothing."""

    def start_as_current_span(self, name: str, attributes: dict[str, object]) -> _NoSpan:
        return _NoSpan()


def _tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return _NoTracer()
    return trace.get_tracer("streamfer")


_TRACER = _tracer()


@dataclass(slots=True)
class Prepared:
    """A batch on its way through decode and enrich, the model, and publish.

    ``good`` indexes ``decoded.rows`` (the requests that reach the model); ``feeds``
    (their model inputs, until the model has run), ``outputs`` and ``failed`` (row of
    ``good`` -> why the model refused it) are aligned with it. ``model`` names the model
    the infer step read from the slot, and ``engine`` holds its engine until the batch
    is published (so a replaced engine lives until its last batch is out); with a
    canary, ``canary`` marks the rows of ``good`` its ``candidate`` scored.
    """

    batch: Sequence[Message]
    decoded: DecodedRequests
    timings: StageTimings
    feature_rejects: list[tuple[int, str, str]] = field(default_factory=list)
    good: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    feeds: Feeds = field(default_factory=dict)
    outputs: Outputs = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    cached: CachedRows | None = None
    """With an output cache: each row's key and, after the model, its encoded outputs."""
    model: ModelIdentity | None = None
    engine: InferenceEngine | None = None
    canary: npt.NDArray[np.bool_] | None = None
    candidate: ModelIdentity | None = None
    candidate_engine: InferenceEngine | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    """The rows' decoded requests, kept for a shadow's hooks."""


class PrepareStep:
    """Decodes and enriches one pipeline's batches; the pipeline's first stage thread."""

    def __init__(
        self,
        config: PipelineConfig,
        plan: FeedPlan,
        *,
        store: BatchFetcher,
        store_wait: StoreWait,
        slot: ModelSlot,
        metrics: PipelineMetrics,
        cache: OutputCache | None = None,
        canary: Canary | None = None,
        framed: tuple[FramedRequests, StoreWait] | None = None,
    ) -> None:
        self._name = config.name
        self._framed = framed
        self._max_record_bytes = config.max_record_bytes
        self._plan = plan
        self._shape = RequestShape.of(config, plan.kinds)
        self._store = store
        self._store_wait = store_wait
        self._slot = slot
        self._metrics = metrics
        self._cache = cache
        self._canary = canary

    def __call__(self, batch: Sequence[Message]) -> Prepared:
        """Decode and enrich ``batch``; see ``Pipeline.prepare``."""
        with _TRACER.start_as_current_span(
            "streamfer.batch",
            attributes={"streamfer.pipeline": self._name, "streamfer.batch_size": len(batch)},
        ):
            return self._prepare(batch)

    def _prepare(self, batch: Sequence[Message]) -> Prepared:
        m = self._metrics
        timings = StageTimings()
        started = _perf()
        first_ts = batch[0].timestamp()[1]
        if first_ts > 0:
            timings.wait_ms = max(0.0, time.time() * 1000.0 - first_ts)
            m.queue_seconds.observe(timings.wait_ms / 1000.0)

        values = [msg.value() for msg in batch]
        if self._framed is None:
            decoded = decode_requests(values, self._shape, self._max_record_bytes)
        else:
            framed, registry_wait = self._framed
            decoded = registry_wait.call(
                lambda: decode_requests(
                    values, self._shape, self._max_record_bytes, framed.for_batch(values)
                )
            )
        t_decoded = _perf()
        timings.decode_ms = (t_decoded - started) * 1000.0
        m.decode_seconds.observe(timings.decode_ms / 1000.0)
        prepared = Prepared(batch, decoded, timings)
        if not decoded.rows:
            return prepared
        assembled = self._store_wait.call(lambda: assemble(self._plan, decoded, self._store))
        if assembled.lookups:
            m.feature_hits.inc(assembled.lookups - assembled.misses)
            if assembled.misses:
                m.feature_misses.inc(assembled.misses)
        timings.enrich_ms = (_perf() - t_decoded) * 1000.0
        m.enrich_seconds.observe(timings.enrich_ms / 1000.0)
        prepared.feature_rejects = assembled.rejected
        if assembled.rejected:
            keep = np.ones(len(decoded.rows), dtype=np.bool_)
            keep[[r for r, _code, _reason in assembled.rejected]] = False
            prepared.good = np.flatnonzero(keep)
            prepared.feeds = {k: v[prepared.good] for k, v in assembled.feeds.items()}
        else:
            prepared.good = np.arange(len(decoded.rows))
            prepared.feeds = assembled.feeds
        if self._cache is not None and len(prepared.good):
            # keyed by the live model; a swap before the infer step is noticed there
            engine = self._slot.for_batch().engine
            prepared.cached = self._cache.look_up(prepared.feeds, engine)
        if self._canary is not None and len(prepared.good):
            good, rows, ids = prepared.good.tolist(), decoded.rows, decoded.ids
            split = self._canary.mask([batch[rows[g]].key() for g in good], [ids[g] for g in good])
            prepared.canary = split if split.any() else None
        return prepared
