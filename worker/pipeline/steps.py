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

``Pipeline`` is what the other layers see: it checks that its parts go together and
builds the three steps from them, each in a module of its own (``worker.pipeline.prepare``,
``worker.pipeline.infer``, ``worker.pipeline.publish``), which the loop's stage threads
then call one after another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import cast

from confluent_kafka import Message

from worker.cache import OutputCache
from worker.config import PipelineConfig
from worker.core import DeliveryTracker, Parked, PartitionKey, Refusal, next_offsets
from worker.errors import ConfigError, SchemaRegistryError
from worker.features import FeatureStore, OneStore, StoreWait
from worker.inference import InferenceEngine, LiveModel, ModelSlot
from worker.kafka import Sink
from worker.ops import PipelineMetrics
from worker.pipeline.canary import Canary
from worker.pipeline.codec import request_id_of
from worker.pipeline.dead_letters import DeadLetters
from worker.pipeline.feeds import BatchFetcher, FeedPlan
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.infer import InferStep
from worker.pipeline.model_faults import ModelFaults, ModelFaultWait
from worker.pipeline.prepare import Prepared, PrepareStep
from worker.pipeline.publish import PublishStep
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.server_outage import ServerOutage
from worker.pipeline.shadow import ShadowRunner
from worker.registry import AvroResults, FramedRequests

__all__ = ["Pipeline", "Prepared"]


class Pipeline:
    """Processes batches for one pipeline config. Called from the worker's loop thread.

    ``slot`` holds the model it serves, ``engine`` named as the config's model at first;
    ``worker.models.reloader`` may swap it between two batches. ``plan`` is how the config's
    features feed that model (``FeedPlan.build``), built once where the model was loaded
    (``worker.models.parts.open_parts``) and fixed for the pipeline's life: every model the
    slot holds is fed by it. ``canary`` scores its share of the records instead; ``shadow``
    is offered every batch once its results are sent.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        store: FeatureStore | BatchFetcher,
        engine: InferenceEngine,
        plan: FeedPlan,
        metrics: PipelineMetrics,
        hooks: BatchHooks | None = None,
        retry_feature_store_s: float | None = 30.0,
        abort: threading.Event | None = None,
        on_feature_store: Callable[[bool, str | None], None] | None = None,
        canary: Canary | None = None,
        shadow: ShadowRunner | None = None,
        cache: OutputCache | None = None,
        framed: FramedRequests | None = None,
        avro_results: AvroResults | None = None,
        on_schema_registry: Callable[[bool, str | None], None] | None = None,
        on_model: Callable[[bool, str | None], None] | None = None,
        on_inference_server: Callable[[bool, str | None], None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.plan = plan
        if hasattr(store, "fetch_all"):
            fetcher: BatchFetcher = cast(BatchFetcher, store)
        else:  # one lookup, from any FeatureStore
            name = config.lookups[0].name if config.lookups else "entity"
            fetcher = OneStore(name, store)
        self.slot = ModelSlot(LiveModel.of(config.model, engine))
        hooks = hooks or BatchHooks()
        if cache is not None and hooks.active:
            raise ConfigError(
                f"pipelines.{self.name}: cache.enabled = true with hooks: hooks see the "
                "whole request, so the model's inputs alone do not decide a result"
            )
        if cache is not None and (canary is not None or shadow is not None):
            raise ConfigError(
                f"pipelines.{self.name}: cache.enabled = true with a canary or shadow: "
                "their rows are compared and published per model, the cache's per input"
            )
        self.metrics = metrics
        self._abort = abort = abort or threading.Event()
        store_wait = StoreWait(
            self.name,
            retry_s=retry_feature_store_s,
            abort=abort,
            errors=metrics.feature_store_errors,
            on_feature_store=on_feature_store or (lambda _ok, _why: None),
        )
        self.dead_letters = DeadLetters(config, metrics)
        registry_wait = None
        if framed is not None:
            registry_wait = StoreWait(
                self.name,
                retry_s=retry_feature_store_s,
                abort=abort,
                errors=metrics.schema_registry_errors,
                on_feature_store=on_schema_registry or (lambda _ok, _why: None),
                outage=SchemaRegistryError,
                what="schema registry",
            )
        self._shape = RequestShape.of(config)
        self.canary = canary
        self.shadow = shadow
        slot = self.slot
        self._prepare = PrepareStep(
            config,
            self.plan,
            store=fetcher,
            store_wait=store_wait,
            slot=slot,
            metrics=metrics,
            cache=cache,
            canary=canary,
            framed=None if framed is None or registry_wait is None else (framed, registry_wait),
        )
        faults = ModelFaults(config.pause_after_model_failures, metrics.model_failed_batches)
        fault_wait = ModelFaultWait(
            self.name,
            abort=abort,
            paused=metrics.model_paused,
            on_model=on_model or (lambda _ok, _why: None),
            model=lambda: slot.for_batch().identity,
        )
        outage = ServerOutage(
            self.name,
            abort=abort,
            on_inference_server=on_inference_server or (lambda _ok, _why: None),
            model=lambda: slot.for_batch().identity,
        )
        self._infer = InferStep(
            slot=slot,
            hooks=hooks,
            metrics=metrics,
            cache=cache,
            canary=canary,
            shadow=shadow,
            faults=(faults, fault_wait),
            outage=outage,
        )
        self._publish = PublishStep(
            config,
            slot=slot,
            dead_letters=self.dead_letters,
            metrics=metrics,
            cache=cache,
            shadow=shadow,
            avro=avro_results,
        )

    def handle(
        self, batch: Sequence[Message], sink: Sink, tracker: DeliveryTracker | None = None
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]:
        """``prepare``, ``infer`` and ``publish`` one batch on the calling thread, which
        waits while the model is at fault (raising ModelFault once ``abort`` is set)."""
        tracker = tracker if tracker is not None else DeliveryTracker()
        prepared = self.prepare(batch)
        while True:
            try:
                self.infer(prepared)
                break
            except Parked as parked:  # nothing else runs on this thread: wait here
                self._abort.wait(parked.after_s)
        self.publish(prepared, sink, tracker)
        return tracker, next_offsets(batch)

    def prepare(self, batch: Sequence[Message]) -> Prepared:
        """Decode and enrich one batch; nothing is produced yet.

        Blocks while the feature store is unreachable, retrying with backoff until it
        answers, ``retry_feature_store_s`` passes or ``abort`` is set; then raises
        FeatureStoreError and nothing of the batch counts as done.
        """
        return self._prepare(batch)

    def infer(self, prepared: Prepared) -> Prepared:
        """Run the model on the rows that reached it; a failing row is isolated by
        bisection and becomes a dead letter, the others still publish. The slot is read
        here, once: the whole batch runs on (and names) one model version.

        Raises ``Parked`` while the model is at fault (``worker.pipeline.model_faults``)
        or its inference server cannot answer (``worker.pipeline.server_outage``):
        nothing of the batch is refused; call ``infer`` with it again after the wait the
        ``Parked`` names, before any other batch of this pipeline. Raises ModelFault (or
        the server's InferenceServerError) on that call once ``abort`` is set."""
        return self._infer(prepared)

    def publish(self, prepared: Prepared, sink: Sink, tracker: DeliveryTracker) -> None:
        """Send a result or dead letter for every message of the batch, then seal the
        tracker. Deliveries complete asynchronously on ``sink``; the tracker says when."""
        self._publish(prepared, sink, tracker)

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
        self.dead_letters.send(
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
