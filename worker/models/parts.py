"""A pipeline's serving parts, built from its config: the model, loaded, checked against
the config and warmed up; the feature lookups, connected and probed; the batch hooks,
imported.

The worker, ``streamfer replay`` and ``streamfer check`` build them with ``open_parts``,
so a config that passes ``check`` starts the same engine and store a worker would, and a
model or Redis that cannot serve fails before anything joins a group or is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from worker.config import ModelSpec, PipelineConfig, RedisSettings
from worker.features import RedisLookups
from worker.inference import OnnxEngine, ServingEngine, TritonEngine, warm_up_sizes
from worker.models.graph import open_graph
from worker.models.metrics import ModelFamilies
from worker.pipeline import BatchHooks, FeedPlan, load_hooks

__all__ = ["LoadedModel", "Parts", "load_model", "open_engine", "open_parts"]


class Parts(NamedTuple):
    engine: ServingEngine
    plan: FeedPlan
    """How the config's features feed ``engine``: built once, here, for the pipeline's
    life (a ``Pipeline`` takes it, and so does the reloader's check of a new version)."""
    store: RedisLookups
    hooks: BatchHooks


class LoadedModel(NamedTuple):
    engine: ServingEngine
    plan: FeedPlan


def load_model(
    config: PipelineConfig,
    spec: ModelSpec,
    *,
    warm_up: Iterable[int] | None = None,
    metrics: ModelFamilies | None = None,
) -> LoadedModel:
    """The engine of ``spec``, checked against ``config``'s inputs (its feed plan) and
    run once per ``warm_up`` batch size (default: every ``warm_up_sizes`` bucket). What
    a worker does at start-up and ``worker.models.reloader`` does with each new version, on
    the calling thread: it blocks while the model loads and warms, using CPU (or the
    device) beside the batches being served. Raises ``ModelMismatchError`` or
    ``EngineError`` as ``open_parts`` says."""
    buckets = warm_up_sizes(config.batch.max_batch_size)
    engine: ServingEngine
    if config.steps:
        engine = open_graph(config, lambda step: open_engine(config.name, step, buckets, metrics))
    else:
        engine = open_engine(config.name, spec, buckets, metrics)
    plan = FeedPlan.build(config.model_copy(update={"model": spec}), engine.inputs)
    engine.warm_up(buckets if warm_up is None else warm_up, engine.example(plan.widths()))
    return LoadedModel(engine, plan)


def open_engine(
    pipeline: str, spec: ModelSpec, buckets: list[int], metrics: ModelFamilies | None
) -> ServingEngine:
    """The engine ``spec.engine`` names, its calls counted in ``metrics`` when given."""
    if spec.engine == "triton":
        if metrics is None:
            return TritonEngine(spec)
        calls = metrics.triton_call_seconds.labels(pipeline)
        errors = metrics.triton_errors
        return TritonEngine(
            spec, on_call=calls.observe, on_error=lambda kind: errors.labels(pipeline, kind).inc()
        )
    oom = metrics.device_oom_retries.labels(pipeline).inc if metrics is not None else None
    return OnnxEngine(spec, batch_sizes=buckets, on_device_oom=oom)


def open_parts(
    config: PipelineConfig,
    redis: RedisSettings,
    *,
    model: ModelSpec | None = None,
    warm_up: Iterable[int] | None = None,
    metrics: ModelFamilies | None = None,
) -> Parts:
    """The engine of ``model`` (default: the pipeline's), checked against the config's
    inputs (its feed plan, returned with it) and run once per ``warm_up`` batch size
    (default: every size a worker hands it, see ``warm_up_sizes``, which are also the
    buckets a GPU pads batches to, and TensorRT builds its engine for, here:
    ``load_model``); then the lookups, each probed with the command a batch sends; then
    the hooks. The caller closes the store; it is closed here when its probe fails. With
    ``metrics``, the engine's provider is exported and its out-of-memory retries counted.

    Blocks while the model loads and runs and for one Redis round trip per lookup.
    Raises ``ModelMismatchError`` (the config does not fit the model's inputs),
    ``ConfigError`` (a hook does not import), ``EngineError`` (the model file is missing
    or not the pinned one, or the model cannot load, run or be published),
    ``FeatureStoreConfigError`` (Redis refuses how it is used) or ``FeatureStoreError``
    (Redis is unreachable).
    """
    spec = config.model if model is None else model
    hooks = load_hooks(config.hooks, f"pipelines.{config.name}")
    engine, plan = load_model(config, spec, warm_up=warm_up, metrics=metrics)
    if metrics is not None:
        metrics.inference_provider.labels(config.name, engine.provider, spec.providers[0]).set(1)
    store = RedisLookups.connect(redis, config, plan.stored_text())
    try:
        store.probe()
    except BaseException:
        store.close()
        raise
    return Parts(engine, plan, store, hooks)
