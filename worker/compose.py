"""The composition root: the real parts of a worker, built from its config.

Every model is loaded and warmed and Redis checked before the group is joined, so a
worker that cannot serve never takes partitions. ``build_worker`` builds the pipelines
and the group's client: a consumer (``ConsumerClient``) or, with ``[kafka] share_group =
true``, a share consumer (``ShareClient``). ``wire_worker``, the one wiring path, builds
the loop's parts around either, each once and after the parts it needs, so nothing is
wired late, and returns the one ``Worker``. Tests call it with fakes.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Message, ShareConsumer
from prometheus_client import CollectorRegistry

from worker.cache import CacheFamilies, open_cache
from worker.config import PipelineConfig, WorkerConfig
from worker.core import Clock, monotonic_clock, wall_clock
from worker.delivery import (
    AtLeastOnce,
    BatchGate,
    Committer,
    Delivery,
    DeliveryFamilies,
    RefusedRecords,
    ReportPolling,
    RewindGate,
    Stages,
    Transactional,
)
from worker.features import RedisLookups
from worker.inference import ModelSlot, ServingEngine
from worker.kafka import (
    LINGER_MS,
    LOW_LATENCY_LINGER_MS,
    CallWatch,
    ChildGroupReader,
    GroupCoverage,
    RecordLimits,
    ShareGroupSettings,
    ShareSource,
    Sink,
    Source,
    child_settings,
    consumer_config,
    prepare_share_group,
    share_consumer_config,
    transactional_producer,
    verify_isolation,
)
from worker.loop import (
    Background,
    Batcher,
    BatchSteps,
    ConsumerEvents,
    ConsumerGroup,
    ConsumerParts,
    Group,
    LockGate,
    LoopFamilies,
    Membership,
    PausingManager,
    RetiredBatches,
    ShareEvents,
    ShareGroup,
    ShareParts,
    StageThreads,
    Worker,
    bind_lane_gauges,
    lane_threads,
    pipeline_shares,
    share_fetch_options,
)
from worker.models import (
    LoadedModel,
    ModelFamilies,
    ModelWatch,
    Reloader,
    build_pipeline,
    load_candidates,
    open_parts,
    show_model,
    when_served,
)
from worker.ops import HealthState, OpsFamilies
from worker.pipeline import (
    BatchHooks,
    Canary,
    FeedPlan,
    Pipeline,
    PipelineFamilies,
    ShadowRunner,
    result_encoder,
)
from worker.registry import FramedRequests, framed_decoders, needs_registry, open_registry

__all__ = [
    "ConsumerClient",
    "Metrics",
    "ShareClient",
    "build_worker",
    "producer_linger_ms",
    "wire_worker",
]

log = logging.getLogger(__name__)


class Metrics(
    OpsFamilies, CacheFamilies, PipelineFamilies, ModelFamilies, DeliveryFamilies, LoopFamilies
):
    """Everything a worker exports: every unit's families (each declared in that unit's
    ``metrics`` module), built on one registry. It is each of them, so a part is handed
    this and sees only its own unit's families."""


