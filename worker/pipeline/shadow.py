"""The shadow model: a candidate scoring a copy of every batch, off the serving path.

After a pipeline has handed a batch's results to the producer, it offers the batch (its
model inputs, the rows' records and what the pipeline published for them) to its
``ShadowRunner``: a bounded queue (``queue_batches``) in front of one thread of its own.
The offer waits at most ``max_delay_ms`` for room (0 by default: never); a batch that
finds the queue full is dropped for the shadow and counted, so a slow shadow falls
behind, never the pipeline. The thread runs the shadow model (and the pipeline's hooks,
which must then be safe to call from two threads) on the same arrays, publishes one
result per row to the shadow topic with its own producer, and compares its labels and
scores with what the pipeline published for the same rows.

Shadow results follow the result schema, plus ``shadows``: the model of the pipeline
they shadow. They are at-least-once, never part of a transaction, and nothing about
them holds a commit up: a shadow model that fails, or results that are not delivered,
are counted and logged, and no record of the pipeline is dead-lettered for it.

Agreement is measured over about the last ``agreement_rows`` rows both models scored
(whole batches): the share whose label is the same (the ``label`` field, or the
highest score's column when there is none) and the mean absolute difference of the
scores (the ``scores`` field, or the first floating output), when both have the same
shape.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from confluent_kafka import Message

from worker.config import PipelineConfig
from worker.core import Deadline, DeliveryTracker
from worker.inference import ModelIdentity, ModelSlot, Outputs
from worker.kafka import Sink, SourceHeaders, trace_headers
from worker.pipeline.codec import result_tail
from worker.pipeline.feeds import Feeds
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.metrics import ShadowMetrics

__all__ = ["Agreement", "ShadowBatch", "ShadowRunner"]

log = logging.getLogger(__name__)

_IDLE_S = 0.05
"""How often an idle shadow thread serves its producer's delivery reports."""
_REPEAT_LOG_S = 60.0


@dataclass(frozen=True, slots=True)
class ShadowBatch:
    """What the shadow needs of one batch; the arrays are the pipeline's (read only)."""

    messages: Sequence[Message]
    """The records of the rows that reached the pipeline's model, in row order."""
    ids: Sequence[str]
    feeds: Feeds
    requests: Sequence[dict[str, Any]]
    """The rows' decoded requests, for the hooks (empty without hooks)."""
    published: Outputs
    """What the pipeline's model (or its canary) gave for the rows."""
    failed: Mapping[int, str]
    """Rows the pipeline's model refused: not compared."""
    shadows: ModelIdentity
    timings_ms: dict[str, float]
    offered_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class _Tally:
    agree: int = 0
    labelled: int = 0
    """Rows compared by label."""
    diff: float = 0.0
    """Sum of absolute score differences."""
    cells: int = 0
    """Score values compared."""

    def __add__(self, other: _Tally) -> _Tally:
        return _Tally(
            self.agree + other.agree,
            self.labelled + other.labelled,
            self.diff + other.diff,
            self.cells + other.cells,
        )

    def __sub__(self, other: _Tally) -> _Tally:
        return _Tally(
            self.agree - other.agree,
            self.labelled - other.labelled,
            self.diff - other.diff,
            self.cells - other.cells,
        )


