"""A pipeline's dead letters: built to fit their topic, and sent again bare if refused.

A record that cannot be served becomes a dead letter naming its stage, code and reason,
with as much of the original key and value as fits what the dead-letter topic takes
(``worker.pipeline.codec.encode_dead_letter``). A record the broker refuses after it was sent (a
result too large or invalid for its topic, or a dead letter itself) is found again in
its batch and dead-lettered; a dead letter refused even without the original key and
value fails its batch, since the dead-letter topic itself is misconfigured. In
exactly-once mode such a refusal aborts the transaction instead: ``locate`` makes it a
``Refusal``, and the batch's next try sends that dead letter in place of the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import orjson
from confluent_kafka import Message

from worker.config import PipelineConfig
from worker.core import DeliveryTracker, Refusal, __version__
from worker.kafka import Headers, Sink, SourceHeaders, headers_size, position, reason_header
from worker.pipeline.codec import encode_dead_letter
from worker.pipeline.metrics import PipelineMetrics

__all__ = ["DeadLetters"]


class DeadLetters:
    """Sends one pipeline's dead letters; called from whichever thread publishes."""

    def __init__(self, config: PipelineConfig, metrics: PipelineMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._model_tag = f"{config.model.name}:{config.model.version}"

    def send(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        msg: Message,
        stage: str,
        code: str,
        reason: str,
        request_id: str | None,
        *,
        bare: bool = False,
        model: str | None = None,
        delivery_count: int | None = None,
    ) -> None:
        """Send the dead letter of ``msg``, sized to what its topic takes; ``bare`` leaves
        the original key and value out (the dead letter itself was refused). ``model``
        (``name:version``) names the model version of the batch; default: the config's.
        ``delivery_count``: a share group's deliveries of ``msg``, written into the dead
        letter. A request in ``tracker.refusals`` gets the dead letter recorded there
        instead."""
        cfg = self._config
        topic = cfg.dead_letter_topic
        source_topic, partition, offset = where = position(msg)
        known = tracker.refusals.get(where) if tracker.refusals else None
        if known is not None:  # the broker refused this request's record on a try before
            stage, code, reason = known.stage, known.code, known.reason
            request_id, bare = known.request_id, bare or known.bare
        headers: Headers = [
            ("streamfer.error_stage", stage.encode()),
            ("streamfer.error_code", code.encode()),
            ("streamfer.error_reason", reason_header(reason)),
            *SourceHeaders().of(msg, request_id),
        ]
        body, key = encode_dead_letter(
            pipeline=cfg.name,
            stage=stage,
            code=code,
            reason=reason,
            topic=source_topic,
            partition=partition,
            offset=offset,
            timestamp_ms=msg.timestamp()[1],
            key=None if bare else msg.key(),
            value=None if bare else msg.value(),
            max_value_bytes=cfg.max_record_bytes,
            request_id=request_id,
            worker_version=__version__,
            model=model or self._model_tag,
            max_bytes=sink.limit(topic) - headers_size(headers),
            delivery_count=delivery_count,
        )
        if not sink.send(tracker, topic, body, key, headers):
            tracker.sent += 1
            tracker.refused_by_producer(
                topic, f"a dead letter of {len(body)} bytes is too large for this topic"
            )
        self._metrics.dead_letters.labels(cfg.name, code).inc()

    def undelivered(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        produced: Message,
        why: str,
        batch: Sequence[Message],
        ids: Sequence[str],
        rows: Sequence[int],
        *,
        model: str | None = None,
    ) -> None:
        """Dead-letter the request behind ``produced``, a record the broker refused for
        itself (see ``locate``); ``model`` names the batch's model version, as ``send``'s.
        Call only from the thread that serves deliveries, once the batch is sealed."""
        found = self.locate(produced, why, batch, ids, rows)
        if isinstance(found, str):
            tracker.fail(found)
            return
        request, r = found
        stage, code, reason, rid = r.stage, r.code, r.reason, r.request_id
        self.send(sink, tracker, request, stage, code, reason, rid, bare=r.bare, model=model)

    def locate(
        self,
        produced: Message,
        why: str,
        batch: Sequence[Message],
        ids: Sequence[str],
        rows: Sequence[int],
    ) -> tuple[Message, Refusal] | str:
        """The request behind ``produced``, a record the broker refused for itself, and the
        dead letter it gets instead, found in ``batch`` from the refused record's body
        (delivery reports carry no headers): a result by its request id and key, a dead
        letter by its source. A string: why it cannot be dead-lettered."""
        topic = cast(str, produced.topic())
        try:
            doc = orjson.loads(produced.value() or b"null")
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            if topic != self._config.dead_letter_topic:
                rid = doc.get("id")
                matches = [batch[rows[g]] for g, i in enumerate(ids) if i == rid]
                request = next((m for m in matches if m.key() == produced.key()), None)
                if request is not None:
                    reason = f"{topic} refused the result: {why}"
                    return request, Refusal(
                        position(request), "publish", "result_refused", reason, rid
                    )
            elif doc.get("key_b64") is None and doc.get("value_b64") is None:
                return f"{topic} refuses even a bare dead letter: {why}"
            else:
                src = doc.get("source") or {}
                at = (src.get("partition"), src.get("offset"))
                request = next((m for m in batch if (m.partition(), m.offset()) == at), None)
                if request is not None:
                    stage = doc.get("stage", "publish")
                    code = doc.get("code", "dead_letter_refused")
                    reason = f"{why}; the original key and value are left out"
                    rid = doc.get("request_id")
                    return request, Refusal(position(request), stage, code, reason, rid, True)
        return f"{topic}: refused ({why}) and its request cannot be found"