def build_worker(
    config: WorkerConfig,
    registry: CollectorRegistry | None = None,
    health: HealthState | None = None,
    reload_requests: threading.Event | None = None,
) -> Worker:
    """Build real parts; load and warm every model before the group is joined.

    The worker's ``Reloader`` watches the pipelines whose ``model.watch`` is on and looks
    at every pipeline's model whenever ``reload_requests`` is set (SIGHUP, POST /reload).
    Blocks while a pipeline's inference server cannot answer yet (``when_served``).
    Raises ConfigError (including a broker without working transactions in
    exactly-once mode), EngineError or FeatureStoreError.
    """
    metrics = Metrics(registry)
    health = health or HealthState(liveness_timeout_s=config.liveness_timeout_s)
    abort = threading.Event()

    loaded = [
        when_served(  # a pipeline whose server cannot answer yet waits for it
            functools.partial(_load, p, config, metrics),
            pipeline=p.name,
            on_inference_server=health.inference_server_for(p.name),
        )
        for p in config.pipelines
    ]
    # The models are loaded: /healthz answers 200 from here, while the Kafka clients wait
    # for the cluster's metadata (their timeouts, not a model, hold start-up up then).
    health.models_loaded = True
    health.turned()
    shadow_topics = [p.shadow.topic for p in config.pipelines if p.shadow is not None]
    outputs = [t for p in config.pipelines for t in (p.result_topic, p.dead_letter_topic)]
    limits = RecordLimits.read(config.kafka, outputs + shadow_topics)
    schema_registry = open_registry(config.schema_registry) if needs_registry(config) else None
    decoders = framed_decoders(config, schema_registry)
    pipelines = []
    watches = []
    background: list[Background] = []
    for p, parts in zip(config.pipelines, loaded, strict=True):
        served = _PipelineParts(config, limits, metrics, health, abort, schema_registry, decoders)
        pipeline, watch, shadow = served.build(p, parts)
        pipelines.append(pipeline)
        watches.append(watch)
        if shadow is not None:
            background.append(shadow)
    background.insert(0, Reloader(watches, requests=reload_requests))
    calls = CallWatch(on_stall=health.call_stalled)
    sink = _open_sink(config, limits, calls)
    sink.warm_up(outputs)
    client = (
        _share_client(config, metrics, health)
        if config.kafka.share_group
        else _consumer_client(config, metrics, health, background)
    )
    return wire_worker(
        config,
        client=client,
        sink=sink,
        pipelines=pipelines,
        metrics=metrics,
        health=health,
        abort=abort,
        background=background,
        calls=calls,
    )


class _PipelineParts(NamedTuple):
    """What every pipeline of a worker is built with, beside its own loaded parts."""

    config: WorkerConfig
    limits: RecordLimits
    metrics: Metrics
    health: HealthState
    abort: threading.Event
    schema_registry: Any | None
    """``open_registry``'s client, where a pipeline's formats need one."""
    decoders: Mapping[str, FramedRequests]

    def build(
        self, p: PipelineConfig, parts: _Loaded
    ) -> tuple[Pipeline, ModelWatch, ShadowRunner | None]:
        """``p``'s pipeline with its shadow (a producer of its own, never transactional),
        output cache and canary, and the reloader's watch on its model."""
        config, metrics, health = self.config, self.metrics, self.health
        shadow = None
        if parts.shadow is not None and p.shadow is not None:
            shadow_sink = Sink.from_settings(config.kafka, self.limits)  # never transactional
            shadow_sink.warm_up([p.shadow.topic])
            shadow = ShadowRunner(
                p, parts.shadow, shadow_sink, metrics.for_shadow(p.name), hooks=parts.hooks
            )
        cache = open_cache(p, config.redis, metrics, parts.engine)
        pipeline = build_pipeline(
            p,
            store=parts.store,
            engine=parts.engine,
            plan=parts.plan,
            metrics=metrics.for_pipeline(p.name),
            hooks=parts.hooks,
            retry_feature_store_s=config.feature_store_retry_s,
            abort=self.abort,
            on_feature_store=health.feature_store,
            canary=parts.canary,
            shadow=shadow,
            cache=cache,
            framed=self.decoders.get(p.name),
            avro_results=result_encoder(p, self.schema_registry, parts.engine, parts.plan),
            on_schema_registry=health.schema_registry,
            on_model=health.model_for(p.name),
            on_inference_server=health.inference_server_for(p.name),
        )
        identity = pipeline.slot.for_batch().identity
        shown = show_model(metrics, p.name, identity, parts.engine.providers[0], hide=None)
        serving = LoadedModel(parts.engine, pipeline.plan)
        on_swap = cache.serve if cache is not None else None
        watch = ModelWatch(p, pipeline.slot, serving, metrics, shown=shown, on_swap=on_swap)
        return pipeline, watch, shadow


