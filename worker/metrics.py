"""Prometheus metrics of one worker, on an injected ``CollectorRegistry``.

Nothing is registered at import time, so tests can build many workers in one process.
Label children are resolved once per pipeline, never per record.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["Metrics", "PipelineMetrics"]

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass(frozen=True, slots=True)
class PipelineMetrics:
    """Pre-bound children for one pipeline."""

    records: Counter
    results: Counter
    batches: Counter
    batch_size: Histogram
    decode_seconds: Histogram
    enrich_seconds: Histogram
    infer_seconds: Histogram
    dead_letters: Counter
    """Parent metric; labelled per code on the (rare) dead-letter path."""
    pipeline: str


class Metrics:
    """All metrics of a worker."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "streamfer_records", "Request records consumed", ["pipeline"], registry=r
        )
        self.results = Counter("streamfer_results", "Results produced", ["pipeline"], registry=r)
        self.dead_letters = Counter(
            "streamfer_dead_letters", "Dead letters produced", ["pipeline", "code"], registry=r
        )
        self.batches = Counter("streamfer_batches", "Batches processed", ["pipeline"], registry=r)
        self.batch_size = Histogram(
            "streamfer_batch_size",
            "Records per batch",
            ["pipeline"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "streamfer_stage_seconds",
            "Seconds per batch in each stage",
            ["pipeline", "stage"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.commits = Counter("streamfer_commits", "Offset commits issued", registry=r)
        self.rebalances = Counter(
            "streamfer_rebalances", "Partition assignment changes", ["kind"], registry=r
        )

    def for_pipeline(self, name: str) -> PipelineMetrics:
        return PipelineMetrics(
            records=self.records.labels(name),
            results=self.results.labels(name),
            batches=self.batches.labels(name),
            batch_size=self.batch_size.labels(name),
            decode_seconds=self.stage_seconds.labels(name, "decode"),
            enrich_seconds=self.stage_seconds.labels(name, "enrich"),
            infer_seconds=self.stage_seconds.labels(name, "infer"),
            dead_letters=self.dead_letters,
            pipeline=name,
        )
