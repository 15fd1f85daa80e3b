"""A pipeline assembled from its serving parts: ``build_pipeline``.

The worker (``worker.compose``), ``streamfer replay`` and ``streamfer check`` build every
``Pipeline`` here, from the parts ``open_parts`` opened (``worker.models.parts``), so each
runs the same steps a worker would. This is where a pipeline's parts are wired: its model
slot, the waits for the feature store, the Schema Registry and an inference server, the
hold for a model at fault, its dead letters, and its three steps; the ``Pipeline`` takes
them built.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import cast

from worker.cache import OutputCache
from worker.config import PipelineConfig
from worker.errors import ConfigError, SchemaRegistryError
from worker.features import FeatureStore, OneStore, StoreWait
from worker.inference import InferenceEngine, LiveModel, ModelSlot
from worker.pipeline import (
    BatchFetcher,
    BatchHooks,
    Canary,
    DeadLetters,
    FeedPlan,
    InferStep,
    ModelFaults,
    ModelFaultWait,
    Pipeline,
    PipelineMetrics,
    PrepareStep,
    PublishStep,
    ServerOutage,
    ShadowRunner,
    Steps,
)
from worker.registry import AvroResults, FramedRequests

__all__ = ["Heard", "build_pipeline"]

Heard = Callable[[bool, str | None], None]
"""Told whether a part a pipeline waits on answers (False and why), as ``HealthState``
hears it."""


def build_pipeline(
    config: PipelineConfig,
    *,
    store: FeatureStore | BatchFetcher,
    engine: InferenceEngine,
    plan: FeedPlan,
    metrics: PipelineMetrics,
    hooks: BatchHooks | None = None,
    retry_feature_store_s: float | None = 30.0,
    abort: threading.Event | None = None,
    on_feature_store: Heard | None = None,
    canary: Canary | None = None,
    shadow: ShadowRunner | None = None,
    cache: OutputCache | None = None,
    framed: FramedRequests | None = None,
    avro_results: AvroResults | None = None,
    on_schema_registry: Heard | None = None,
    on_model: Heard | None = None,
    on_inference_server: Heard | None = None,
) -> Pipeline:
    """The ``Pipeline`` of ``config`` on ``engine`` (fed by ``plan``): its three steps and
    what they wait with, each built once. A store of one lookup (a ``FeatureStore``)
    serves the config's first. ``abort`` ends every wait. Raises ConfigError where the
    parts do not go together (an output cache with hooks, a canary or a shadow)."""
    name, hooks = config.name, hooks or BatchHooks()
    _refuse_mismatched(name, hooks, cache, canary is not None or shadow is not None)
    abort = abort or threading.Event()
    slot = ModelSlot(LiveModel.of(config.model, engine))
    wait = functools.partial(StoreWait, name, abort=abort)
    registry = None
    if framed is not None:
        registry_wait = wait(
            retry_s=retry_feature_store_s,
            errors=metrics.schema_registry_errors,
            on_feature_store=on_schema_registry or _unheard,
            outage=SchemaRegistryError,
            what="schema registry",
        )
        registry = framed, registry_wait
    prepare = PrepareStep(
        config,
        plan,
        store=_fetcher(config, store),
        store_wait=wait(
            retry_s=retry_feature_store_s,
            errors=metrics.feature_store_errors,
            on_feature_store=on_feature_store or _unheard,
        ),
        slot=slot,
        metrics=metrics,
        cache=cache,
        canary=canary,
        framed=registry,
    )
    infer = InferStep(
        slot=slot,
        hooks=hooks,
        metrics=metrics,
        cache=cache,
        canary=canary,
        shadow=shadow,
        faults=_model_faults(config, slot, metrics, abort, on_model or _unheard),
        outage=ServerOutage(
            name,
            abort=abort,
            on_inference_server=on_inference_server or _unheard,
            model=lambda: slot.for_batch().identity,
        ),
    )
    dead_letters = DeadLetters(config, metrics)
    publish = PublishStep(
        config,
        dead_letters=dead_letters,
        metrics=metrics,
        cache=cache,
        shadow=shadow,
        avro=avro_results,
    )
    steps = Steps(prepare, infer, publish)
    return Pipeline(
        config,
        steps,
        slot=slot,
        plan=plan,
        metrics=metrics,
        dead_letters=dead_letters,
        abort=abort,
    )


def _model_faults(
    config: PipelineConfig,
    slot: ModelSlot,
    metrics: PipelineMetrics,
    abort: threading.Event,
    on_model: Heard,
) -> tuple[ModelFaults, ModelFaultWait]:
    """What tells a fault of the model from its rows', and the hold of a batch at fault."""
    faults = ModelFaults(config.pause_after_model_failures, metrics.model_failed_batches)
    wait = ModelFaultWait(
        config.name,
        abort=abort,
        paused=metrics.model_paused,
        on_model=on_model,
        model=lambda: slot.for_batch().identity,
    )
    return faults, wait


def _refuse_mismatched(
    name: str, hooks: BatchHooks, cache: OutputCache | None, candidates: bool
) -> None:
    """Raise ConfigError for an output cache beside parts it cannot serve with."""
    if cache is not None and hooks.active:
        raise ConfigError(
            f"pipelines.{name}: cache.enabled = true with hooks: hooks see the "
            "whole request, so the model's inputs alone do not decide a result"
        )
    if cache is not None and candidates:
        raise ConfigError(
            f"pipelines.{name}: cache.enabled = true with a canary or shadow: "
            "their rows are compared and published per model, the cache's per input"
        )


def _fetcher(config: PipelineConfig, store: FeatureStore | BatchFetcher) -> BatchFetcher:
    """``store`` as the batch's one round trip for every lookup: a ``FeatureStore`` of
    one lookup serves the config's first."""
    if hasattr(store, "fetch_all"):
        return cast(BatchFetcher, store)
    return OneStore(config.lookups[0].name if config.lookups else "entity", store)


def _unheard(_ok: bool, _why: str | None) -> None:
    """Hears a pipeline's waits where no one else was given to."""