def _open_sink(config: WorkerConfig, limits: RecordLimits, calls: CallWatch) -> Sink:
    """The producer: transactional in exactly-once mode, once the broker is seen to hide
    aborted records (``verify_isolation``, unless ``exactly_once_probe = false``)."""
    if config.delivery != "exactly-once":
        return Sink.from_settings(config.kafka, limits, linger_ms=producer_linger_ms(config))
    if config.exactly_once_probe:
        verify_isolation(config.kafka, topic=config.exactly_once_probe_topic, calls=calls)
    else:
        log.warning(
            "exactly_once_probe = false: starting without proof that this broker hides "
            "aborted records from read_committed readers"
        )
    return Sink(transactional_producer(config.kafka, limits, calls=calls), limits)


class ConsumerClient(NamedTuple):
    """A consumer group's client, made with ``events``' callbacks."""

    consumer: Consumer
    events: ConsumerEvents
    rejoin: threading.Event | None = None
    """Set when a static member should leave and join again (``GroupCoverage``)."""


class ShareClient(NamedTuple):
    """A share group's client, made with ``events``' callbacks, and the group's limits."""

    consumer: ShareConsumer
    events: ShareEvents
    group: ShareGroupSettings


def _consumer_client(
    config: WorkerConfig, metrics: Metrics, health: HealthState, background: list[Background]
) -> ConsumerClient:
    """The consumer with its callbacks (``read_committed`` in exactly-once mode), and the
    coverage check of a static member."""
    events = ConsumerEvents(health, metrics)
    consumer_settings = consumer_config(
        config.kafka,
        on_commit=events.on_commit,
        on_error=events.on_error,
        on_stats=events.on_stats,
        statistics_interval_ms=config.statistics_interval_ms,
        read_committed=config.delivery == "exactly-once",
    )
    if any(config.in_flight_share(p) is not None for p in config.pipelines):
        given = {**config.kafka.options, **config.kafka.consumer_options}
        consumer_settings.update(share_fetch_options(given))
    consumer = Consumer(consumer_settings)
    return ConsumerClient(consumer, events, _watch_coverage(config, metrics, background))


def _share_client(config: WorkerConfig, metrics: Metrics, health: HealthState) -> ShareClient:
    """The share consumer: the group made to start where ``auto_offset_reset`` says and
    its limits read (``prepare_share_group``), a poll of at most the in-flight bound.
    Raises ConfigError where the broker serves no share groups or the start cannot be
    set."""
    group = prepare_share_group(config.kafka)
    route = {t: p.name for p in config.pipelines for t in p.request_topics}
    events = ShareEvents(health, metrics, config.kafka.group_id, route)
    consumer = ShareConsumer(
        share_consumer_config(
            config.kafka,
            max_poll_records=config.in_flight_bound,
            on_error=events.on_error,
            on_stats=events.on_stats,
            statistics_interval_ms=config.statistics_interval_ms,
        )
    )
    log.info(
        "share group %s: up to %d records per poll, a record's last delivery is its %dth, "
        "its lock lasts %gs; results are not in partition order, and a batch is cut from "
        "one poll (max_wait_ms does not apply)",
        config.kafka.group_id,
        config.in_flight_bound,
        group.delivery_count_limit,
        group.record_lock_s,
    )
    return ShareClient(consumer, events, group)


