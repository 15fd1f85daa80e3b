"""The composition root: the real parts of a worker, built from its config.

Every model is loaded and warmed and Redis checked before the group is joined, so a
worker that cannot serve never takes partitions. ``Worker`` itself takes its parts as
keyword arguments, so tests hand in fakes instead.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import NamedTuple

from confluent_kafka import Consumer
from prometheus_client import CollectorRegistry

from worker.cache.output_cache import open_cache
from worker.config import PipelineConfig, WorkerConfig
from worker.features.lookups import RedisLookups
from worker.inference.engine import OnnxEngine
from worker.inference.slot import ModelSlot
from worker.kafka.call_watch import CallWatch
from worker.kafka.group_coverage import GroupCoverage
from worker.kafka.group_reads import ChildGroupReader, child_settings
from worker.kafka.limits import RecordLimits
from worker.kafka.sink import Sink
from worker.kafka.source import consumer_config
from worker.kafka.transactions import transactional_producer, verify_isolation
from worker.loop.pausing import share_fetch_options
from worker.loop.worker import Background, Worker
from worker.models.candidates import load_candidates
from worker.models.parts import LoadedModel, open_parts
from worker.models.reloader import ModelWatch, Reloader, show_model
from worker.ops.health import HealthState
from worker.ops.metrics import Metrics
from worker.pipeline.canary import Canary
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.hooks import BatchHooks
from worker.pipeline.shadow import ShadowRunner
from worker.pipeline.steps import Pipeline

__all__ = ["build_worker"]

log = logging.getLogger(__name__)


def build_worker(
    config: WorkerConfig,
    registry: CollectorRegistry | None = None,
    health: HealthState | None = None,
    reload_requests: threading.Event | None = None,
) -> Worker:
    """Build real parts; load and warm every model before the group is joined.

    The worker's ``Reloader`` watches the pipelines whose ``model.watch`` is on and looks
    at every pipeline's model whenever ``reload_requests`` is set (SIGHUP, POST /reload).
    Raises ConfigError (including a broker without working transactions in
    exactly-once mode), EngineError or FeatureStoreError.
    """
    metrics = Metrics(registry)
    health = health or HealthState(liveness_timeout_s=config.liveness_timeout_s)
    abort = threading.Event()

    loaded = [_load(p, config, metrics) for p in config.pipelines]
    # The models are loaded: /healthz answers 200 from here, while the Kafka clients wait
    # for the cluster's metadata (their timeouts, not a model, hold start-up up then).
    health.models_loaded = True
    health.turned()
    shadow_topics = [p.shadow.topic for p in config.pipelines if p.shadow is not None]
    outputs = [t for p in config.pipelines for t in (p.result_topic, p.dead_letter_topic)]
    limits = RecordLimits.read(config.kafka, outputs + shadow_topics)
    pipelines = []
    watches = []
    background: list[Background] = []
    for p, parts in zip(config.pipelines, loaded, strict=True):
        shadow = None
        if parts.shadow is not None and p.shadow is not None:
            shadow_sink = Sink.from_settings(config.kafka, limits)  # never transactional
            shadow_sink.warm_up([p.shadow.topic])
            shadow = ShadowRunner(
                p, parts.shadow, shadow_sink, metrics.for_shadow(p.name), hooks=parts.hooks
            )
            background.append(shadow)
        pipeline = Pipeline(
            p,
            store=parts.store,
            engine=parts.engine,
            plan=parts.plan,
            metrics=metrics.for_pipeline(p.name),
            hooks=parts.hooks,
            retry_feature_store_s=config.feature_store_retry_s,
            abort=abort,
            on_feature_store=health.feature_store,
            canary=parts.canary,
            shadow=shadow,
            cache=open_cache(p, config.redis, metrics, parts.engine),
        )
        pipelines.append(pipeline)
        identity = pipeline.slot.for_batch().identity
        shown = show_model(metrics, p.name, identity, parts.engine.providers[0], hide=None)
        serving = LoadedModel(parts.engine, pipeline.plan)
        watches.append(ModelWatch(p, pipeline.slot, serving, metrics, shown=shown))
    background.insert(0, Reloader(watches, requests=reload_requests))
    calls = CallWatch(on_stall=health.call_stalled)
    if config.delivery == "exactly-once":
        if config.exactly_once_probe:
            verify_isolation(config.kafka, topic=config.exactly_once_probe_topic, calls=calls)
        else:
            log.warning(
                "exactly_once_probe = false: starting without proof that this broker hides "
                "aborted records from read_committed readers"
            )
        sink = Sink(transactional_producer(config.kafka, limits, calls=calls), limits)
    else:
        sink = Sink.from_settings(config.kafka, limits)
    sink.warm_up(outputs)
    built: list[Worker] = []
    consumer_settings = consumer_config(
        config.kafka,
        on_commit=lambda e, p: built[0].on_commit(e, p),
        on_error=lambda e: built[0].on_error(e),
        on_stats=lambda s: built[0].on_stats(s),
        statistics_interval_ms=config.statistics_interval_ms,
        read_committed=config.delivery == "exactly-once",
    )
    if any(config.in_flight_share(p) is not None for p in config.pipelines):
        given = {**config.kafka.options, **config.kafka.consumer_options}
        consumer_settings.update(share_fetch_options(given))
    consumer = Consumer(consumer_settings)
    rejoin = _watch_coverage(config, metrics, background)
    worker = Worker(
        config=config,
        consumer=consumer,
        sink=sink,
        pipelines=pipelines,
        metrics=metrics,
        health=health,
        abort=abort,
        background=background,
        transaction_calls=calls,
        rejoin=rejoin,
        # the fault harness's injected aborts (benchmarks/chaos.py), never set otherwise
        fault_abort_every=int(os.environ.get("STREAMFER_FAULT_ABORT_EVERY", "0")),
    )
    built.append(worker)
    return worker


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
    engine: OnnxEngine
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
