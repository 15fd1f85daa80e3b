"""The output cache: rows whose model inputs were seen before skip the model.

``[pipelines.cache]`` turns it on. A row's key (``worker.cache.keys``) covers the bytes
the model would see, after stored features and inline values are merged, under the
model's SHA-256, result fields, class names and provider. A batch goes through it in
three steps, each on the stage thread that already does that kind of work, each
handing the next a frozen value (``CachedRows``, ``CachePlan``, ``SettledRows``):

- ``look_up`` (enrich thread): keys for every row; the in-process tier
  (``worker.cache.memory``), then one Redis read for the rest (``worker.cache.redis_tier``,
  when ``redis_ttl_s`` is set); Redis hits are kept in process too.
- ``to_run`` and ``settle`` (model stage): the in-process tier again for rows still
  missing (the batch before may have just computed them), and each distinct missing
  key once: repeats within the batch share the first row's outputs. The model runs on
  those rows in one call; ``settle`` encodes each row's outputs as the result publishes
  them and keeps them in process. Rows the model refused or answered with NaN or
  infinity are never kept.
- ``share`` (publish stage, after the batch's results are handed to the producer): one
  Redis write of what the model computed.

A cached row's result is the uncached one's byte for byte (its ``outputs`` are the very
bytes encoded when the model computed them), plus ``"cached": true``. A model whose
SHA-256 changes between ``look_up`` and ``to_run`` (a reload) gets new keys and only
in-process hits. At a reload ``serve`` drops the in-process entries of the model that
served before (they could never be hit again, only take memory until evicted), from the
reloader's thread; its Redis entries are left to expire after ``redis_ttl_s``: workers
that have not reloaded yet still read them, and no other key reaches them. Counters:
hits by tier (memory, redis, batch), misses, evictions, Redis errors, unreadable values;
gauges: the in-process entries and their bytes, the hit ratio over the last 100 batches.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from worker.cache.keys import model_namespace, row_keys
from worker.cache.memory import MemoryTier
from worker.cache.metrics import CacheFamilies, CacheMetrics
from worker.cache.redis_tier import RedisCacheTier
from worker.config import PipelineConfig, RedisSettings
from worker.features import redis_client
from worker.inference import InferenceEngine, Outputs, finite_rows, row_outputs

__all__ = ["CachePlan", "CachedRows", "OutputCache", "SettledRows", "open_cache"]

log = logging.getLogger(__name__)

RATIO_WINDOW = 100
"""Batches the hit ratio gauge looks back over."""


@dataclass(frozen=True, slots=True)
class CachedRows:
    """One batch as the cache found it (``look_up``); rows are positions in the batch's
    rows that reach the model."""

    namespace: bytes
    keys: list[bytes]
    found: Mapping[int, bytes]
    """Row -> its encoded outputs, from either tier."""
    redis_hits: int = 0
    memory_hits: int = 0


@dataclass(frozen=True, slots=True)
class CachePlan:
    """What the model computes of a batch (``to_run``): ``rows`` as found at the model
    (keyed anew if the model changed since ``look_up``)."""

    rows: CachedRows
    run: list[int]
    """Rows the model computes, one per distinct missing key."""
    repeats: Mapping[int, int]
    """Row -> the earlier row of the batch with the same key, which the model computes."""


@dataclass(frozen=True, slots=True)
class SettledRows:
    """A batch once the model ran (``settle``): every row's encoded outputs."""

    encoded: list[bytes | None]
    """Each row's encoded outputs; None for a row that is refused."""
    reused: list[bool]
    """Whether a row's outputs came from the cache."""
    failed: Mapping[int, str]
    """Row -> why the model refused it."""
    fresh: list[tuple[bytes, bytes]]
    """(key, encoded outputs) the model computed, for Redis."""