def wire_worker(
    config: WorkerConfig,
    *,
    client: ConsumerClient | ShareClient,
    sink: Sink,
    pipelines: Sequence[Pipeline],
    metrics: Metrics,
    health: HealthState,
    abort: threading.Event | None = None,
    background: Sequence[Background] = (),
    calls: CallWatch | None = None,
    clock: Clock = monotonic_clock,
    wall: Clock = wall_clock,
) -> Worker:
    """The ``Worker`` around ``client`` and ``sink``: the stage gate of the group's kind,
    the processing threads running ``BatchSteps``, the group (``ConsumerGroup`` or
    ``ShareGroup``) and the lane gauges, in that order, each handed what it needs.
    ``calls`` runs exactly-once's transactional calls (a ``CallWatch`` reporting stalls to
    ``health`` by default). ``clock`` times every wait and window; ``wall`` ages records
    by their timestamps."""
    abort = abort or threading.Event()
    by_name = {p.name: p for p in pipelines}
    rank = {p.name: p.config.rank for p in pipelines}

    def stage_threads(gate: BatchGate) -> StageThreads:
        return lane_threads(BatchSteps(by_name, sink, gate), rank, config, metrics)

    group: Group
    shared: list[str] = []
    if isinstance(client, ShareClient):
        lock = LockGate(sink, clock, min(1.0, client.group.record_lock_s * 0.05))
        threads = stage_threads(lock)
        refused = RefusedRecords(sink, by_name)
        source = ShareSource(
            client.consumer,
            [t for p in pipelines for t in p.config.request_topics],
            on_acknowledged=client.events.on_acknowledged,
        )
        share_metrics = {p.name: metrics.for_share(p.name) for p in pipelines}
        events, settings = client.events, client.group
        parts = ShareParts(
            source, sink, threads, refused, by_name, events, settings, share_metrics, lock
        )
        group = ShareGroup(config=config, parts=parts, clock=clock)
    else:
        rewind = RewindGate() if config.delivery == "exactly-once" else None
        threads = stage_threads(rewind if rewind is not None else ReportPolling(sink))
        consumer_parts = _consumer_parts(
            config, client, sink, pipelines, threads, rewind, metrics, health, calls, clock, wall
        )
        shared = list(consumer_parts.shared)
        group = ConsumerGroup(
            config=config, parts=consumer_parts, abort=abort, clock=clock, wall=wall
        )
    bind_lane_gauges(metrics, pipelines, group.records_of, shared)
    metrics.ready.set_function(lambda: 0.0 if health.not_ready_reasons() else 1.0)
    return Worker(
        config=config,
        group=group,
        threads=threads,
        health=health,
        abort=abort,
        background=background,
    )


def _consumer_parts(
    config: WorkerConfig,
    client: ConsumerClient,
    sink: Sink,
    pipelines: Sequence[Pipeline],
    threads: StageThreads,
    rewind: RewindGate | None,
    metrics: Metrics,
    health: HealthState,
    calls: CallWatch | None,
    clock: Clock,
    wall: Clock,
) -> ConsumerParts:
    """A consumer group's parts around ``threads``: its batchers, committer, source,
    pausing, delivery mode (``Transactional`` where ``rewind`` gates the stages, else
    ``AtLeastOnce``) and membership, in that order."""
    consumer, events = client.consumer, client.events
    by_name = {p.name: p for p in pipelines}
    batchers: dict[str, Batcher[Message]] = {
        p.name: Batcher(p.config.batch, clock) for p in pipelines
    }
    committer = Committer(
        consumer,
        answers=events.on_commit,
        transactional=rewind is not None,
        on_done=RetiredBatches({p.name: p.metrics for p in pipelines}, wall=wall),
        on_rejected=metrics.commit_failures.inc,
        clock=clock,
        interval=config.commit_interval_ms / 1000.0,
    )
    source = Source(
        consumer,
        [t for p in pipelines for t in p.config.request_topics],
        pin_latest=config.kafka.auto_offset_reset == "latest",
        rejoin=client.rejoin,
    )
    shares = pipeline_shares(config, pipelines)
    pausing = PausingManager(
        source,
        config.in_flight_bound,
        metrics.paused_partitions.set,
        shares=shares,
        on_share=lambda name, held: metrics.in_flight_share_held.labels(name).set(held),
        topics={p.name: p.config.request_topics for p in pipelines},
    )
    stages = Stages(sink, threads, committer, by_name, metrics)
    delivery: Delivery = AtLeastOnce(stages)
    if rewind is not None:
        delivery = Transactional(
            stages,
            source,
            config.kafka,
            interval_s=config.transaction_interval_ms / 1000.0,
            timeout_s=config.shutdown_timeout_s,
            owned=events.owned,
            drop_buffered=functools.partial(_flush_all, batchers),
            gate=rewind,
            calls=calls or CallWatch(on_stall=health.call_stalled),
        )
    membership = Membership(
        owned=events.owned,
        delivery=delivery,
        batchers=batchers,
        threads=threads,
        pausing=pausing,
        lag=events.lag,
        metrics=metrics,
        health=health,
        revoke_timeout_s=config.revoke_timeout_s,
        clock=clock,
    )
    shared = [share.pipeline for share in shares]
    return ConsumerParts(
        source, batchers, committer, threads, pausing, membership, delivery, events, shared
    )


