"""One pipeline: decode → enrich → infer → publish for one closed batch.

``Pipeline.handle`` turns a batch of consumed messages into produced results and dead
letters and returns the delivery tracker and next offsets for the committer. Bad
records never raise: each becomes a dead letter naming its stage and reason. A model
that fails on a batch is retried on halves until the failing rows are isolated, so the
other rows still publish. With an output cache (``worker.cache.output_cache``), rows
whose inputs it holds skip the model and their results say ``"cached": true``. With a
canary (``worker.pipeline.canary``) the batch's rows are split while decoding and the
infer step makes two engine calls; with a shadow (``worker.pipeline.shadow``) the batch
is offered to it once its results are sent. The cache serves pipelines without a canary
or shadow (the config refuses the pair).

``Pipeline`` is what the other layers see. It takes its three steps built, each from a
module of its own (``worker.pipeline.prepare``, ``worker.pipeline.infer``,
``worker.pipeline.publish``); ``worker.compose.build_pipeline`` builds them from a
pipeline's parts. The loop's stage threads call the steps one after another. Each step
hands the next a value of its own type (``worker.pipeline.values``): ``Enriched``
(decoded and enriched), ``Scored`` (what the model answered); publish leaves
``worker.core.Published`` on the batch's tracker.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from worker.config import PipelineConfig
from worker.core import DeliveryTracker, Parked, PartitionKey, Refusal, next_offsets
from worker.inference import ModelSlot
from worker.kafka import Sink
from worker.pipeline.codec import request_id_of
from worker.pipeline.dead_letters import DeadLetters
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.infer import InferStep
from worker.pipeline.metrics import PipelineMetrics
from worker.pipeline.prepare import PrepareStep
from worker.pipeline.publish import PublishStep
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.values import Enriched, Scored

__all__ = ["Pipeline", "Steps"]


@dataclass(frozen=True, slots=True)
class Steps:
    """A pipeline's three steps, built from its parts (``worker.compose.build_pipeline``)."""

    prepare: PrepareStep
    infer: InferStep
    publish: PublishStep


class Pipeline:
    """Processes batches for one pipeline config. Each step is called from its own stage
    thread (``worker.loop.threads``), one batch at a time, and hands the next an immutable
    value (``worker.pipeline.values``); ``handle`` runs all three on the calling thread.

    ``slot`` holds the model it serves (the one its steps read); ``worker.models.reloader``
    may swap it between two batches. ``plan`` is how the config's features feed that model
    (``FeedPlan.build``), built once where the model was loaded
    (``worker.models.parts.open_parts``) and fixed for the pipeline's life: every model the
    slot holds is fed by it. ``dead_letters`` sends those of requests never served (the
    publish step sends the rest with the same); ``abort`` ends ``handle``'s wait for a
    model at fault.
    """

    def __init__(
        self,
        config: PipelineConfig,
        steps: Steps,
        *,
        slot: ModelSlot,
        plan: FeedPlan,
        metrics: PipelineMetrics,
        dead_letters: DeadLetters,
        abort: threading.Event,
    ) -> None:
        self.config = config
        self.name = config.name
        self.slot = slot
        self.plan = plan
        self.metrics = metrics
        self._dead_letters = dead_letters
        self._shape = RequestShape.of(config)
        self._abort = abort
        self._prepare = steps.prepare
        self._infer = steps.infer
        self._publish = steps.publish

    def handle(
        self, batch: Sequence[Message], sink: Sink, tracker: DeliveryTracker | None = None
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]:
        """``prepare``, ``infer`` and ``publish`` one batch on the calling thread, which
        waits while the model is at fault (raising ModelFault once ``abort`` is set)."""
        tracker = tracker if tracker is not None else DeliveryTracker()
        enriched = self.prepare(batch)
        while True:
            try:
                scored = self.infer(enriched)
                break
            except Parked as parked:  # nothing else runs on this thread: wait here
                self._abort.wait(parked.after_s)
        self.publish(scored, sink, tracker)
        return tracker, next_offsets(batch)

    def prepare(self, batch: Sequence[Message]) -> Enriched:
        """Decode and enrich one batch; nothing is produced yet.

        Blocks while the feature store is unreachable, retrying with backoff until it
        answers, ``retry_feature_store_s`` passes or ``abort`` is set; then raises
        FeatureStoreError and nothing of the batch counts as done.
        """
        return self._prepare(batch)

    def infer(self, enriched: Enriched) -> Scored:
        """Run the model on the rows that reached it; a failing row is isolated by
        bisection and becomes a dead letter, the others still publish. The slot is read
        here, once: the whole batch runs on (and names) one model version.

        Raises ``Parked`` while the model is at fault (``worker.pipeline.model_faults``)
        or its inference server cannot answer (``worker.pipeline.server_outage``):
        nothing of the batch is refused; call ``infer`` with it again after the wait the
        ``Parked`` names, before any other batch of this pipeline. Raises ModelFault (or
        the server's InferenceServerError) on that call once ``abort`` is set."""
        return self._infer(enriched)

    def publish(self, scored: Scored, sink: Sink, tracker: DeliveryTracker) -> None:
        """Send a result or dead letter for every message of the batch, keep what was
        published on the tracker (``tracker.published``) and seal it. Deliveries complete
        asynchronously on ``sink``; the tracker says when."""
        self._publish(scored, sink, tracker)

    def dead_letter_unserved(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        msg: Message,
        code: str,
        reason: str,
        *,
        delivery_count: int | None = None,
    ) -> None:
        """Dead-letter a request that is not served at all (stage ``consume``): a share
        group's record on its last allowed delivery, say (``delivery_count``). Nothing of
        it is decoded beyond its id; the caller seals ``tracker``."""
        rid = request_id_of(msg.value(), self._shape, self.config.max_record_bytes)
        self._dead_letters.send(
            sink, tracker, msg, "consume", code, reason, rid, delivery_count=delivery_count
        )

    def refusal_of(
        self, tracker: DeliveryTracker, produced: Message, why: str
    ) -> tuple[Message, Refusal] | str:
        """The request behind a record the broker refused for itself and its dead letter
        (see ``DeadLetters.locate``), or why there is none. Once the batch is sealed."""
        return self._publish.refusal_of(tracker, produced, why)

    def dead_letter_undelivered(
        self, sink: Sink, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        """Dead-letter the request behind a record the broker refused for itself (see
        ``DeadLetters.undelivered``). Loop thread, once the batch is sealed."""
        self._publish.dead_letter_undelivered(sink, tracker, produced, why)
