"""One pipeline: decode → enrich → infer → publish for one closed batch.

``Pipeline.handle`` turns a batch of consumed messages into produced results and dead
letters and returns the delivery tracker and next offsets for the committer. Bad
records never raise: each becomes a dead letter naming its stage and reason. A model
that fails on a batch is retried on halves until the failing rows are isolated, so the
other rows still publish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
from confluent_kafka import Message

from worker import __version__
from worker.codec import decode_requests, encode_dead_letter, safe_text
from worker.commit import PartitionKey
from worker.config import FeatureSpec, PipelineConfig
from worker.engines import InferenceEngine, Outputs
from worker.errors import EngineError, FeatureStoreError
from worker.features import Assembled, FeatureStore, assemble
from worker.metrics import PipelineMetrics
from worker.sink import DeliveryTracker, Headers, Sink
from worker.source import position
from worker.types import StageTimings

__all__ = ["Pipeline", "next_offsets"]

log = logging.getLogger(__name__)

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


class Pipeline:
    """Processes batches for one pipeline config. Called from the worker's loop thread."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        store: FeatureStore,
        engine: InferenceEngine,
        metrics: PipelineMetrics,
        retry_feature_store_s: float | None = 30.0,
        abort: threading.Event | None = None,
        on_feature_store: Callable[[bool], None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._spec: FeatureSpec = config.features
        self._fields = frozenset(config.features.fields)
        self._store = store
        self._engine = engine
        self.metrics = metrics
        self._retry_s = retry_feature_store_s
        self._abort = abort or threading.Event()
        self._on_feature_store = on_feature_store or (lambda _ok: None)
        self._model_meta = {
            "name": config.model.name,
            "version": config.model.version,
            "sha256": engine.model_hash,
        }
        self._model_tag = f"{config.model.name}:{config.model.version}"
        width = engine.n_features
        if width is not None and width != len(config.features.fields):
            raise EngineError(
                f"pipeline {config.name!r}: model {config.model.path} expects {width} features "
                f"but features.fields lists {len(config.features.fields)}"
            )

    def handle(
        self, batch: Sequence[Message], sink: Sink, tracker: DeliveryTracker | None = None
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]:
        """Send a result or dead letter for every message, then seal the tracker.

        Blocks while the feature store is unreachable, retrying with backoff until it
        answers, ``retry_feature_store_s`` passes or ``abort`` is set; then raises
        FeatureStoreError and nothing of the batch counts as done. Deliveries complete
        asynchronously on ``sink``; the tracker says when.
        """
        with _TRACER.start_as_current_span(
            "streamfer.batch",
            attributes={"streamfer.pipeline": self.name, "streamfer.batch_size": len(batch)},
        ):
            return self._handle(batch, sink, tracker)

    def _handle(
        self, batch: Sequence[Message], sink: Sink, tracker: DeliveryTracker | None
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]:
        cfg = self.config
        m = self.metrics
        tracker = tracker if tracker is not None else DeliveryTracker()
        timings = StageTimings()
        started = _perf()
        first_ts = batch[0].timestamp()[1]
        if first_ts > 0:
            timings.wait_ms = max(0.0, time.time() * 1000.0 - first_ts)
            m.queue_seconds.observe(timings.wait_ms / 1000.0)

        values = [msg.value() for msg in batch]
        decoded = decode_requests(values, self._fields, cfg.max_record_bytes)
        t_decoded = _perf()
        timings.decode_ms = (t_decoded - started) * 1000.0
        for rej in decoded.rejections:
            self._dead_letter(
                sink, tracker, batch[rej.index], rej.stage, rej.code, rej.reason, None
            )

        if decoded.rows:
            assembled = self._assemble(decoded.entities, decoded.inline)
            if assembled.lookups:
                m.feature_hits.inc(assembled.lookups - assembled.misses)
                if assembled.misses:
                    m.feature_misses.inc(assembled.misses)
            t_enriched = _perf()
            timings.enrich_ms = (t_enriched - t_decoded) * 1000.0
            keep = np.ones(len(decoded.rows), dtype=np.bool_)
            for r, code, reason in assembled.rejected:
                keep[r] = False
                self._dead_letter(
                    sink, tracker, batch[decoded.rows[r]], "features", code, reason, decoded.ids[r]
                )
            good = np.flatnonzero(keep)
            if len(good):
                matrix = assembled.matrix if len(good) == len(keep) else assembled.matrix[good]
                outputs, failed = self._infer(matrix)
                timings.infer_ms = (_perf() - t_enriched) * 1000.0
                m.enrich_seconds.observe(timings.enrich_ms / 1000.0)
                m.infer_seconds.observe(timings.infer_ms / 1000.0)
                self._publish(
                    sink, tracker, batch, decoded.rows, decoded.ids, good, outputs, failed, timings
                )

        m.decode_seconds.observe(timings.decode_ms / 1000.0)
        m.records.inc(len(batch))
        m.batches.inc()
        m.batch_size.observe(len(batch))
        tracker.seal()
        return tracker, next_offsets(batch)

    def _assemble(
        self, entities: list[str | None], inline: list[dict[str, float] | None]
    ) -> Assembled:
        deadline = None if self._retry_s is None else time.monotonic() + self._retry_s
        delay = 0.1
        failing = False
        while True:
            try:
                assembled = assemble(self._spec, entities, inline, self._store)
            except FeatureStoreError as exc:
                self.metrics.feature_store_errors.inc()
                if not failing:
                    failing = True
                    self._on_feature_store(False)
                out_of_time = deadline is not None and time.monotonic() + delay > deadline
                if out_of_time or self._abort.is_set():
                    raise
                log.warning("pipeline %s: %s; retrying in %.1fs", self.name, exc, delay)
                self._abort.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            if failing:
                log.info("pipeline %s: feature store reachable again", self.name)
                self._on_feature_store(True)
            return assembled

    def _infer(self, matrix: npt.NDArray[np.float32]) -> tuple[Outputs, dict[int, str]]:
        """Run the model; on failure bisect so only the failing rows are refused."""
        try:
            return self._engine.infer(matrix), {}
        except EngineError as exc:
            if len(matrix) == 1:
                return {}, {0: str(exc)}
            half = len(matrix) // 2
            left, left_failed = self._infer(matrix[:half])
            right, right_failed = self._infer(matrix[half:])
            failed = dict(left_failed)
            failed.update({half + i: why for i, why in right_failed.items()})
            return _stitch(left, right, half, len(matrix)), failed

    def _publish(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        batch: Sequence[Message],
        rows: list[int],
        ids: list[str],
        good: npt.NDArray[np.intp],
        outputs: Outputs,
        failed: dict[int, str],
        timings: StageTimings,
    ) -> None:
        columns: dict[str, list[object]] = {}
        finite = np.ones(len(good), dtype=np.bool_)
        for field, values in outputs.items():
            if values.dtype.kind == "f":
                finite &= np.isfinite(values.reshape(len(values), -1)).all(axis=1)
            columns[field] = values.tolist()
        for i in failed:
            finite[i] = False
        names = list(columns)
        cols = [columns[n] for n in names]
        meta = self._model_meta
        timing = timings.as_dict()
        topic = self.config.result_topic
        send = sink.send
        dumps = orjson.dumps
        published = 0
        for i, g in enumerate(good.tolist()):
            r = rows[g]
            msg = batch[r]
            if not finite[i]:
                reason = failed.get(i, "model returned NaN or infinity for this row")
                code = "model_error" if i in failed else "model_non_finite"
                self._dead_letter(sink, tracker, msg, "infer", code, reason, ids[g])
                continue
            key = msg.key()
            body = dumps(
                {
                    "id": ids[g],
                    "key": key.decode("utf-8", "replace") if key is not None else None,
                    "outputs": {n: c[i] for n, c in zip(names, cols, strict=True)},
                    "model": meta,
                    "pipeline": self.name,
                    "request_ts_ms": msg.timestamp()[1],
                    "timings_ms": timing,
                }
            )
            send(tracker, topic, body, key, _source_headers(msg, ids[g]))
            published += 1
        self.metrics.results.inc(published)

    def _dead_letter(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        msg: Message,
        stage: str,
        code: str,
        reason: str,
        request_id: str | None,
    ) -> None:
        cfg = self.config
        value = msg.value()
        topic, partition, offset = position(msg)
        body = encode_dead_letter(
            pipeline=self.name,
            stage=stage,
            code=code,
            reason=reason,
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp_ms=msg.timestamp()[1],
            key=msg.key(),
            value=value,
            max_value_bytes=cfg.max_record_bytes,
            request_id=request_id,
            worker_version=__version__,
            model=self._model_tag,
        )
        headers = [
            ("streamfer.error_stage", stage.encode()),
            ("streamfer.error_code", code.encode()),
            ("streamfer.error_reason", _header_text(reason)),
            *_source_headers(msg, request_id),
        ]
        sink.send(tracker, cfg.dead_letter_topic, body, msg.key(), headers)
        self.metrics.dead_letters.labels(self.name, code).inc()


def next_offsets(batch: Sequence[Message]) -> dict[PartitionKey, int]:
    """The offset to commit per partition once ``batch`` is done: last offset + 1."""
    offsets: dict[PartitionKey, int] = {}
    for msg in batch:
        topic, partition, offset = position(msg)
        offsets[(topic, partition)] = offset + 1
    return offsets


def _source_headers(msg: Message, request_id: str | None) -> Headers:
    topic, partition, offset = position(msg)
    headers: Headers = [
        ("streamfer.source_topic", topic.encode()),
        ("streamfer.source_partition", str(partition).encode()),
        ("streamfer.source_offset", str(offset).encode()),
    ]
    if request_id is not None:
        headers.insert(0, ("streamfer.request_id", request_id.encode("utf-8", "replace")))
    incoming = cast("list[tuple[str, bytes | None]] | None", msg.headers())
    if incoming:
        for name, value in incoming:
            if name == "traceparent" and value and len(value) <= _TRACEPARENT_MAX:
                headers.append(("traceparent", value))  # W3C trace context carries through
                break
    return headers


_TRACEPARENT_MAX = 128


def _header_text(reason: str) -> bytes:
    return safe_text(reason).encode("ascii")


def _stitch(left: Outputs, right: Outputs, n_left: int, n: int) -> Outputs:
    """Join the outputs of two halves; rows of a failed half hold placeholders."""
    template = left or right
    if not template:
        return {}
    joined: Outputs = {}
    for field, sample in template.items():
        shape = (n, *sample.shape[1:])
        fill = np.nan if sample.dtype.kind == "f" else 0
        out = np.full(shape, fill, dtype=sample.dtype)
        if field in left:
            out[:n_left] = left[field]
        if field in right:
            out[n_left:] = right[field]
        joined[field] = out
    return joined