class OutputCache:
    """One pipeline's cache, for the model of ``engine`` until ``serve`` names another.
    ``namespace_of`` gives the key namespace for an engine."""

    def __init__(
        self,
        *,
        memory: MemoryTier,
        redis: RedisCacheTier | None,
        metrics: CacheMetrics,
        config: PipelineConfig,
        engine: InferenceEngine,
    ) -> None:
        self.memory = memory
        self.redis = redis
        self._m = metrics
        self._name = config.name
        self._model = config.model
        self._namespaces: dict[tuple[str, str | None], bytes] = {}
        memory.serve_only(self.namespace_of(engine))
        self._window: collections.deque[tuple[int, int]] = collections.deque(maxlen=RATIO_WINDOW)
        self._window_hits = 0
        self._window_rows = 0

    def namespace_of(self, engine: InferenceEngine) -> bytes:
        served_by = getattr(engine, "provider", None)
        provider = served_by if isinstance(served_by, str) else None
        namespace = self._namespaces.get((engine.model_hash, provider))
        if namespace is None:
            fields = getattr(engine, "outputs", None)
            namespace = model_namespace(
                engine.model_hash,
                fields=list(fields) if isinstance(fields, Mapping) else None,
                class_names=self._model.class_names,
                provider=provider,
                fp16=self._model.tensorrt.fp16 and provider == "TensorrtExecutionProvider",
            )
            self._namespaces[(engine.model_hash, provider)] = namespace
        return namespace

    def serve(self, engine: InferenceEngine) -> None:
        """Keep only ``engine``'s rows in process from now on (the reloader, once it has
        swapped ``engine`` in): the previous model's entries are dropped at once."""
        dropped = self.memory.serve_only(self.namespace_of(engine))
        self._m.entries.set(len(self.memory))
        self._m.bytes.set(self.memory.nbytes)
        if dropped:
            log.info(
                "pipeline %s: output cache dropped the previous model's %d in-process "
                "entries; its Redis entries expire with their TTL",
                self._name,
                dropped,
            )

    def look_up(self, feeds: Mapping[str, npt.NDArray[Any]], engine: InferenceEngine) -> CachedRows:
        """Keys for the batch's rows and what either tier holds for them. Never raises
        for Redis: a failed read is all misses."""
        namespace = self.namespace_of(engine)
        keys = row_keys(namespace, feeds)
        found = self.memory.get_many(keys, range(len(keys)))
        memory_hits, redis_hits = len(found), 0
        if self.redis is not None and len(found) < len(keys):
            missing = [r for r in range(len(keys)) if r not in found]
            fetch = self.redis.get_many(keys, missing)
            if fetch.found:
                found.update(fetch.found)
                redis_hits = len(fetch.found)
                promoted = {keys[r]: v for r, v in fetch.found.items()}.items()
                self._evicted(self.memory.put_many(promoted, namespace))
        return CachedRows(namespace, keys, found, redis_hits, memory_hits)

    def to_run(
        self, rows: CachedRows, feeds: Mapping[str, npt.NDArray[Any]], engine: InferenceEngine
    ) -> CachePlan:
        """The rows the model must compute, in order: one per distinct key that neither
        tier holds. A batch held for its model is asked again from its ``look_up``."""
        namespace = self.namespace_of(engine)
        if namespace != rows.namespace:  # the model changed since look_up
            rows = CachedRows(namespace, row_keys(namespace, feeds), {})
        keys, found = rows.keys, rows.found
        missing = [r for r in range(len(keys)) if r not in found]
        if missing:
            late = self.memory.get_many(keys, missing)
            if late:
                found = {**found, **late}
                hits = rows.memory_hits + len(late)
                rows = CachedRows(namespace, keys, found, rows.redis_hits, hits)
                missing = [r for r in missing if r not in late]
        first: dict[bytes, int] = {}
        run: list[int] = []
        repeats: dict[int, int] = {}
        for r in missing:
            earlier = first.setdefault(keys[r], r)
            if earlier == r:
                run.append(r)
            else:
                repeats[r] = earlier
        return CachePlan(rows, run, repeats)

    def settle(self, plan: CachePlan, outputs: Outputs, failed: Mapping[int, str]) -> SettledRows:
        """Take the model's outputs for ``plan.run`` (``failed`` by position in it):
        encode each row's result fields, keep the good ones in process, and return every
        row's encoded outputs."""
        rows, run = plan.rows, plan.run
        n, keys = len(rows.keys), rows.keys
        encoded: list[bytes | None] = [None] * n
        reused = [False] * n
        refused: dict[int, str] = {}
        fresh: list[tuple[bytes, bytes]] = []
        for r, value in rows.found.items():
            encoded[r] = value
            reused[r] = True
        if run:
            ok = finite_rows(outputs, len(run)) if outputs else np.zeros(len(run), np.bool_)
            for j in failed:
                ok[j] = False
            dumps = orjson.dumps
            for j, (r, out, good) in enumerate(
                zip(run, row_outputs(outputs, len(run)), ok.tolist(), strict=True)
            ):
                if good:
                    # a copy: orjson's own result keeps its 4 KiB buffer, which would make
                    # each entry cost that much memory for as long as it is kept
                    value = bytes(memoryview(dumps(out)))
                    encoded[r] = value
                    fresh.append((keys[r], value))
                elif j in failed:
                    refused[r] = failed[j]
            for r, earlier in plan.repeats.items():
                encoded[r] = encoded[earlier]
                reused[r] = encoded[earlier] is not None
                if earlier in refused:
                    refused[r] = refused[earlier]
            self._evicted(self.memory.put_many(fresh, rows.namespace))
        self._count(plan, reused)
        return SettledRows(encoded, reused, refused, fresh)

    def share(self, settled: SettledRows) -> None:
        """Write what the model computed to Redis (publish stage); never raises."""
        if self.redis is not None and settled.fresh:
            self.redis.put_many(settled.fresh)

    def _evicted(self, count: int) -> None:
        if count:
            self._m.evictions.inc(count)

    def _count(self, plan: CachePlan, reused: list[bool]) -> None:
        m = self._m
        n = len(reused)
        batch_hits = sum(1 for r in plan.repeats if reused[r])
        memory, redis_hits = plan.rows.memory_hits, plan.rows.redis_hits
        if memory:
            m.memory_hits.inc(memory)
        if redis_hits:
            m.redis_hits.inc(redis_hits)
        if batch_hits:
            m.batch_hits.inc(batch_hits)
        hits = memory + redis_hits + batch_hits
        if n - hits:
            m.misses.inc(n - hits)
        m.entries.set(len(self.memory))
        m.bytes.set(self.memory.nbytes)
        window = self._window
        if len(window) == window.maxlen:
            old_hits, old_rows = window[0]
            self._window_hits -= old_hits
            self._window_rows -= old_rows
        window.append((hits, n))
        self._window_hits += hits
        self._window_rows += n
        if self._window_rows:
            m.hit_ratio.set(self._window_hits / self._window_rows)


