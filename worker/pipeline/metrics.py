"""A pipeline's metrics: the families its steps, its shadow and its delivery update,
and the children of one pipeline, bound once (``for_pipeline``, ``for_shadow``) so the
hot path never looks up a label."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from worker.ops import Families, counter, gauge, histogram

__all__ = ["STAGES", "PipelineFamilies", "PipelineMetrics", "ShadowMetrics"]

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
STAGES = ("queue", "decode", "enrich", "infer", "publish", "commit")
"""The ``stage`` labels of ``streamfer_stage_seconds``."""


@dataclass(frozen=True, slots=True)
class PipelineMetrics:
    """Pre-bound children for one pipeline."""

    records: Counter
    results: Counter
    batches: Counter
    batch_size: Histogram
    queue_seconds: Histogram
    decode_seconds: Histogram
    enrich_seconds: Histogram
    infer_seconds: Histogram
    publish_seconds: Histogram
    commit_seconds: Histogram
    end_to_end_seconds: Histogram
    feature_hits: Counter
    feature_misses: Counter
    feature_store_errors: Counter
    schema_registry_errors: Counter
    dead_letters: Counter
    """Parent metric; labelled per code on the (rare) dead-letter path."""
    pipeline: str
    canary_records: Counter
    model_failed_batches: Counter
    model_paused: Gauge


@dataclass(frozen=True, slots=True)
class ShadowMetrics:
    """Pre-bound children for one pipeline's shadow model."""

    done: Counter
    dropped: Counter
    failed: Counter
    label_agreement: Gauge
    score_abs_diff: Gauge
    seconds: Histogram


class PipelineFamilies(Families):
    """The families a pipeline's steps, its shadow and its delivery update."""

    records = counter("streamfer_records", "Request records consumed", "pipeline")
    results = counter("streamfer_results", "Results produced", "pipeline")
    dead_letters = counter("streamfer_dead_letters", "Dead letters produced", "pipeline", "code")
    batches = counter("streamfer_batches", "Batches processed", "pipeline")
    batch_size = histogram(
        "streamfer_batch_size", "Records per batch", "pipeline", buckets=_BATCH_BUCKETS
    )
    stage_seconds = histogram(
        "streamfer_stage_seconds",
        "Seconds per batch in each stage (queue: first record's Kafka timestamp to "
        "processing start; commit: last delivery to offset commit)",
        "pipeline",
        "stage",
    )
    end_to_end_seconds = histogram(
        "streamfer_end_to_end_seconds",
        "Request Kafka timestamp to the acknowledgement of its batch's results",
        "pipeline",
    )
    feature_lookups = counter(
        "streamfer_feature_lookups",
        "Entity lookups in the feature store by outcome",
        "pipeline",
        "outcome",
    )
    feature_store_errors = counter(
        "streamfer_feature_store_errors", "Failed feature-store round trips (retried)", "pipeline"
    )
    schema_registry_errors = counter(
        "streamfer_schema_registry_errors",
        "Batches that found the Schema Registry unusable (retried)",
        "pipeline",
    )
    model_failed_batches = counter(
        "streamfer_model_failed_batches",
        "Batches the pipeline's model refused every row of while nothing showed the "
        "records at fault (a row it answered before was refused too, or it had "
        "answered none yet)",
        "pipeline",
    )
    model_paused = gauge(
        "streamfer_model_paused",
        "1 while a pipeline holds a batch for a fault of its model (its partitions "
        "pause as the in-flight bound fills; nothing is dead-lettered)",
        "pipeline",
    )
    canary_records = counter(
        "streamfer_canary_records",
        "Records scored by the pipeline's canary model instead of its own",
        "pipeline",
    )
    shadow_batches = counter(
        "streamfer_shadow_batches",
        "Batches for the shadow model: done (its results produced and acknowledged), "
        "dropped (it was behind) or failed (its model or its results' delivery failed)",
        "pipeline",
        "result",
    )
    shadow_label_agreement = gauge(
        "streamfer_shadow_label_agreement",
        "Share of recent rows whose shadow label equals the pipeline model's",
        "pipeline",
    )
    shadow_score_abs_diff = gauge(
        "streamfer_shadow_score_abs_diff",
        "Mean absolute difference of the shadow's scores from the pipeline model's, "
        "over recent rows",
        "pipeline",
    )
    shadow_seconds = histogram(
        "streamfer_shadow_seconds", "Seconds per batch in the shadow model", "pipeline"
    )

    def for_pipeline(self, name: str) -> PipelineMetrics:
        stage = self.stage_seconds
        return PipelineMetrics(
            records=self.records.labels(name),
            results=self.results.labels(name),
            batches=self.batches.labels(name),
            batch_size=self.batch_size.labels(name),
            queue_seconds=stage.labels(name, "queue"),
            decode_seconds=stage.labels(name, "decode"),
            enrich_seconds=stage.labels(name, "enrich"),
            infer_seconds=stage.labels(name, "infer"),
            publish_seconds=stage.labels(name, "publish"),
            commit_seconds=stage.labels(name, "commit"),
            end_to_end_seconds=self.end_to_end_seconds.labels(name),
            feature_hits=self.feature_lookups.labels(name, "hit"),
            feature_misses=self.feature_lookups.labels(name, "miss"),
            feature_store_errors=self.feature_store_errors.labels(name),
            schema_registry_errors=self.schema_registry_errors.labels(name),
            dead_letters=self.dead_letters,
            pipeline=name,
            canary_records=self.canary_records.labels(name),
            model_failed_batches=self.model_failed_batches.labels(name),
            model_paused=self.model_paused.labels(name),
        )

    def for_shadow(self, name: str) -> ShadowMetrics:
        batches = self.shadow_batches
        return ShadowMetrics(
            done=batches.labels(name, "done"),
            dropped=batches.labels(name, "dropped"),
            failed=batches.labels(name, "failed"),
            label_agreement=self.shadow_label_agreement.labels(name),
            score_abs_diff=self.shadow_score_abs_diff.labels(name),
            seconds=self.shadow_seconds.labels(name),
        )
