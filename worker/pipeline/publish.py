"""A batch's last step, publish, and the dead letters of what the broker refuses after it.

It is a module of its own because it is the one step that writes: every message of a
``Prepared`` batch leaves as a result or a dead letter (``worker.pipeline.dead_letters``)
through ``Sink.send``, with the batch tracker's ``on_delivery`` as its callback. The
results of a batch share one encoded tail (pipeline, timings, model; a canary's rows
name the canary), a row the model refused or could not score becomes an ``infer`` dead
letter, and a result its topic cannot take (too large, or keyless for a compacted topic)
a ``publish`` one. The batch is then offered to the shadow, the tracker sealed, and the
batch kept on it, so a record the broker refuses later is found again and dead-lettered
(``refusal_of``, ``dead_letter_undelivered``). Runs on the third stage thread, and the
refusal side on the loop thread once the batch is sealed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import orjson
from confluent_kafka import Message

from worker.cache import OutputCache
from worker.config import PipelineConfig
from worker.core import DeliveryTracker, Refusal
from worker.inference import ModelIdentity, ModelSlot, finite_rows, row_outputs
from worker.kafka import (
    MAX_RESULT_HEADERS_BYTES,
    NEEDS_A_KEY,
    Sink,
    SourceHeaders,
    position,
    record_size,
    trace_headers,
)
from worker.pipeline.codec import open_objects, result_tail
from worker.pipeline.dead_letters import DeadLetters
from worker.pipeline.metrics import PipelineMetrics
from worker.pipeline.prepare import Prepared
from worker.pipeline.shadow import ShadowBatch, ShadowRunner
from worker.registry import AvroResults

__all__ = ["PublishStep", "Unserved"]

_CACHED = b',"cached":true'
"""Spliced into a result whose outputs came from the output cache."""


@dataclass(frozen=True, slots=True)
class Unserved:
    """The context of a tracker whose records are dead letters of requests never decoded
    (a share group's record on its last delivery): where a dead letter the broker refuses
    for itself finds its request, to be sent again without the original key and value."""

    batch: Sequence[Message]


class PublishStep:
    """Publishes one pipeline's batches; the pipeline's third stage thread."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        slot: ModelSlot,
        dead_letters: DeadLetters,
        metrics: PipelineMetrics,
        cache: OutputCache | None = None,
        shadow: ShadowRunner | None = None,
        avro: AvroResults | None = None,
    ) -> None:
        self._config = config
        self._avro = avro
        self._slot = slot
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._cache = cache
        self._shadow = shadow

    def __call__(self, prepared: Prepared, sink: Sink, tracker: DeliveryTracker) -> None:
        """Send ``prepared``'s results and dead letters, then seal ``tracker``; see
        ``Pipeline.publish``."""
        batch, decoded = prepared.batch, prepared.decoded
        if prepared.model is None:  # published without the infer step: nothing ran
            prepared.model = self._slot.for_batch().identity
        tag = prepared.model.tag
        for rej in decoded.rejections:
            self._dead_letters.send(
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
            self._dead_letters.send(
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
            self._results(sink, tracker, prepared, prepared.model)
            if self._shadow is not None:
                self._offer_shadow(self._shadow, prepared, prepared.model)
        prepared.engine = prepared.candidate_engine = None  # released after their last batch
        tracker.context = prepared  # to dead-letter what the broker refuses after this
        m = self._metrics
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

    def _results(
        self, sink: Sink, tracker: DeliveryTracker, prepared: Prepared, model: ModelIdentity
    ) -> None:
        """A result for every row that reached the model, or the dead letter sent in its
        place."""
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
        shared = {"pipeline": self._config.name, "timings_ms": prepared.timings.as_dict()}
        models = [model]
        split: Iterable[bool] = itertools.repeat(False, len(good))
        if prepared.canary is not None and prepared.candidate is not None:
            models.append(prepared.candidate)
            split = prepared.canary.tolist()
        tails = [result_tail({"model": m.meta, **shared}) for m in models]
        tags = [m.tag for m in models]
        topic = self._config.result_topic
        send = sink.send
        dead_letter = self._dead_letters.send
        headers_of = SourceHeaders().of if self._config.source_headers else trace_headers
        room = sink.limit(topic)
        roomy = room - MAX_RESULT_HEADERS_BYTES
        keyed_only = sink.limit.needs_key(topic)
        avro = self._avro
        metas = [m.meta for m in models]
        instead = 0  # dead letters sent in place of results
        known = tracker.refusals  # results the broker refused on an earlier try
        picked = good.tolist()
        msgs = [batch[rows[g]] for g in picked]
        keys = [msg.key() for msg in msgs]
        docs = [
            {
                "id": ids[g],
                "key": key.decode("utf-8", "replace") if key is not None else None,
                "outputs": out,
                "request_ts_ms": msg.timestamp()[1],
            }
            for g, msg, key, out in zip(picked, msgs, keys, outs, strict=True)
        ]
        bodies = open_objects(docs, "id") if avro is None else []
        rows_out = zip(picked, msgs, keys, docs, marks, split, strict=True)
        for i, (g, msg, key, fields, mark, by_canary) in enumerate(rows_out):
            if refused and i in refused:
                reason = failed.get(i, "model returned NaN or infinity for this row")
                code = "model_error" if i in failed else "model_non_finite"
                tag = tags[by_canary]
                dead_letter(sink, tracker, msg, "infer", code, reason, ids[g], model=tag)
                continue
            rid = ids[g]
            if known and (r := known.get(position(msg))) is not None:
                tag = tags[by_canary]
                dead_letter(
                    sink, tracker, msg, r.stage, r.code, r.reason, rid, bare=r.bare, model=tag
                )
                instead += 1
                continue
            if key is None and keyed_only:  # the broker would refuse its whole batch
                why = f"{topic} cannot take the result: {NEEDS_A_KEY}, and the request has none"
                dead_letter(
                    sink, tracker, msg, "publish", "result_refused", why, rid, model=tags[by_canary]
                )
                instead += 1
                continue
            if avro is None:
                value = bodies[i] + mark + tails[by_canary]
            else:
                try:
                    value = avro.encode({**fields, "model": metas[by_canary], **shared})
                except Exception as exc:  # fastavro's for a value the schema does not take
                    why = f"result does not fit the result schema ({type(exc).__name__}: {exc})"
                    tag = tags[by_canary]
                    dead_letter(
                        sink, tracker, msg, "publish", "result_unencodable", why, rid, model=tag
                    )
                    instead += 1
                    continue
            headers = headers_of(msg, rid)
            # headers are small and bounded: only a large record needs the exact sum
            if (
                len(value) + (len(key) if key is not None else 0) > roomy
                and record_size(value, key, headers) > room
            ) or not send(tracker, topic, value, key, headers):
                size = record_size(value, key, headers)
                why = f"result of {size} bytes with key and headers; {topic} takes {room}"
                tag = tags[by_canary]
                dead_letter(sink, tracker, msg, "publish", "result_too_large", why, rid, model=tag)
                instead += 1
        self._metrics.results.inc(len(good) - len(refused) - instead)

    def refusal_of(
        self, tracker: DeliveryTracker, produced: Message, why: str
    ) -> tuple[Message, Refusal] | str:
        """The request behind a record the broker refused for itself and its dead letter
        (see ``DeadLetters.locate``), or why there is none. Once the batch is sealed."""
        prepared = tracker.context
        if isinstance(prepared, Unserved):
            return self._dead_letters.locate(produced, why, prepared.batch, (), ())
        if not isinstance(prepared, Prepared):
            return f"{produced.topic()}: refused ({why}) and its batch is unknown"
        decoded = prepared.decoded
        return self._dead_letters.locate(produced, why, prepared.batch, decoded.ids, decoded.rows)

    def dead_letter_undelivered(
        self, sink: Sink, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        """Dead-letter the request behind a record the broker refused for itself (see
        ``DeadLetters.undelivered``). Loop thread, once the batch is sealed."""
        prepared = tracker.context
        if isinstance(prepared, Unserved):
            self._dead_letters.undelivered(sink, tracker, produced, why, prepared.batch, (), ())
            return
        if not isinstance(prepared, Prepared):
            tracker.fail(f"{produced.topic()}: refused ({why}) and its batch is unknown")
            return
        decoded = prepared.decoded
        self._dead_letters.undelivered(
            sink,
            tracker,
            produced,
            why,
            prepared.batch,
            decoded.ids,
            decoded.rows,
            model=prepared.model.tag if prepared.model is not None else None,
        )
