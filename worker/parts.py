"""A pipeline's serving parts, built from its config: the model, loaded and warmed up, and
the feature store, connected and probed.

The worker, ``streamfer replay`` and ``streamfer check`` build them with ``open_parts``,
so a config that passes ``check`` starts the same engine and store a worker would, and a
model or Redis that cannot serve fails before anything joins a group or is written.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.config import ModelSpec, PipelineConfig, RedisSettings
from worker.engines import OnnxEngine, warm_up_sizes
from worker.features import RedisHashStore, RedisPackedStore, connect_store

__all__ = ["open_parts"]


def open_parts(
    config: PipelineConfig,
    redis: RedisSettings,
    *,
    model: ModelSpec | None = None,
    warm_up: Iterable[int] | None = None,
) -> tuple[OnnxEngine, RedisHashStore | RedisPackedStore]:
    """The engine of ``model`` (default: the pipeline's), run once per ``warm_up`` batch
    size (default: every size a worker hands it, see ``warm_up_sizes``), then the store of
    the pipeline's features, probed with the command a batch sends. The caller closes the
    store; it is closed here when its probe fails.

    Blocks while the model loads and runs and for one Redis round trip. Raises
    ``EngineError`` (the model file is missing or not the pinned one, or the model cannot
    load, run or be published), ``FeatureStoreConfigError`` (Redis refuses how it is
    used) or ``FeatureStoreError`` (Redis is unreachable).
    """
    engine = OnnxEngine(config.model if model is None else model)
    engine.warm_up(warm_up_sizes(config.batch.max_batch_size) if warm_up is None else warm_up)
    store = connect_store(redis, config.features)
    try:
        store.probe()
    except BaseException:
        store.close()
        raise
    return engine, store