def producer_linger_ms(config: WorkerConfig) -> int:
    """The producer's ``linger.ms`` unless the config sets one: none where a pipeline
    batches adaptively (the latency setting), else one millisecond: a batch's results
    leave together."""
    adaptive = any(p.batch.mode == "adaptive" for p in config.pipelines)
    return LOW_LATENCY_LINGER_MS if adaptive else LINGER_MS


def _flush_all(batchers: Mapping[str, Batcher[Message]]) -> None:
    """Empty every open batch: an exactly-once rewind fetches their records again."""
    for batcher in batchers.values():
        batcher.flush()


def _watch_coverage(
    config: WorkerConfig, metrics: Metrics, background: list[Background]
) -> threading.Event | None:
    """A static member watches for partitions nobody owns (``worker.kafka.group_coverage``): the
    event its ``GroupCoverage`` sets when this member should leave and join again."""
    kafka = config.kafka
    if not kafka.group_instance_id or kafka.group_coverage_check_s <= 0:
        return None
    topics = [t for p in config.pipelines for t in p.request_topics]
    reader = ChildGroupReader(child_settings(kafka, topics))
    rejoin = threading.Event()
    background.append(
        GroupCoverage(
            reader,
            member=kafka.group_instance_id,
            rejoin=rejoin,
            interval_s=kafka.group_coverage_check_s,
            on_rejoin=metrics.group_rejoins.inc,
        )
    )
    return rejoin


class _Loaded(NamedTuple):
    engine: ServingEngine
    plan: FeedPlan
    store: RedisLookups
    hooks: BatchHooks
    canary: Canary | None
    shadow: ModelSlot | None


def _load(p: PipelineConfig, config: WorkerConfig, metrics: Metrics) -> _Loaded:
    """A pipeline's model, lookups and hooks (``open_parts``), then its canary and shadow
    models (``load_candidates``)."""
    engine, plan, store, hooks = open_parts(p, config.redis, metrics=metrics)
    try:
        serving = LoadedModel(engine, plan)
        canary, shadow = load_candidates(p, serving, metrics=metrics)
    except BaseException:
        store.close()
        raise
    if canary is not None and p.canary is not None:
        log.info(
            "pipeline %s: canary %s (sha256 %s) scores %g%% of keys",
            p.name,
            canary.identity.tag,
            canary.identity.sha256[:12],
            p.canary.percent,
        )
    if shadow is not None and p.shadow is not None:
        log.info(
            "pipeline %s: shadow %s (sha256 %s) scores a copy of every batch into %s",
            p.name,
            shadow.identity.tag,
            shadow.identity.sha256[:12],
            p.shadow.topic,
        )
    return _Loaded(
        engine,
        plan,
        store,
        hooks,
        Canary(ModelSlot(canary), p.canary.percent) if canary and p.canary else None,
        ModelSlot(shadow) if shadow is not None else None,
    )
