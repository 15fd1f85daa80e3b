"""The output cache's metrics: its families, and the children one pipeline's cache
updates (``worker.cache.output_cache``), bound once per pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from worker.ops import Families, counter, gauge

__all__ = ["CacheFamilies", "CacheMetrics"]


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    """Pre-bound children of one pipeline's output cache."""

    memory_hits: Counter
    redis_hits: Counter
    batch_hits: Counter
    misses: Counter
    evictions: Counter
    entries: Gauge
    bytes: Gauge
    hit_ratio: Gauge
    redis_errors: Counter
    corrupt_values: Counter


class CacheFamilies(Families):
    """The families the output cache updates."""

    cache_hits = counter(
        "streamfer_cache_hits",
        "Rows the output cache served instead of the model, by tier (memory, redis, or "
        "batch: a repeat of a row the model computed in the same batch)",
        "pipeline",
        "tier",
    )
    cache_misses = counter(
        "streamfer_cache_misses",
        "Rows the output cache did not hold, which the model computed",
        "pipeline",
    )
    cache_evictions = counter(
        "streamfer_cache_evictions",
        "Least recently used entries the in-process output cache dropped to stay "
        "within max_entries and max_bytes",
        "pipeline",
    )
    cache_entries = gauge(
        "streamfer_cache_entries", "Entries held by the in-process output cache", "pipeline"
    )
    cache_bytes = gauge(
        "streamfer_cache_bytes",
        "Bytes the in-process output cache's entries take (keys, values and the "
        "map's own cost per entry), bounded by max_bytes",
        "pipeline",
    )
    cache_hit_ratio = gauge(
        "streamfer_cache_hit_ratio",
        "Share of rows the output cache served, over the pipeline's last 100 batches",
        "pipeline",
    )
    cache_errors = counter(
        "streamfer_cache_errors",
        "Output cache Redis tier troubles, which read as misses: failed round trips "
        "(redis) and stored values that could not be read (corrupt)",
        "pipeline",
        "kind",
    )

    def for_cache(self, name: str) -> CacheMetrics:
        hits = self.cache_hits
        return CacheMetrics(
            memory_hits=hits.labels(name, "memory"),
            redis_hits=hits.labels(name, "redis"),
            batch_hits=hits.labels(name, "batch"),
            misses=self.cache_misses.labels(name),
            evictions=self.cache_evictions.labels(name),
            entries=self.cache_entries.labels(name),
            bytes=self.cache_bytes.labels(name),
            hit_ratio=self.cache_hit_ratio.labels(name),
            redis_errors=self.cache_errors.labels(name, "redis"),
            corrupt_values=self.cache_errors.labels(name, "corrupt"),
        )
