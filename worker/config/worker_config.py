"""The whole configuration of one worker process (``WorkerConfig``): its connections, its
pipelines, how results are delivered, the in-flight bounds, timeouts, logs and its HTTP
endpoint (``MetricsSettings``); and the rules that span pipelines (no topic both read
and written, every in-flight share room for a batch, nothing a share group cannot
give)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, model_validator

from worker.config.base import Frozen, owners
from worker.config.connections import KafkaSettings, RedisSettings
from worker.config.pipeline import PipelineConfig
from worker.config.schema_registry import SchemaRegistrySettings
from worker.errors import ConfigError

__all__ = ["MetricsSettings", "WorkerConfig", "is_loopback"]


class MetricsSettings(Frozen):
    """The Prometheus endpoint; off unless a port is given. ``reload_endpoint`` adds
    ``POST /reload`` (look for a new model now), for a loopback ``host`` only."""

    host: str = Field(
        default="127.0.0.1", description="The address the metrics and probe server binds to."
    )
    port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve /metrics, /healthz and /readyz on this port; None: no server.",
    )
    reload_endpoint: bool = Field(
        default=False,
        description=(
            "Answer POST /reload (a model reload) on the metrics server; loopback hosts only."
        ),
    )

    @model_validator(mode="after")
    def _reload_only_on_loopback(self) -> MetricsSettings:
        if self.reload_endpoint and not is_loopback(self.host):
            raise ValueError(
                f"reload_endpoint = true needs a loopback host (127.0.0.1, ::1 or "
                f"localhost), not {self.host!r}: anyone who reaches the port could make "
                "the worker load models; send SIGHUP instead"
            )
        return self


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is only reachable from this host."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WorkerConfig(Frozen):
    """Everything one worker process needs; several pipelines may share it."""

    kafka: KafkaSettings = Field(
        default=KafkaSettings(), description="The Kafka cluster and the group."
    )
    redis: RedisSettings = Field(default=RedisSettings(), description="The Redis feature store.")
    schema_registry: SchemaRegistrySettings = Field(
        default=SchemaRegistrySettings(),
        description=(
            "The Schema Registry for Avro, Protobuf and JSON Schema requests or Avro results."
        ),
    )
    pipelines: list[PipelineConfig] = Field(
        min_length=1,
        description="The pipelines this worker serves: each its topics, features and model.",
    )
    delivery: Literal["at-least-once", "exactly-once"] = Field(
        default="at-least-once",
        description=(
            "at-least-once: commit after every result is acknowledged; "
            "exactly-once: results, dead letters and offsets in one Kafka "
            "transaction."
        ),
    )
    transaction_interval_ms: float = Field(
        default=100.0,
        ge=0,
        le=60_000,
        description=(
            "exactly-once: batches waiting behind each other share one transaction this long."
        ),
    )
    exactly_once_probe: bool = Field(
        default=True,
        description=(
            "exactly-once: prove at start-up that the broker hides aborted records "
            "from read_committed readers, on `exactly_once_probe_topic`. False "
            "skips it (a warning)."
        ),
    )
    exactly_once_probe_topic: str = Field(
        default="__streamfer_transaction_probe",
        min_length=1,
        max_length=249,
        description=(
            "Created (one partition, the cluster's default replication) when "
            "missing; where the worker's user may not create topics, create it "
            "beforehand and allow it to use it."
        ),
    )
    max_in_flight_batches: int = Field(
        default=4,
        ge=1,
        le=1024,
        description=(
            "Records consumed and not yet delivered (or whose commit the broker refused "
            "or left unanswered) stay under this many full batches' worth "
            "(x max_batch_size); beyond it the loop waits, then pauses its partitions."
        ),
    )
    commit_interval_ms: float = Field(
        default=100.0,
        ge=0,
        le=60_000,
        description=(
            "At-least-once: the least time between two asynchronous offset commits. "
            "Delivered batches are retired at once and their offsets merged into the next "
            "commit, so commits per second stay under 1000 / commit_interval_ms whatever "
            "the batch rate; a crash repeats at most this long's delivered records more. "
            "0 commits after every loop turn that delivered something."
        ),
    )
    bulk_in_flight_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "The share of the in-flight bound a pipeline may hold while another "
            "pipeline of this worker has a higher priority (its own "
            "`max_in_flight_share` overrides it): room kept for the "
            "latency-sensitive pipeline's records."
        ),
    )
    max_overtaken_ms: float = Field(
        default=500.0,
        gt=0,
        le=600_000,
        description=(
            "A batch that higher-priority batches have overtaken at one stage for "
            "this long goes next there: under a sustained overload of the higher "
            "priority, lower ones still get one batch through per stage this often."
        ),
    )
    poll_timeout_ms: float = Field(
        default=100.0, gt=0, le=10_000, description="How long one consume call waits for records."
    )
    shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=("How long a stopping worker drains (deliveries, commits) before it gives up."),
    )
    revoke_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "How long a rebalance waits for the revoked partitions' deliveries and commit."
        ),
    )
    feature_store_retry_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "How long one batch waits for an unreachable feature store; None: until it is back."
        ),
    )
    statistics_interval_ms: int = Field(
        default=5000,
        ge=0,
        description=(
            "How often librdkafka reports statistics (consumer lag, group membership for /readyz)."
        ),
    )
    liveness_timeout_s: float = Field(
        default=60.0, gt=0, description="/healthz fails when the loop has not turned for this long."
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="Log lines as text or one JSON object each, on stderr."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The lowest level logged."
    )
    metrics: MetricsSettings = Field(
        default=MetricsSettings(), description="The metrics and probe server."
    )

    @model_validator(mode="after")
    def _registry_where_needed(self) -> WorkerConfig:
        needing = [
            f"{p.name} ({p.request_format})"
            for p in self.pipelines
            if p.request_format in ("avro", "json-schema")
        ]
        if needing and self.schema_registry.url is None:
            raise ValueError(
                f"pipelines {', '.join(needing)} read requests framed for a Schema "
                "Registry: set [schema_registry] url"
            )
        writing = [p.name for p in self.pipelines if p.result_format == "avro"]
        if writing and self.schema_registry.url is None:
            raise ValueError(
                f'pipelines {", ".join(writing)} write result_format = "avro": set '
                "[schema_registry] url"
            )
        return self

    @model_validator(mode="after")
    def _topics_are_unambiguous(self) -> WorkerConfig:
        names = [p.name for p in self.pipelines]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline names must be unique, got {names}")
        owner = owners(
            ((p.name, p.request_topics) for p in self.pipelines), "request topic", "pipelines"
        )
        for p in self.pipelines:
            shadow = [p.shadow.topic] if p.shadow is not None else []
            for out in (p.result_topic, p.dead_letter_topic, *shadow):
                if out in owner:
                    raise ValueError(f"output topic {out!r} of {p.name!r} is also a request topic")
        return self

    @model_validator(mode="after")
    def _share_group_delivery(self) -> WorkerConfig:
        """What a share group cannot give is refused, naming why."""
        if not self.kafka.share_group:
            return self
        if self.delivery == "exactly-once":
            raise ValueError(
                'delivery = "exactly-once" with [kafka] share_group = true: a share group '
                "acknowledges records outside any transaction (transactional "
                "acknowledgements are KIP-1289, not in Apache Kafka yet), so results and "
                'acknowledgements cannot commit together; use "at-least-once"'
            )
        shared = [
            f"pipelines[{i}].max_in_flight_share"
            for i, p in enumerate(self.pipelines)
            if p.max_in_flight_share is not None
        ]
        if "bulk_in_flight_share" in self.model_fields_set:
            shared.append("bulk_in_flight_share")
        if shared:
            raise ValueError(
                f"{', '.join(shared)} with [kafka] share_group = true: a share group's poll "
                "is not fetched per pipeline, so a pipeline's share of the in-flight bound "
                "cannot be kept; remove it (priorities still order the stages)"
            )
        if self.statistics_interval_ms == 0:
            raise ValueError(
                "statistics_interval_ms = 0 with [kafka] share_group = true: a share-group "
                "member learns from librdkafka's statistics that it joined (an empty topic "
                "brings no records to tell it), so /readyz and --burst need them; leave it "
                "at its default (5000) or set it above 0"
            )
        return self

    @model_validator(mode="after")
    def _shares_hold_a_batch(self) -> WorkerConfig:
        bound = self.in_flight_bound
        for i, p in enumerate(self.pipelines):
            share = self.in_flight_share(p)
            if share is None or share * bound >= p.batch.max_batch_size:
                continue
            field = (
                f"pipelines[{i}].max_in_flight_share"
                if p.max_in_flight_share is not None
                else f"bulk_in_flight_share (which applies to pipelines[{i}], {p.name!r})"
            )
            raise ValueError(
                f"{field}: {share:g} of the in-flight bound ({bound} records: "
                f"max_in_flight_batches x the largest max_batch_size) is "
                f"{int(share * bound)} records, less than one batch of {p.name!r} "
                f"(max_batch_size {p.batch.max_batch_size}); raise the share or "
                "max_in_flight_batches, or lower that max_batch_size"
            )
        return self

    @property
    def in_flight_bound(self) -> int:
        """Records in flight at which every owned partition pauses."""
        return self.max_in_flight_batches * max(p.batch.max_batch_size for p in self.pipelines)

    def in_flight_share(self, pipeline: PipelineConfig) -> float | None:
        """The share of ``in_flight_bound`` the pipeline may hold, or None for no limit of
        its own: its ``max_in_flight_share``, else ``bulk_in_flight_share`` when another
        pipeline has a higher priority."""
        if pipeline.max_in_flight_share is not None:
            return pipeline.max_in_flight_share
        top = max(p.rank for p in self.pipelines)
        return self.bulk_in_flight_share if pipeline.rank < top else None

    def pipeline(self, name: str) -> PipelineConfig:
        """The pipeline called ``name``. Raises ``ConfigError`` listing those there are."""
        for p in self.pipelines:
            if p.name == name:
                return p
        names = [p.name for p in self.pipelines]
        raise ConfigError(f"no pipeline {name!r}; the config has {names}")