class Agreement:
    """Label agreement and score difference over a window of recent rows (whole
    batches: the oldest goes once the others hold ``rows`` rows)."""

    def __init__(
        self,
        rows: int,
        set_agreement: Callable[[float], None],
        set_diff: Callable[[float], None],
    ) -> None:
        self._rows = rows
        self._set_agreement = set_agreement
        self._set_diff = set_diff
        self._window: deque[_Tally] = deque()
        self._total = _Tally()

    @property
    def label_share(self) -> float | None:
        t = self._total
        return t.agree / t.labelled if t.labelled else None

    @property
    def score_abs_diff(self) -> float | None:
        t = self._total
        return t.diff / t.cells if t.cells else None

    def add(self, published: Outputs, shadow: Outputs, compared: npt.NDArray[np.bool_]) -> None:
        """One batch: ``compared`` marks the rows both models scored."""
        n = int(compared.sum())
        agree = labelled = cells = 0
        diff = 0.0
        label_p, label_s = _labels(published), _labels(shadow)
        if n and label_p is not None and label_s is not None:
            agree = int((label_p[compared] == label_s[compared]).sum())
            labelled = n
        score_p, score_s = _scores(published), _scores(shadow)
        if n and score_p is not None and score_s is not None and score_p.shape == score_s.shape:
            gap = np.abs(score_p[compared].astype(np.float64) - score_s[compared])
            diff, cells = float(gap.sum()), int(gap.size)
        tally = _Tally(agree, labelled, diff, cells)
        self._window.append(tally)
        self._total += tally
        while (
            len(self._window) > 1 and self._total.labelled - self._window[0].labelled >= self._rows
        ):
            self._total -= self._window.popleft()
        share, mean = self.label_share, self.score_abs_diff
        if share is not None:
            self._set_agreement(share)
        if mean is not None:
            self._set_diff(mean)


def _scores(outputs: Outputs) -> npt.NDArray[Any] | None:
    values = outputs.get("scores")
    if values is None:
        values = next((v for v in outputs.values() if v.dtype.kind == "f"), None)
    if values is None or values.dtype.kind != "f":
        return None
    return values.reshape(len(values), -1)


def _labels(outputs: Outputs) -> npt.NDArray[Any] | None:
    if "label" in outputs:
        return outputs["label"].reshape(len(outputs["label"]), -1)[:, 0]
    scores = _scores(outputs)
    if scores is None or scores.shape[1] < 2:
        return None
    labels: npt.NDArray[Any] = scores.argmax(axis=1)
    return labels


def _finite(outputs: Outputs, n: int) -> npt.NDArray[np.bool_]:
    ok = np.ones(n, dtype=np.bool_)
    for values in outputs.values():
        if values.dtype.kind == "f":
            ok &= np.isfinite(values.reshape(n, -1)).all(axis=1)
    return ok


