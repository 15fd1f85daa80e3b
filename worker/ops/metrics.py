"""Prometheus metrics of one worker, on an injected ``CollectorRegistry``.

Nothing is registered at import time, so tests can build many workers in one process.
Label children are resolved once per pipeline, never per record, and no label ever
carries a record key or id. ``METRIC_NAMES`` lists every exported family; dashboards and
alerts may only use these.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "METRIC_NAMES",
    "STAGES",
    "THREAD_STAGES",
    "CacheMetrics",
    "Metrics",
    "PipelineMetrics",
    "ShadowMetrics",
    "ShareMetrics",
]

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
STAGES = ("queue", "decode", "enrich", "infer", "publish", "commit")
THREAD_STAGES = ("decode", "infer", "publish")
"""The processing threads' stages, by index, as ``streamfer_stage_wait_seconds`` names
them (the first thread decodes and enriches)."""


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


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    """Pre-bound children of one pipeline's output cache (``worker.cache.output_cache``)."""

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


@dataclass(frozen=True, slots=True)
class ShareMetrics:
    """Pre-bound children of one pipeline in a share group (``worker.loop.share_worker``)."""

    accepted: Counter
    released: Counter
    redeliveries: Counter
    lock_overruns: Counter
    acknowledgement_errors: Counter


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
            "Seconds per batch in each stage (queue: first record's Kafka timestamp to "
            "processing start; commit: last delivery to offset commit)",
            ["pipeline", "stage"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "streamfer_end_to_end_seconds",
            "Request Kafka timestamp to the acknowledgement of its batch's results",
            ["pipeline"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.feature_lookups = Counter(
            "streamfer_feature_lookups",
            "Entity lookups in the feature store by outcome",
            ["pipeline", "outcome"],
            registry=r,
        )
        self.feature_store_errors = Counter(
            "streamfer_feature_store_errors",
            "Failed feature-store round trips (retried)",
            ["pipeline"],
            registry=r,
        )
        self.schema_registry_errors = Counter(
            "streamfer_schema_registry_errors",
            "Batches that found the Schema Registry unusable (retried)",
            ["pipeline"],
            registry=r,
        )
        self.model_info = Gauge(
            "streamfer_model_info",
            "The model each pipeline serves (value is always 1)",
            ["pipeline", "name", "version", "sha256", "provider"],
            registry=r,
        )
        self.inference_provider = Gauge(
            "streamfer_inference_provider",
            "The execution provider that serves each pipeline's model, and the one the "
            "config asked for first (value is always 1; they differ after a fallback)",
            ["pipeline", "provider", "requested"],
            registry=r,
        )
        self.model_reloads = Counter(
            "streamfer_model_reloads",
            "New model versions or changed model files: loaded (now serving) or refused "
            "(failed to load, warm or fit the pipeline; the previous one keeps serving)",
            ["pipeline", "result"],
            registry=r,
        )
        self.model_failed_batches = Counter(
            "streamfer_model_failed_batches",
            "Batches the pipeline's model refused every row of while nothing showed the "
            "records at fault (a row it answered before was refused too, or it had "
            "answered none yet)",
            ["pipeline"],
            registry=r,
        )
        self.model_paused = Gauge(
            "streamfer_model_paused",
            "1 while a pipeline holds a batch for a fault of its model (its partitions "
            "pause as the in-flight bound fills; nothing is dead-lettered)",
            ["pipeline"],
            registry=r,
        )
        self.canary_records = Counter(
            "streamfer_canary_records",
            "Records scored by the pipeline's canary model instead of its own",
            ["pipeline"],
            registry=r,
        )
        self.shadow_batches = Counter(
            "streamfer_shadow_batches",
            "Batches for the shadow model: done (its results produced and acknowledged), "
            "dropped (it was behind) or failed (its model or its results' delivery failed)",
            ["pipeline", "result"],
            registry=r,
        )
        self.shadow_label_agreement = Gauge(
            "streamfer_shadow_label_agreement",
            "Share of recent rows whose shadow label equals the pipeline model's",
            ["pipeline"],
            registry=r,
        )
        self.shadow_score_abs_diff = Gauge(
            "streamfer_shadow_score_abs_diff",
            "Mean absolute difference of the shadow's scores from the pipeline model's, "
            "over recent rows",
            ["pipeline"],
            registry=r,
        )
        self.shadow_seconds = Histogram(
            "streamfer_shadow_seconds",
            "Seconds per batch in the shadow model",
            ["pipeline"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.device_oom_retries = Counter(
            "streamfer_device_oom_retries",
            "Batches halved and retried after the device (or its memory arena) ran out of memory",
            ["pipeline"],
            registry=r,
        )
        self.triton_call_seconds = Histogram(
            "streamfer_triton_call_seconds",
            "Seconds per call to the Triton Inference Server that runs a pipeline's model "
            "(a batch is one call per max_batch_size rows), failed calls included",
            ["pipeline"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.triton_errors = Counter(
            "streamfer_triton_errors",
            "Failed calls to the Triton server: unavailable (down, past the timeout, "
            "overloaded, not serving the model: the batch waits and is retried) or model "
            "(the model refused the batch: its rows are tried apart)",
            ["pipeline", "kind"],
            registry=r,
        )
        self.stage_wait_seconds = Histogram(
            "streamfer_stage_wait_seconds",
            "Seconds a batch waited for a processing thread (decode: the first, which also "
            "enriches; infer; publish): where a priority lane goes ahead",
            ["pipeline", "stage"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.aged_batches = Counter(
            "streamfer_aged_batches",
            "Batches a processing thread took ahead of higher-priority ones because those had "
            "overtaken them for max_overtaken_ms (the higher priority is overloaded)",
            ["pipeline", "stage"],
            registry=r,
        )
        self.pipeline_priority = Gauge(
            "streamfer_pipeline_priority",
            "Each pipeline's priority as an integer (higher goes to the model first)",
            ["pipeline"],
            registry=r,
        )
        self.in_flight_records = Gauge(
            "streamfer_in_flight_records",
            "Records of each pipeline's uncommitted batches, counted against the in-flight bound",
            ["pipeline"],
            registry=r,
        )
        self.in_flight_share_held = Gauge(
            "streamfer_in_flight_share_held",
            "1 while a pipeline holds its share of the in-flight bound and only its "
            "partitions are paused",
            ["pipeline"],
            registry=r,
        )
        self.in_flight_batches = Gauge(
            "streamfer_in_flight_batches", "Batches submitted but not yet committed", registry=r
        )
        self.paused_partitions = Gauge(
            "streamfer_paused_partitions", "Partitions paused for backpressure", registry=r
        )
        self.assigned_partitions = Gauge(
            "streamfer_assigned_partitions", "Partitions this worker owns", registry=r
        )
        self.consumer_lag = Gauge(
            "streamfer_consumer_lag",
            "Records behind the log end, per owned partition",
            ["topic", "partition"],
            registry=r,
        )
        self.seconds_to_drain = Gauge(
            "streamfer_seconds_to_drain",
            "Total lag of owned partitions divided by recent throughput",
            registry=r,
        )
        self.ready = Gauge("streamfer_ready", "1 when the worker is ready", registry=r)
        self.commits = Counter("streamfer_commits", "Offset commits issued", registry=r)
        self.commit_failures = Counter(
            "streamfer_commit_failures", "Offset commits rejected or failed", registry=r
        )
        self.rebalances = Counter(
            "streamfer_rebalances", "Partition assignment changes", ["kind"], registry=r
        )
        self.group_rejoins = Counter(
            "streamfer_group_rejoins",
            "Rejoins to make the group rebalance: partitions no member owned",
            registry=r,
        )
        self.share_acknowledged = Counter(
            "streamfer_share_acknowledged_records",
            "Share groups: records this worker acknowledged, by type (accept: its result or "
            "dead letter was delivered; release: not delivered, the broker delivers it again)",
            ["pipeline", "type"],
            registry=r,
        )
        self.share_redeliveries = Counter(
            "streamfer_share_redeliveries",
            "Share groups: records received on a second or later delivery (a lock expired, "
            "or a member released them or died holding them)",
            ["pipeline"],
            registry=r,
        )
        self.share_lock_overruns = Counter(
            "streamfer_share_lock_overruns",
            "Share groups: records still being processed when their acquisition lock "
            "expired; the broker may have delivered them to another member meanwhile",
            ["pipeline"],
            registry=r,
        )
        self.share_acknowledgement_errors = Counter(
            "streamfer_share_acknowledgement_errors",
            "Share groups: records whose acknowledgement the broker answered with an error "
            "(they are delivered again)",
            ["pipeline"],
            registry=r,
        )
        self.cache_hits = Counter(
            "streamfer_cache_hits",
            "Rows the output cache served instead of the model, by tier (memory, redis, or "
            "batch: a repeat of a row the model computed in the same batch)",
            ["pipeline", "tier"],
            registry=r,
        )
        self.cache_misses = Counter(
            "streamfer_cache_misses",
            "Rows the output cache did not hold, which the model computed",
            ["pipeline"],
            registry=r,
        )
        self.cache_evictions = Counter(
            "streamfer_cache_evictions",
            "Least recently used entries the in-process output cache dropped to stay "
            "within max_entries and max_bytes",
            ["pipeline"],
            registry=r,
        )
        self.cache_entries = Gauge(
            "streamfer_cache_entries",
            "Entries held by the in-process output cache",
            ["pipeline"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "streamfer_cache_bytes",
            "Bytes the in-process output cache's entries take (keys, values and the "
            "map's own cost per entry), bounded by max_bytes",
            ["pipeline"],
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "streamfer_cache_hit_ratio",
            "Share of rows the output cache served, over the pipeline's last 100 batches",
            ["pipeline"],
            registry=r,
        )
        self.cache_errors = Counter(
            "streamfer_cache_errors",
            "Output cache Redis tier troubles, which read as misses: failed round trips "
            "(redis) and stored values that could not be read (corrupt)",
            ["pipeline", "kind"],
            registry=r,
        )

    def for_share(self, name: str) -> ShareMetrics:
        acknowledged = self.share_acknowledged
        return ShareMetrics(
            accepted=acknowledged.labels(name, "accept"),
            released=acknowledged.labels(name, "release"),
            redeliveries=self.share_redeliveries.labels(name),
            lock_overruns=self.share_lock_overruns.labels(name),
            acknowledgement_errors=self.share_acknowledgement_errors.labels(name),
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


METRIC_NAMES = (
    "streamfer_records_total",
    "streamfer_results_total",
    "streamfer_dead_letters_total",
    "streamfer_batches_total",
    "streamfer_batch_size",
    "streamfer_stage_seconds",
    "streamfer_end_to_end_seconds",
    "streamfer_feature_lookups_total",
    "streamfer_feature_store_errors_total",
    "streamfer_schema_registry_errors_total",
    "streamfer_model_info",
    "streamfer_inference_provider",
    "streamfer_model_reloads_total",
    "streamfer_model_failed_batches_total",
    "streamfer_model_paused",
    "streamfer_canary_records_total",
    "streamfer_shadow_batches_total",
    "streamfer_shadow_label_agreement",
    "streamfer_shadow_score_abs_diff",
    "streamfer_shadow_seconds",
    "streamfer_device_oom_retries_total",
    "streamfer_triton_call_seconds",
    "streamfer_triton_errors_total",
    "streamfer_stage_wait_seconds",
    "streamfer_aged_batches_total",
    "streamfer_pipeline_priority",
    "streamfer_in_flight_records",
    "streamfer_in_flight_share_held",
    "streamfer_in_flight_batches",
    "streamfer_paused_partitions",
    "streamfer_assigned_partitions",
    "streamfer_consumer_lag",
    "streamfer_seconds_to_drain",
    "streamfer_ready",
    "streamfer_commits_total",
    "streamfer_commit_failures_total",
    "streamfer_rebalances_total",
    "streamfer_group_rejoins_total",
    "streamfer_share_acknowledged_records_total",
    "streamfer_share_redeliveries_total",
    "streamfer_share_lock_overruns_total",
    "streamfer_share_acknowledgement_errors_total",
    "streamfer_cache_hits_total",
    "streamfer_cache_misses_total",
    "streamfer_cache_evictions_total",
    "streamfer_cache_entries",
    "streamfer_cache_bytes",
    "streamfer_cache_hit_ratio",
    "streamfer_cache_errors_total",
)
