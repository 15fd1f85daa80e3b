"""A batch's last step, publish, and the dead letters of what the broker refuses after it.

It is a module of its own because it is the one step that writes: every message of a
``Scored`` batch (``worker.pipeline.values``) leaves as a result or a dead letter
(``worker.pipeline.dead_letters``) through ``Sink.send``, with the batch tracker's
``on_delivery`` as its callback. The results of a batch share one encoded tail
(pipeline, timings, model; a canary's rows name the canary), a row the model refused or
could not score becomes an ``infer`` dead letter, and a result its topic cannot take
(too large, or keyless for a compacted topic) a ``publish`` one. The batch is then
offered to the shadow, and what was published (``worker.core.Published``: the records,
the requests' ids and rows, the model) kept on the tracker before it is sealed, so a
record the broker refuses later is found again and dead-lettered (``refusal_of``,
``dead_letter_undelivered``). Runs on the third stage thread, and the refusal side on
the loop thread once the batch is sealed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np
import orjson
from confluent_kafka import Message

from worker.cache import OutputCache
from worker.config import PipelineConfig
from worker.core import DeliveryTracker, Published, Refusal
from worker.inference import ModelIdentity, finite_rows, row_outputs
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
from worker.pipeline.result_format import ResultFields
from worker.pipeline.shadow import ShadowBatch, ShadowRunner
from worker.pipeline.values import Scored
from worker.registry import AvroResults

__all__ = ["PublishStep"]

_CACHED = b',"cached":true'
"""Spliced into a result whose outputs came from the output cache."""


class PublishStep:
    """Publishes one pipeline's batches; the pipeline's third stage thread."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        dead_letters: DeadLetters,
        metrics: PipelineMetrics,
        cache: OutputCache | None = None,
        shadow: ShadowRunner | None = None,
        avro: AvroResults | None = None,
    ) -> None:
        self._config = config
        self._avro = avro
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._cache = cache
        self._shadow = shadow
        self._fields = ResultFields(config)

    def __call__(self, scored: Scored, sink: Sink, tracker: DeliveryTracker) -> None:
        """Send ``scored``'s results and dead letters, then seal ``tracker``; see
        ``Pipeline.publish``."""
        rows = scored.rows
        batch, decoded = rows.batch, rows.decoded
        model = scored.model.identity
        tag = model.tag
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
        for r, code, reason in rows.rejected:
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
        if len(rows.good):
            self._results(sink, tracker, scored, model)
            if self._shadow is not None:
                self._offer_shadow(self._shadow, scored, model)
        # to dead-letter what the broker refuses after this; the engines are let go with
        # ``scored`` once the stage is done with it
        tracker.published = Published(batch, decoded.ids, decoded.rows, tag)
        m = self._metrics
        m.records.inc(len(batch))
        m.batches.inc()
        m.batch_size.observe(len(batch))
        tracker.seal()
        if self._cache is not None and scored.settled is not None:
            self._cache.share(scored.settled)  # while the deliveries are on their way

    def _offer_shadow(self, shadow: ShadowRunner, scored: Scored, model: ModelIdentity) -> None:
        """Hand the shadow its copy of the batch (after this batch's results are sent)."""
        rows = scored.rows
        batch, at, ids = rows.batch, rows.decoded.rows, rows.decoded.ids
        good = rows.good.tolist()
        shadow.offer(
            ShadowBatch(
                messages=[batch[at[g]] for g in good],
                ids=[ids[g] for g in good],
                feeds=scored.feeds or {},
                requests=scored.requests,
                published=scored.outputs,
                failed=scored.failed,
                shadows=model,
                timings_ms=scored.timings.as_dict(),
            )
        )

    def _results(
        self, sink: Sink, tracker: DeliveryTracker, scored: Scored, model: ModelIdentity
    ) -> None:
        """A result for every row that reached the model, or the dead letter sent in its
        place."""
        at = scored.rows
        batch, good, failed = at.batch, at.good, scored.failed
        rows, ids = at.decoded.rows, at.decoded.ids
        refused, outs, marks = _answers(scored, len(good))
        # What every result of the batch shares is encoded once: the body is the
        # per-record part with this tail spliced in before its closing brace.
        # A canary's rows name it: a second shared tail, picked per row by the split.
        fields_of = self._fields
        shared = fields_of.shared(scored.timings)
        models = [model]
        split: Iterable[bool] = itertools.repeat(False, len(good))
        if at.canary is not None and scored.candidate is not None:
            models.append(scored.candidate.identity)
            split = at.canary.tolist()
        metas = [fields_of.model(m) for m in models]
        tails = [result_tail({"model": meta, **shared}) for meta in metas]
        tags = [m.tag for m in models]
        topic = self._config.result_topic
        send = sink.send
        dead_letter = self._dead_letters.send
        headers_of = SourceHeaders().of if self._config.source_headers else trace_headers
        room = sink.limit(topic)
        roomy = room - MAX_RESULT_HEADERS_BYTES
        keyed_only = sink.limit.needs_key(topic)
        avro = self._avro
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
        published = tracker.published
        if published is None:
            return f"{produced.topic()}: refused ({why}) and its batch is unknown"
        return self._dead_letters.locate(
            produced, why, published.batch, published.ids, published.rows
        )

    def dead_letter_undelivered(
        self, sink: Sink, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        """Dead-letter the request behind a record the broker refused for itself (see
        ``DeadLetters.undelivered``). Loop thread, once the batch is sealed."""
        published = tracker.published
        if published is None:
            tracker.fail(f"{produced.topic()}: refused ({why}) and its batch is unknown")
            return
        self._dead_letters.undelivered(
            sink,
            tracker,
            produced,
            why,
            published.batch,
            published.ids,
            published.rows,
            model=published.model,
        )


def _answers(scored: Scored, n: int) -> tuple[set[int], Iterable[object], Iterable[bytes]]:
    """Of the batch's ``n`` rows that reached the model: those it refused (a failed row,
    or a non-finite answer), each row's outputs, and the mark spliced into a result the
    output cache served."""
    cached = scored.settled
    if cached is None:
        finite = finite_rows(scored.outputs, n)
        for i in scored.failed:
            finite[i] = False
        refused = set(np.flatnonzero(~finite).tolist())
        return refused, row_outputs(scored.outputs, n), itertools.repeat(b"", n)
    refused = {i for i, value in enumerate(cached.encoded) if value is None}
    outs = [None if v is None else orjson.Fragment(v) for v in cached.encoded]
    return refused, outs, [_CACHED if hit else b"" for hit in cached.reused]