class ShadowRunner:
    """Runs one pipeline's shadow model on its own thread; ``offer`` is called by the
    thread that publishes the pipeline's batches."""

    def __init__(
        self,
        config: PipelineConfig,
        slot: ModelSlot,
        sink: Sink,
        metrics: ShadowMetrics,
        *,
        hooks: BatchHooks | None = None,
    ) -> None:
        spec = config.shadow
        if spec is None:
            raise ValueError(f"pipeline {config.name!r} has no shadow")
        self.slot = slot
        self._pipeline = config.name
        self._topic = spec.topic
        self._headers_of = SourceHeaders().of if config.source_headers else trace_headers
        self._sink = sink
        self._metrics = metrics
        self._hooks = hooks or BatchHooks()
        self._wait_s = spec.max_delay_ms / 1000.0
        self._queue: queue.Queue[ShadowBatch] = queue.Queue(spec.queue_batches)
        self.agreement = Agreement(
            spec.agreement_rows, metrics.label_agreement.set, metrics.score_abs_diff.set
        )
        self._pending: list[DeliveryTracker] = []
        self._stop = threading.Event()
        self._deadline = Deadline(float("inf"))
        self._logged: dict[str, float] = {}
        self._thread = threading.Thread(
            target=self._run, name=f"streamfer-shadow-{config.name}", daemon=True
        )

    @property
    def wants_requests(self) -> bool:
        return self._hooks.active

    def offer(self, batch: ShadowBatch) -> bool:
        """Queue ``batch`` for the shadow, waiting at most ``max_delay_ms`` for room;
        False (and counted as dropped) when there was none."""
        try:
            self._queue.put(batch, timeout=self._wait_s)
        except queue.Full:
            self._metrics.dropped.inc()
            return False
        return True

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Score what is queued (the worker's last batches), then wait for their
        deliveries, all within ``timeout``; True when the thread ended in time."""
        self._deadline = Deadline.after(timeout)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            try:
                batch = self._queue.get(timeout=_IDLE_S)
            except queue.Empty:
                if self._stop.is_set():
                    break
                self._serve()
                continue
            try:
                self._score(batch)
            except Exception as exc:  # a shadow fault must never reach the pipeline
                self._metrics.failed.inc()
                self._log("error", f"shadow of pipeline {self._pipeline}: {exc!r}")
            self._serve()
            if self._stop.is_set() and self._deadline.passed():
                break
        left = self._sink.flush(self._deadline.remaining())
        self._serve()
        if left:
            log.warning(
                "shadow of pipeline %s: %d results undelivered at stop", self._pipeline, left
            )

    def _score(self, batch: ShadowBatch) -> None:
        live = self.slot.for_batch()
        started = time.perf_counter()
        hooks, requests = self._hooks, list(batch.requests)
        try:
            if hooks.active:
                outputs = hooks.after(
                    requests, live.engine.infer(hooks.before(requests, batch.feeds))
                )
            else:
                outputs = live.engine.infer(batch.feeds)
        except Exception as exc:
            self._metrics.failed.inc()
            self._log(
                "model",
                f"shadow of pipeline {self._pipeline}: model {live.identity.tag} failed on "
                f"a batch of {len(batch.ids)} rows: {exc}",
            )
            return
        infer_ms = (time.perf_counter() - started) * 1000.0
        self._metrics.seconds.observe(infer_ms / 1000.0)
        n = len(batch.ids)
        ok = _finite(outputs, n)
        compared = ok & _finite(batch.published, n)
        if batch.failed:
            compared[list(batch.failed)] = False
        self.agreement.add(batch.published, outputs, compared)
        self._publish(batch, live.identity, outputs, ok, infer_ms)

    def _publish(
        self,
        batch: ShadowBatch,
        model: ModelIdentity,
        outputs: Outputs,
        ok: npt.NDArray[np.bool_],
        infer_ms: float,
    ) -> None:
        tail = result_tail(
            {
                "model": model.meta,
                "pipeline": self._pipeline,
                "timings_ms": {**batch.timings_ms, "infer_ms": infer_ms},
                "shadows": batch.shadows.meta,
            }
        )
        names = list(outputs)
        columns = [outputs[name].tolist() for name in names]
        tracker = DeliveryTracker(self._pipeline)
        send, dumps, topic, headers_of = (
            self._sink.send,
            orjson.dumps,
            self._topic,
            self._headers_of,
        )
        for i, (msg, rid) in enumerate(zip(batch.messages, batch.ids, strict=True)):
            if not ok[i]:
                continue
            key = msg.key()
            head = dumps(
                {
                    "id": rid,
                    "key": key.decode("utf-8", "replace") if key is not None else None,
                    "outputs": {name: col[i] for name, col in zip(names, columns, strict=True)},
                    "request_ts_ms": msg.timestamp()[1],
                }
            )
            send(tracker, topic, head[:-1] + tail, key, headers_of(msg, rid))
        tracker.seal()
        self._pending.append(tracker)

    def _serve(self) -> None:
        """Serve delivery reports; count the batches whose results are all answered."""
        self._sink.poll(0)
        still = []
        for tracker in self._pending:
            if not tracker.done:
                still.append(tracker)
            elif tracker.errors or tracker.refused:
                self._metrics.failed.inc()
                why = tracker.errors[0] if tracker.errors else "refused"
                self._log("delivery", f"shadow of pipeline {self._pipeline}: not delivered: {why}")
            else:
                self._metrics.done.inc()
        self._pending = still

    def _log(self, kind: str, text: str) -> None:
        """Log a kind of failure once a minute at most: a broken shadow fails every batch."""
        now = time.monotonic()
        if now - self._logged.get(kind, -_REPEAT_LOG_S) >= _REPEAT_LOG_S:
            self._logged[kind] = now
            log.error("%s (logged once a minute at most)", text)
