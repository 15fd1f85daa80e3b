"""``streamfer replay``: plan (or reload) a replay, run it, print what it did.

A replay is one process of its own: ``--max-rate`` bounds the load it puts on Kafka and
Redis, and ``--nice`` (10 by default) lowers its CPU priority so live workers on the
same host come first. The model and the feature store are opened before the plan is
saved, so one that cannot serve fails before anything is written; a resume checks that
the model is still the plan's (``worker.replay.model``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO, cast

import orjson
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from worker.config import KafkaSettings, PipelineConfig, WorkerConfig
from worker.core import PartitionKey
from worker.errors import ConfigError, SourceError, StreamferError
from worker.kafka import admin_client, create_missing, producer_config
from worker.models import Parts, build_pipeline
from worker.pipeline import Pipeline, PipelineFamilies, result_encoder
from worker.registry import framed_decoders, needs_registry, open_registry
from worker.replay.model import open_model, served_version
from worker.replay.pace import Progress, RateLimiter
from worker.replay.plan import (
    ReplayOptions,
    ReplayPlan,
    StateStore,
    new_plan,
    pick_pipeline,
    replay_group,
    resume_positions,
)
from worker.replay.run import Replay, ReplayConsumer, ReplaySink
from worker.tools import KafkaOffsets, lookup_consumer_config

__all__ = ["PartitionReport", "ReplaySummary", "run_replay"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """One partition of a run: its range, where this run began, what it read, and the
    checkpoint it left."""

    topic: str
    partition: int
    start: int
    end: int
    resumed_from: int
    records: int
    checkpoint: int


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """What one run of a replay did; ``as_dict`` is the ``--json`` output."""

    replay_id: str
    pipeline: str
    output_topic: str
    dead_letter_topic: str
    model: dict[str, Any]
    partitions: list[PartitionReport]
    records: int
    """Records read in range by this run."""
    results: int
    dead_letters: int
    lost: int
    """Checkpointed records without an acknowledged result or dead letter: always 0 unless
    the one-outcome-per-record contract is broken."""
    unconfirmed: int
    """Records read but not checkpointed (a failure or stop left their deliveries
    unconfirmed): not lost, a resume reads them again."""
    elapsed_s: float
    complete: bool
    resumed: bool
    error: str | None = None

    @property
    def rate_rps(self) -> float:
        return round(self.records / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["rate_rps"] = self.rate_rps
        return doc


def _ensure_output_topics(settings: KafkaSettings, topics: Sequence[tuple[str, str]]) -> None:
    """Create each ``(name, like)`` topic missing, with ``like``'s partition count and
    replication factor (so keys land as in the live topic)."""
    admin = admin_client(settings, logger=log)
    meta = admin.list_topics(timeout=15).topics
    new = []
    for name, like in topics:
        if name in meta and meta[name].error is None:
            continue
        model = meta.get(like)
        if model is None or not model.partitions:
            raise ConfigError(f"topic {like!r} does not exist; cannot size {name!r} after it")
        replicas = len(next(iter(model.partitions.values())).replicas)
        new.append(
            NewTopic(name, num_partitions=len(model.partitions), replication_factor=replicas)
        )
    create_missing(admin, new, timeout=30, error=SourceError, logger=log)


def _model_doc(plan: ReplayPlan) -> dict[str, Any]:
    """The plan's model as the dry run and the summary show it; a Triton server's too."""
    doc: dict[str, Any] = {
        "name": plan.model_name,
        "version": plan.model_version,
        "path": plan.model_path,
    }
    if plan.server is not None:
        doc |= {"server": plan.server, "server_model": plan.server_model}
    if plan.steps:
        doc["steps"] = [{k: v for k, v in asdict(s).items() if v is not None} for s in plan.steps]
    return doc


def _dry_run_doc(plan: ReplayPlan, positions: dict[PartitionKey, int]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for r in plan.ranges:
        begin = positions[r.key]
        parts.append(
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                "from": begin,
                "records": max(0, r.end - begin),
            }
        )
    return {
        "replay_id": plan.replay_id,
        "pipeline": plan.pipeline,
        "output_topic": plan.output_topic,
        "dead_letter_topic": plan.dead_letter_topic,
        "model": _model_doc(plan),
        "partitions": parts,
        "records": sum(p["records"] for p in parts),
    }


def _print_dry_run(doc: dict[str, Any], *, as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(orjson.dumps(doc).decode() + "\n")
        return
    out.write(
        f"replay {doc['replay_id']} of pipeline {doc['pipeline']} -> {doc['output_topic']} "
        f"(dead letters -> {doc['dead_letter_topic']}), model {doc['model']['name']} "
        f"version {doc['model']['version']}\n"
    )
    for p in doc["partitions"]:
        out.write(
            f"  {p['topic']}[{p['partition']}]  offsets {p['from']}..{p['end']}  "
            f"{p['records']:,} records\n"
        )
    out.write(f"  total {doc['records']:,} records (offset span; markers count too)\n")


def _print_summary(summary: ReplaySummary, *, as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(orjson.dumps(summary.as_dict()).decode() + "\n")
        return
    state = "complete" if summary.complete else "stopped before its end"
    out.write(
        f"replay {summary.replay_id}: {state}; {summary.records:,} records, "
        f"{summary.results:,} results, {summary.dead_letters:,} dead letters, "
        f"{summary.lost} lost, {summary.elapsed_s:.1f}s, {summary.rate_rps:,.0f} records/s\n"
    )
    for p in summary.partitions:
        out.write(
            f"  {p.topic}[{p.partition}]  {p.start}..{p.end}  from {p.resumed_from}  "
            f"{p.records:,} records  checkpoint {p.checkpoint}\n"
        )
    if not summary.complete:
        out.write(f"resume with: streamfer replay --config ... --resume {summary.replay_id}\n")


def run_replay(
    config: WorkerConfig,
    opts: ReplayOptions,
    *,
    on_start: Callable[[Replay], None] | None = None,
    out: TextIO | None = None,
    as_json: bool = False,
) -> int:
    """Plan (or reload) a replay and run it; print the dry run or the summary to ``out``.

    Returns the exit code: 0 complete (or a dry run), 1 failed, 3 stopped before its end.
    After 1 or 3 the replay is resumable: its checkpoint holds only delivered batches.
    Raises ``ConfigError`` for bad options or state, before anything is read.
    """
    out = out if out is not None else sys.stdout
    store = StateStore(opts.state_dir)
    resuming = opts.resume is not None
    replay_id = opts.resume or opts.replay_id or uuid.uuid4().hex[:12]
    store.path(replay_id)  # validates the id
    if not resuming and store.exists(replay_id):
        raise ConfigError(f"replay {replay_id!r} exists already; continue it with --resume")
    if config.kafka.share_group:
        log.info(
            "[kafka] share_group = true: the replay reads its range by assignment, as "
            "consumer group %s of its own; share group %s and its records are left alone",
            replay_group(replay_id),
            config.kafka.group_id,
        )
    consumer = Consumer(
        {
            **lookup_consumer_config(config.kafka, replay_group(replay_id)),
            "enable.partition.eof": True,
        }
    )
    offsets = KafkaOffsets(consumer)
    try:
        plan = (
            store.load(replay_id)
            if resuming
            else new_plan(config, opts, offsets, replay_id, served_version)
        )
        pipeline_cfg = pick_pipeline(config, plan.pipeline)
        committed = offsets.committed([r.key for r in plan.ranges])
        if not resuming and any(v is not None for v in committed.values()):
            raise ConfigError(f"group {plan.group} has checkpoints already; pick another id")
        positions = resume_positions(plan.ranges, committed)
        if opts.dry_run:
            _print_dry_run(_dry_run_doc(plan, positions), as_json=as_json, out=out)
            return 0
        with store.lock(replay_id):
            summary = _run_locked(
                config, opts, plan, pipeline_cfg, positions, consumer, store, resuming, on_start
            )
    finally:
        offsets.close()
    _print_summary(summary, as_json=as_json, out=out)
    if summary.error is not None:
        log.error("replay %s failed: %s", replay_id, summary.error)
        return 1
    return 0 if summary.complete else 3


def _run_locked(
    config: WorkerConfig,
    opts: ReplayOptions,
    plan: ReplayPlan,
    pipeline_cfg: PipelineConfig,
    positions: dict[PartitionKey, int],
    consumer: Consumer,
    store: StateStore,
    resuming: bool,
    on_start: Callable[[Replay], None] | None,
) -> ReplaySummary:
    """Build the real parts (model and feature store first: one that cannot serve fails
    before anything is written), save a new plan, run, and summarise. Holds the replay's
    lock."""
    if opts.nice:
        os.nice(opts.nice)
    parts, served, plan = open_model(
        pipeline_cfg, config.redis, plan, resuming=resuming, current=opts.current_model
    )
    engine, features = parts.engine, parts.store
    try:
        if not resuming or opts.current_model:
            store.save(plan)
        _ensure_output_topics(
            config.kafka,
            [
                (plan.output_topic, pipeline_cfg.result_topic),
                (plan.dead_letter_topic, pipeline_cfg.dead_letter_topic),
            ],
        )
    except BaseException:
        features.close()
        raise
    abort = threading.Event()
    pipeline = _replay_pipeline(config, plan, served, parts, abort)
    sink = ReplaySink(
        Producer(producer_config(config.kafka)), plan.replay_id, plan.dead_letter_topic
    )
    total = sum(max(0, r.end - positions[r.key]) for r in plan.ranges)
    replay = Replay(
        plan=plan,
        positions=positions,
        consumer=cast(ReplayConsumer, consumer),
        sink=sink,
        pipeline=pipeline,
        batch=pipeline_cfg.batch,
        max_in_flight_batches=config.max_in_flight_batches,
        poll_timeout_s=config.poll_timeout_ms / 1000.0,
        checkpoint_interval_s=opts.checkpoint_interval_s,
        shutdown_timeout_s=config.shutdown_timeout_s,
        limiter=RateLimiter(opts.max_rate) if opts.max_rate else None,
        progress=Progress(total, label=f"replay {plan.replay_id}") if opts.progress else None,
        abort=abort,
    )
    if on_start is not None:
        on_start(replay)
    log.info(
        "replay %s (group %s): pipeline %s, %d offsets in %d partitions -> %s",
        plan.replay_id,
        plan.group,
        plan.pipeline,
        total,
        len(plan.ranges),
        plan.output_topic,
    )
    started = time.monotonic()
    error: str | None = None
    try:
        replay.run()
    except StreamferError as exc:
        error = str(exc)
    finally:
        sink.flush(5.0)
        features.close()
    return _summary(plan, positions, replay, engine.model_hash, started, error, resuming)


def _replay_pipeline(
    config: WorkerConfig,
    plan: ReplayPlan,
    pipeline_cfg: PipelineConfig,
    parts: Parts,
    abort: threading.Event,
) -> Pipeline:
    """The pipeline ``plan`` runs: ``pipeline_cfg`` writing to the replay's own topics,
    with the registry's decoders and result encoder where its formats need them."""
    replayed = pipeline_cfg.model_copy(
        update={"result_topic": plan.output_topic, "dead_letter_topic": plan.dead_letter_topic}
    )
    only = config.model_copy(update={"pipelines": [replayed]})
    schema_registry = open_registry(config.schema_registry) if needs_registry(only) else None
    framed = framed_decoders(only, schema_registry)
    return build_pipeline(
        replayed,
        store=parts.store,
        engine=parts.engine,
        plan=parts.plan,
        metrics=PipelineFamilies().for_pipeline(plan.pipeline),
        hooks=parts.hooks,
        retry_feature_store_s=30.0,
        abort=abort,
        framed=framed.get(pipeline_cfg.name),
        avro_results=result_encoder(replayed, schema_registry, parts.engine, parts.plan),
    )


def _summary(
    plan: ReplayPlan,
    positions: dict[PartitionKey, int],
    replay: Replay,
    model_hash: str,
    started: float,
    error: str | None,
    resuming: bool,
) -> ReplaySummary:
    """What the run did, partition by partition, for the summary line or JSON."""
    return ReplaySummary(
        replay_id=plan.replay_id,
        pipeline=plan.pipeline,
        output_topic=plan.output_topic,
        dead_letter_topic=plan.dead_letter_topic,
        model={**_model_doc(plan), "sha256": model_hash},
        partitions=[
            PartitionReport(
                r.topic,
                r.partition,
                r.start,
                r.end,
                positions[r.key],
                replay.per_partition[r.key],
                replay.checkpoints.get(r.key, positions[r.key]),
            )
            for r in plan.ranges
        ],
        records=replay.records,
        results=replay.results,
        dead_letters=replay.dead_letters,
        lost=replay.checkpointed - replay.results - replay.dead_letters,
        unconfirmed=replay.records - replay.checkpointed,
        elapsed_s=round(time.monotonic() - started, 3),
        complete=replay.complete and error is None,
        resumed=resuming,
        error=error,
    )
