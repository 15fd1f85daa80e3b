"""The composition root: the real parts of a worker, built from its config.

Every model is loaded and warmed and Redis checked before the group is joined, so a
worker that cannot serve never takes partitions. ``Worker`` itself takes its parts as
keyword arguments, so tests hand in fakes instead.
"""

from __future__ import annotations

import logging
import os
import threading

from confluent_kafka import Consumer
from prometheus_client import CollectorRegistry

from worker.app import Worker
from worker.config import WorkerConfig
from worker.health import HealthState
from worker.limits import RecordLimits
from worker.metrics import Metrics
from worker.model_slot import ModelIdentity
from worker.parts import LoadedModel, open_parts
from worker.pipeline import Pipeline
from worker.reloader import ModelWatch, Reloader, show_model
from worker.sink import Sink
from worker.source import consumer_config
from worker.transactions import transactional_producer, verify_isolation

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

    pipelines = []
    watches = []
    for p in config.pipelines:
        engine, store, hooks = open_parts(p, config.redis, metrics=metrics)
        identity = ModelIdentity(p.model.name, p.model.version, engine.model_hash)
        shown = show_model(metrics, p.name, identity, engine.providers[0], hide=None)
        pipeline = Pipeline(
            p,
            store=store,
            engine=engine,
            metrics=metrics.for_pipeline(p.name),
            hooks=hooks,
            retry_feature_store_s=config.feature_store_retry_s,
            abort=abort,
            on_feature_store=health.feature_store,
        )
        pipelines.append(pipeline)
        serving = LoadedModel(engine, pipeline.plan)
        watches.append(ModelWatch(p, pipeline.slot, serving, metrics, shown=shown))
    # The models are loaded: /healthz answers 200 from here, while the Kafka clients wait
    # for the cluster's metadata (their timeouts, not a model, hold start-up up then).
    health.models_loaded = True
    health.turned()
    outputs = [t for p in config.pipelines for t in (p.result_topic, p.dead_letter_topic)]
    limits = RecordLimits.read(config.kafka, outputs)
    if config.delivery == "exactly-once":
        if config.exactly_once_probe:
            verify_isolation(config.kafka, topic=config.exactly_once_probe_topic)
        else:
            log.warning(
                "exactly_once_probe = false: starting without proof that this broker hides "
                "aborted records from read_committed readers"
            )
        sink = Sink(transactional_producer(config.kafka, limits), limits)
    else:
        sink = Sink.from_settings(config.kafka, limits)
    sink.warm_up(outputs)
    built: list[Worker] = []
    consumer = Consumer(
        consumer_config(
            config.kafka,
            on_commit=lambda e, p: built[0].on_commit(e, p),
            on_error=lambda e: built[0].on_error(e),
            on_stats=lambda s: built[0].on_stats(s),
            statistics_interval_ms=config.statistics_interval_ms,
            read_committed=config.delivery == "exactly-once",
        )
    )
    worker = Worker(
        config=config,
        consumer=consumer,
        sink=sink,
        pipelines=pipelines,
        metrics=metrics,
        health=health,
        abort=abort,
        reloader=Reloader(watches, requests=reload_requests),
        # the fault harness's injected aborts (benchmarks/chaos.py), never set otherwise
        fault_abort_every=int(os.environ.get("STREAMFER_FAULT_ABORT_EVERY", "0")),
    )
    built.append(worker)
    return worker
