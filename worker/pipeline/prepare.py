"""A batch's first step, decode and enrich, which hands the infer step
(``worker.pipeline.infer``) an ``Enriched`` value (``worker.pipeline.values``).

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
from typing import Any

import numpy as np
from confluent_kafka import Message

from worker.cache import OutputCache
from worker.config import PipelineConfig
from worker.core import StageTimings
from worker.features import StoreWait
from worker.inference import ModelSlot
from worker.pipeline.canary import Canary
from worker.pipeline.codec import decode_requests
from worker.pipeline.feeds import BatchFetcher, FeedPlan, assemble
from worker.pipeline.metrics import PipelineMetrics
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.values import BatchRows, Enriched
from worker.registry import FramedRequests

__all__ = ["PrepareStep"]

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

    def __call__(self, batch: Sequence[Message]) -> Enriched:
        """Decode and enrich ``batch``; see ``Pipeline.prepare``."""
        with _TRACER.start_as_current_span(
            "streamfer.batch",
            attributes={"streamfer.pipeline": self._name, "streamfer.batch_size": len(batch)},
        ):
            return self._prepare(batch)

    def _prepare(self, batch: Sequence[Message]) -> Enriched:
        m = self._metrics
        started = _perf()
        first_ts = batch[0].timestamp()[1]
        wait_ms = 0.0
        if first_ts > 0:
            wait_ms = max(0.0, time.time() * 1000.0 - first_ts)
            m.queue_seconds.observe(wait_ms / 1000.0)

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
        decode_ms = (t_decoded - started) * 1000.0
        m.decode_seconds.observe(decode_ms / 1000.0)
        if not decoded.rows:
            return Enriched(BatchRows(batch, decoded), {}, StageTimings(wait_ms, decode_ms))
        assembled = self._store_wait.call(lambda: assemble(self._plan, decoded, self._store))
        if assembled.lookups:
            m.feature_hits.inc(assembled.lookups - assembled.misses)
            if assembled.misses:
                m.feature_misses.inc(assembled.misses)
        enrich_ms = (_perf() - t_decoded) * 1000.0
        m.enrich_seconds.observe(enrich_ms / 1000.0)
        timings = StageTimings(wait_ms, decode_ms, enrich_ms)
        if assembled.rejected:
            keep = np.ones(len(decoded.rows), dtype=np.bool_)
            keep[[r for r, _code, _reason in assembled.rejected]] = False
            good = np.flatnonzero(keep)
            feeds = {k: v[good] for k, v in assembled.feeds.items()}
        else:
            good = np.arange(len(decoded.rows))
            feeds = assembled.feeds
        cached = canary = None
        if self._cache is not None and len(good):
            # keyed by the live model; a swap before the infer step is noticed there
            cached = self._cache.look_up(feeds, self._slot.for_batch().engine)
        if self._canary is not None and len(good):
            picked, at, ids = good.tolist(), decoded.rows, decoded.ids
            keys = [batch[at[g]].key() for g in picked]
            split = self._canary.mask(keys, [ids[g] for g in picked])
            canary = split if split.any() else None
        rows = BatchRows(batch, decoded, assembled.rejected, good, cached, canary)
        return Enriched(rows, feeds, timings)
