"""One pipeline: decode → enrich → infer → publish for one closed batch.

``Pipeline.handle`` turns a batch of consumed messages into produced results and dead
letters and returns the delivery tracker and next offsets for the committer. Bad
records never raise: each becomes a dead letter naming its stage and reason. A model
that fails on a batch is retried on halves until the failing rows are isolated, so the
other rows still publish. With an output cache (``worker.cache.output_cache``), rows whose
inputs it holds skip the model and their results say ``"cached": true``. With a canary
(``worker.pipeline.canary``) the batch's rows are split while decoding and the infer step makes
two engine calls; with a shadow (``worker.pipeline.shadow``) the batch is offered to it once its
results are sent. The cache serves pipelines without a canary or shadow (the config
refuses the pair).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
from confluent_kafka import Message

from worker.cache.output_cache import CachedRows, OutputCache
from worker.config import PipelineConfig
from worker.core.job import next_offsets
from worker.core.tracker import DeliveryTracker
from worker.core.types import DecodedRequests, PartitionKey, Refusal, StageTimings
from worker.errors import ConfigError
from worker.features.lookups import OneStore
from worker.features.store_wait import StoreWait
from worker.features.stores import FeatureStore
from worker.inference.engine import InferenceEngine, Outputs
from worker.inference.rows import finite_rows, row_outputs
from worker.inference.slot import LiveModel, ModelIdentity, ModelSlot
from worker.kafka.headers import MAX_RESULT_HEADERS_BYTES, SourceHeaders, trace_headers
from worker.kafka.limits import NEEDS_A_KEY, record_size
from worker.kafka.sink import Sink
from worker.kafka.source import position
from worker.ops.metrics import PipelineMetrics
from worker.pipeline.canary import Canary
from worker.pipeline.codec import decode_requests, result_tail
from worker.pipeline.dead_letters import DeadLetters
from worker.pipeline.feeds import BatchFetcher, FeedPlan, Feeds, assemble
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.model_calls import ModelCalls
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.shadow import ShadowBatch, ShadowRunner

__all__ = ["Pipeline", "Prepared"]

log = logging.getLogger(__name__)

_perf = time.perf_counter

_CACHED = b',"cached":true'
"""Spliced into a result whose outputs came from the output cache."""


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


class Pipeline:
    """Processes batches for one pipeline config. Called from the worker's loop thread.

    ``slot`` holds the model it serves, ``engine`` named as the config's model at first;
    ``worker.models.reloader`` may swap it between two batches. ``canary`` scores its share of
    the records instead; ``shadow`` is offered every batch once its results are sent.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        store: FeatureStore | BatchFetcher,
        engine: InferenceEngine,
        metrics: PipelineMetrics,
        hooks: BatchHooks | None = None,
        retry_feature_store_s: float | None = 30.0,
        abort: threading.Event | None = None,
        on_feature_store: Callable[[bool, str | None], None] | None = None,
        canary: Canary | None = None,
        shadow: ShadowRunner | None = None,
        cache: OutputCache | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.plan = FeedPlan.build(config, engine.inputs)
        self._shape = RequestShape.of(config, self.plan.kinds)
        if hasattr(store, "fetch_all"):
            self._store: BatchFetcher = cast(BatchFetcher, store)
        else:  # one lookup, from any FeatureStore
            name = config.lookups[0].name if config.lookups else "entity"
            self._store = OneStore(name, store)
        self.slot = ModelSlot(LiveModel.of(config.model, engine))
        self._hooks = hooks or BatchHooks()
        self._calls = ModelCalls(self._hooks)
        if cache is not None and self._hooks.active:
            raise ConfigError(
                f"pipelines.{self.name}: cache.enabled = true with hooks: hooks see the "
                "whole request, so the model's inputs alone do not decide a result"
            )
        if cache is not None and (canary is not None or shadow is not None):
            raise ConfigError(
                f"pipelines.{self.name}: cache.enabled = true with a canary or shadow: "
                "their rows are compared and published per model, the cache's per input"
            )
        self._cache = cache
        self.metrics = metrics
        self._store_wait = StoreWait(
            self.name,
            retry_s=retry_feature_store_s,
            abort=abort or threading.Event(),
            errors=metrics.feature_store_errors,
            on_feature_store=on_feature_store or (lambda _ok, _why: None),
        )
        self.dead_letters = DeadLetters(config, metrics)
        self.canary = canary
        self.shadow = shadow

    def handle(
        self, batch: Sequence[Message], sink: Sink, tracker: DeliveryTracker | None = None
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]:
        """``prepare``, ``infer`` and ``publish`` one batch on the calling thread."""
        tracker = tracker if tracker is not None else DeliveryTracker()
        self.publish(self.infer(self.prepare(batch)), sink, tracker)
        return tracker, next_offsets(batch)

    def prepare(self, batch: Sequence[Message]) -> Prepared:
        """Decode and enrich one batch; nothing is produced yet.

        Blocks while the feature store is unreachable, retrying with backoff until it
        answers, ``retry_feature_store_s`` passes or ``abort`` is set; then raises
        FeatureStoreError and nothing of the batch counts as done.
        """
        with _TRACER.start_as_current_span(
            "streamfer.batch",
            attributes={"streamfer.pipeline": self.name, "streamfer.batch_size": len(batch)},
        ):
            return self._prepare(batch)

    def _prepare(self, batch: Sequence[Message]) -> Prepared:
        m = self.metrics
        timings = StageTimings()
        started = _perf()
        first_ts = batch[0].timestamp()[1]
        if first_ts > 0:
            timings.wait_ms = max(0.0, time.time() * 1000.0 - first_ts)
            m.queue_seconds.observe(timings.wait_ms / 1000.0)

        decoded = decode_requests(
            [msg.value() for msg in batch], self._shape, self.config.max_record_bytes
        )
        t_decoded = _perf()
        timings.decode_ms = (t_decoded - started) * 1000.0
        m.decode_seconds.observe(timings.decode_ms / 1000.0)
        prepared = Prepared(batch, decoded, timings)
        if not decoded.rows:
            return prepared
        assembled = self._store_wait.call(lambda: assemble(self.plan, decoded, self._store))
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
            engine = self.slot.for_batch().engine
            prepared.cached = self._cache.look_up(prepared.feeds, engine)
        if self.canary is not None and len(prepared.good):
            good, rows, ids = prepared.good.tolist(), decoded.rows, decoded.ids
            split = self.canary.mask([batch[rows[g]].key() for g in good], [ids[g] for g in good])
            prepared.canary = split if split.any() else None
        return prepared

    def infer(self, prepared: Prepared) -> Prepared:
        """Run the model on the rows that reached it; a failing row is isolated by
        bisection and becomes a dead letter, the others still publish. The slot is read
        here, once: the whole batch runs on (and names) one model version."""
        live = self.slot.for_batch()
        prepared.model, prepared.engine = live.identity, live.engine
        if len(prepared.good):
            started = _perf()
            docs = prepared.decoded.docs
            wants = self._hooks.active or (self.shadow is not None and self.shadow.wants_requests)
            requests = [docs[g] for g in prepared.good.tolist()] if wants else []
            split = prepared.canary
            if prepared.cached is not None:
                assert self._cache is not None
                prepared.failed = self._calls.uncached(
                    self._cache, prepared.cached, prepared.feeds, live.engine
                )
            elif split is None or self.canary is None:
                prepared.outputs, prepared.failed = self._calls.run(
                    live.engine, prepared.feeds, requests
                )
            else:
                candidate = self.canary.slot.for_batch()
                prepared.candidate = candidate.identity
                prepared.candidate_engine = candidate.engine
                prepared.outputs, prepared.failed = self._calls.split(
                    (live.engine, candidate.engine), prepared.feeds, requests, split
                )
                self.metrics.canary_records.inc(int(split.sum()))
            prepared.timings.infer_ms = (_perf() - started) * 1000.0
            self.metrics.infer_seconds.observe(prepared.timings.infer_ms / 1000.0)
            if self.shadow is None:
                prepared.feeds = {}
            elif wants:
                prepared.requests = requests
        return prepared

    def publish(self, prepared: Prepared, sink: Sink, tracker: DeliveryTracker) -> None:
        """Send a result or dead letter for every message of the batch, then seal the
        tracker. Deliveries complete asynchronously on ``sink``; the tracker says when."""
        batch, decoded = prepared.batch, prepared.decoded
        if prepared.model is None:  # published without the infer step: nothing ran
            prepared.model = self.slot.for_batch().identity
        tag = prepared.model.tag
        for rej in decoded.rejections:
            self.dead_letters.send(
                sink,
                tracker,
                batch[rej.index],
                rej.stage,
                rej.code,
                rej.reason,
                rej.request_id,
                model=tag,
            )
        for r, code, reason in prepared.feature_rejects:
            self.dead_letters.send(
                sink,
                tracker,
                batch[decoded.rows[r]],
                "features",
                code,
                reason,
                decoded.ids[r],
                model=tag,
            )
        if len(prepared.good):
            self._publish(sink, tracker, prepared, prepared.model)
            if self.shadow is not None:
                self._offer_shadow(self.shadow, prepared, prepared.model)
        prepared.engine = prepared.candidate_engine = None  # released after their last batch
        tracker.context = prepared  # to dead-letter what the broker refuses after this
        m = self.metrics
        m.records.inc(len(batch))
        m.batches.inc()
        m.batch_size.observe(len(batch))
        tracker.seal()
        if self._cache is not None and prepared.cached is not None:
            self._cache.share(prepared.cached)  # while the deliveries are on their way

    def _offer_shadow(self, shadow: ShadowRunner, prepared: Prepared, model: ModelIdentity) -> None:
        """Hand the shadow its copy of the batch (after this batch's results are sent);
        the feeds are let go here either way."""
        batch, rows, ids = prepared.batch, prepared.decoded.rows, prepared.decoded.ids
        good = prepared.good.tolist()
        shadow.offer(
            ShadowBatch(
                messages=[batch[rows[g]] for g in good],
                ids=[ids[g] for g in good],
                feeds=prepared.feeds,
                requests=prepared.requests,
                published=prepared.outputs,
                failed=prepared.failed,
                shadows=model,
                timings_ms=prepared.timings.as_dict(),
            )
        )
        prepared.feeds, prepared.requests = {}, []

    def _publish(
        self, sink: Sink, tracker: DeliveryTracker, prepared: Prepared, model: ModelIdentity
    ) -> None:
        batch, good, failed = prepared.batch, prepared.good, prepared.failed
        rows, ids = prepared.decoded.rows, prepared.decoded.ids
        n = len(good)
        cached = prepared.cached
        outs: Iterable[object]
        if cached is None:
            finite = finite_rows(prepared.outputs, n)
            for i in failed:
                finite[i] = False
            refused = set(np.flatnonzero(~finite).tolist())
            outs = row_outputs(prepared.outputs, n)
            marks: Iterable[bytes] = itertools.repeat(b"", n)
        else:
            refused = {i for i, value in enumerate(cached.encoded) if value is None}
            outs = [None if v is None else orjson.Fragment(v) for v in cached.encoded]
            marks = [_CACHED if hit else b"" for hit in cached.reused]
        # What every result of the batch shares is encoded once: the body is the
        # per-record part with this tail spliced in before its closing brace.
        # A canary's rows name it: a second shared tail, picked per row by the split.
        shared = {"pipeline": self.name, "timings_ms": prepared.timings.as_dict()}
        models = [model]
        split: Iterable[bool] = itertools.repeat(False, len(good))
        if prepared.canary is not None and prepared.candidate is not None:
            models.append(prepared.candidate)
            split = prepared.canary.tolist()
        tails = [result_tail({"model": m.meta, **shared}) for m in models]
        tags = [m.tag for m in models]
        topic = self.config.result_topic
        send = sink.send
        dumps = orjson.dumps
        headers_of = SourceHeaders().of if self.config.source_headers else trace_headers
        room = sink.limit(topic)
        roomy = room - MAX_RESULT_HEADERS_BYTES
        keyed_only = sink.limit.needs_key(topic)
        instead = 0  # dead letters sent in place of results
        known = tracker.refusals  # results the broker refused on an earlier try
        rows_out = zip(good.tolist(), outs, marks, split, strict=True)
        for i, (g, out, mark, by_canary) in enumerate(rows_out):
            msg = batch[rows[g]]
            if refused and i in refused:
                reason = failed.get(i, "model returned NaN or infinity for this row")
                code = "model_error" if i in failed else "model_non_finite"
                tag = tags[by_canary]
                self.dead_letters.send(sink, tracker, msg, "infer", code, reason, ids[g], model=tag)
                continue
            rid = ids[g]
            if known and (r := known.get(position(msg))) is not None:
                tag = tags[by_canary]
                self.dead_letters.send(
                    sink, tracker, msg, r.stage, r.code, r.reason, rid, bare=r.bare, model=tag
                )
                instead += 1
                continue
            key = msg.key()
            if key is None and keyed_only:  # the broker would refuse its whole batch
                why = f"{topic} cannot take the result: {NEEDS_A_KEY}, and the request has none"
                self.dead_letters.send(
                    sink, tracker, msg, "publish", "result_refused", why, rid, model=tags[by_canary]
                )
                instead += 1
                continue
            head = dumps(
                {
                    "id": rid,
                    "key": key.decode("utf-8", "replace") if key is not None else None,
                    "outputs": out,
                    "request_ts_ms": msg.timestamp()[1],
                }
            )
            value = head[:-1] + mark + tails[by_canary]
            headers = headers_of(msg, rid)
            # headers are small and bounded: only a large record needs the exact sum
            if (
                len(value) + (len(key) if key is not None else 0) > roomy
                and record_size(value, key, headers) > room
            ) or not send(tracker, topic, value, key, headers):
                size = record_size(value, key, headers)
                why = f"result of {size} bytes with key and headers; {topic} takes {room}"
                tag = tags[by_canary]
                self.dead_letters.send(
                    sink, tracker, msg, "publish", "result_too_large", why, rid, model=tag
                )
                instead += 1
        self.metrics.results.inc(len(good) - len(refused) - instead)

    def refusal_of(
        self, tracker: DeliveryTracker, produced: Message, why: str
    ) -> tuple[Message, Refusal] | str:
        """The request behind a record the broker refused for itself and its dead letter
        (see ``DeadLetters.locate``), or why there is none. Once the batch is sealed."""
        prepared = tracker.context
        if not isinstance(prepared, Prepared):
            return f"{produced.topic()}: refused ({why}) and its batch is unknown"
        decoded = prepared.decoded
        return self.dead_letters.locate(produced, why, prepared.batch, decoded.ids, decoded.rows)

    def dead_letter_undelivered(
        self, sink: Sink, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        """Dead-letter the request behind a record the broker refused for itself (see
        ``DeadLetters.undelivered``). Loop thread, once the batch is sealed."""
        prepared = tracker.context
        if not isinstance(prepared, Prepared):
            tracker.fail(f"{produced.topic()}: refused ({why}) and its batch is unknown")
            return
        decoded = prepared.decoded
        self.dead_letters.undelivered(
            sink,
            tracker,
            produced,
            why,
            prepared.batch,
            decoded.ids,
            decoded.rows,
            model=prepared.model.tag if prepared.model is not None else None,
        )