def open_cache(
    config: PipelineConfig, redis: RedisSettings, registry: CacheFamilies, engine: InferenceEngine
) -> OutputCache | None:
    """The cache ``config.cache`` asks for, or None when it is off (then no cache series
    are exported). The Redis tier gets a client of its own (``redis_timeout_ms`` for
    every socket operation) on first use."""
    spec = config.cache
    if not spec.enabled:
        return None
    metrics = registry.for_cache(config.name)
    tier: RedisCacheTier | None = None
    if spec.redis_ttl_s is not None:
        settings = redis.model_copy(update={"socket_timeout_s": spec.redis_timeout_ms / 1000.0})
        fields = getattr(engine, "outputs", None)

        def count(kind: str, n: int) -> None:
            (metrics.redis_errors if kind == "redis" else metrics.corrupt_values).inc(n)

        tier = RedisCacheTier(
            lambda: redis_client(settings),
            ttl_s=spec.redis_ttl_s,
            prefix=spec.redis_key_prefix,
            fields=list(fields) if isinstance(fields, Mapping) else None,
            on_error=count,
            where=f"pipeline {config.name}: output cache",
        )
    log.info(
        "pipeline %s: output cache on (%d entries, %.1f MiB in process%s)",
        config.name,
        spec.max_entries,
        spec.max_bytes / 2**20,
        f", Redis for {spec.redis_ttl_s} s under {spec.redis_key_prefix!r}"
        if tier is not None
        else "",
    )
    return OutputCache(
        memory=MemoryTier(spec.max_entries, spec.max_bytes),
        redis=tier,
        metrics=metrics,
        config=config,
        engine=engine,
    )
