"""Replay and backfill: run a bounded slice of history through a pipeline, resumably.

``streamfer replay`` resolves its bounds (times through ``offsets_for_times``, offsets,
partitions, or the whole topic) into one offset range per partition (``worker.ranges``),
with every end fixed when the replay is planned, so live traffic arriving meanwhile does
not extend it. It reads with ``assign()`` (never joining the live group, never touching
its offsets), processes batches with the live ``Pipeline`` and publishes to its own topics
(by default ``<result_topic>.replay.<model_version>``), every record also carrying a
``streamfer.replay_id`` header so consumers can tell replayed results apart and dedupe.
Progress is checkpointed the live way, as committed offsets of its own group
``streamfer-replay-<id>``, only for the delivered prefix of batches, so a killed replay
resumed with ``--resume ID`` repeats at most its unconfirmed tail and leaves no gap. The
plan itself (ranges, output topics, model file, version and hash) is a small JSON file in
the state directory, written before the first record is read: the ranges must not change
on resume, and a file is readable by an operator, whereas commit metadata would scatter
it over partitions and cap it at the broker's metadata limit. A replay is one process of
its own; ``--max-rate`` bounds the load it puts on Kafka and Redis, and ``--nice`` (10 by
default) lowers its CPU priority so live workers on the same host come first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

import orjson
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from worker.admin import admin_client
from worker.batch import Job
from worker.batcher import Batcher, Clock, monotonic_clock
from worker.commit import Committer, OffsetConsumer, PartitionKey
from worker.config import BatchPolicy, KafkaSettings, PipelineConfig, WorkerConfig
from worker.errors import ConfigError, SinkError, SourceError, StreamferError
from worker.offsets import KafkaOffsets, lookup_consumer_config
from worker.progress import ProgressLine
from worker.ranges import Bounds, OffsetLookup, PartitionRange, resolve_ranges
from worker.sink import DeliveryTracker, Headers, Sink, producer_config
from worker.source import end_of_partition
from worker.topics import create_missing

__all__ = [
    "REPLAY_ID_HEADER",
    "BatchHandler",
    "PartitionReport",
    "Progress",
    "RateLimiter",
    "Replay",
    "ReplayConsumer",
    "ReplayOptions",
    "ReplayPlan",
    "ReplaySink",
    "ReplaySummary",
    "StateStore",
    "default_output_topic",
    "format_duration",
    "format_progress",
    "replay_group",
    "resume_positions",
    "run_replay",
]

log = logging.getLogger(__name__)

REPLAY_ID_HEADER = "streamfer.replay_id"
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
STATE_VERSION = 1


def replay_group(replay_id: str) -> str:
    """The consumer group whose committed offsets are a replay's checkpoint."""
    return f"streamfer-replay-{replay_id}"


def default_output_topic(topic: str, model_version: str) -> str:
    """``<topic>.replay.<model_version>``; raises ``ConfigError`` if not a legal name."""
    name = f"{topic}.replay.{model_version}"
    if not _TOPIC.match(name):
        raise ConfigError(
            f"{name!r} is not a legal topic name (model version {model_version!r}); "
            "pass --output-topic"
        )
    return name


# --- resuming ---------------------------------------------------------------------------


def resume_positions(
    ranges: Sequence[PartitionRange], committed: dict[PartitionKey, int | None]
) -> dict[PartitionKey, int]:
    """Where each partition continues: its checkpoint, kept inside its range."""
    out: dict[PartitionKey, int] = {}
    for r in ranges:
        c = committed.get(r.key)
        out[r.key] = r.start if c is None else min(max(c, r.start), r.end)
    return out


# --- plan and state ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Everything a resume must reuse: written once, before the first record is read."""

    replay_id: str
    pipeline: str
    output_topic: str
    dead_letter_topic: str
    model_path: str
    model_name: str
    model_version: str
    model_sha256: str | None
    ranges: tuple[PartitionRange, ...]
    bounds: dict[str, Any]
    created_at: str

    @property
    def group(self) -> str:
        return replay_group(self.replay_id)

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["version"] = STATE_VERSION
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> ReplayPlan:
        doc = orjson.loads(data)
        if doc.pop("version", None) != STATE_VERSION:
            raise ConfigError(f"replay state of an unknown version (this reads {STATE_VERSION})")
        doc["ranges"] = tuple(PartitionRange(**r) for r in doc["ranges"])
        return cls(**doc)


class StateStore:
    """Replay plans as ``<dir>/<id>.json``; ``lock`` keeps one process per replay id."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, replay_id: str) -> Path:
        if not _ID.match(replay_id):
            raise ConfigError(f"replay id {replay_id!r} must be 1-64 of A-Z a-z 0-9 _ . -")
        return self.directory / f"{replay_id}.json"

    def exists(self, replay_id: str) -> bool:
        return self.path(replay_id).exists()

    def save(self, plan: ReplayPlan) -> Path:
        """Write atomically (temporary file, fsync, rename)."""
        path = self.path(plan.replay_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        with tmp.open("wb") as fh:
            fh.write(plan.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        return path

    def load(self, replay_id: str) -> ReplayPlan:
        path = self.path(replay_id)
        try:
            return ReplayPlan.from_json(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"no replay {replay_id!r}: {path} does not exist") from None
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise ConfigError(f"replay state {path} is unreadable: {exc}") from None

    @contextlib.contextmanager
    def lock(self, replay_id: str) -> Iterator[None]:
        """Hold an exclusive lock for the replay; raises ``ConfigError`` if another
        process holds it. The kernel releases it when the process dies."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock_path = self.path(replay_id).with_suffix(".lock")
        with lock_path.open("a") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"replay {replay_id!r} is running in another process") from None
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --- throttling and progress ------------------------------------------------------------


class RateLimiter:
    """A token bucket: ``rate`` records per second, bursts of at most ``burst``."""

    def __init__(self, rate: float, burst: float | None = None, clock: Clock = monotonic_clock):
        if rate <= 0:
            raise ConfigError("--max-rate must be positive")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate / 10.0)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def allowance(self, wanted: int) -> int:
        """How many of ``wanted`` records may be taken now (possibly 0)."""
        self._refill()
        return max(0, min(wanted, math.floor(self._tokens + 1e-9)))  # float dust

    def take(self, n: int) -> None:
        self._tokens -= n

    def wait_s(self) -> float:
        """Seconds until one record may be taken."""
        self._refill()
        return 0.0 if self._tokens + 1e-9 >= 1 else (1 - self._tokens) / self.rate


def format_duration(seconds: float | None) -> str:
    """``"42s"``, ``"3m05s"``, ``"2h07m"``; ``"?"`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_progress(done: int, total: int, elapsed_s: float, *, width: int = 24) -> str:
    """``[#####-----]  1,200/4,000  30.0%  812 rec/s  ETA 3s`` (rate and ETA of this run)."""
    frac = min(1.0, done / total) if total > 0 else 1.0
    filled = round(frac * width)
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else (0.0 if done >= total else None)
    return (
        f"[{'#' * filled}{'-' * (width - filled)}] {done:,}/{total:,} {frac * 100:5.1f}% "
        f"{rate:,.0f} rec/s ETA {format_duration(eta)}"
    )


class Progress(ProgressLine):
    """The replay's progress line: done/total, share, rate and ETA."""

    def __init__(
        self,
        total: int,
        *,
        label: str,
        stream: TextIO | None = None,
        every_s: float | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.total = total
        super().__init__(
            lambda done, elapsed: f"{label} {format_progress(done, self.total, elapsed)}",
            stream=stream,
            every_s=every_s,
            clock=clock,
        )


# --- the sink ---------------------------------------------------------------------------


class ReplaySink(Sink):
    """The live ``Sink`` plus a ``streamfer.replay_id`` header on every record; counts the
    results and dead letters it was handed (the loop takes the difference per batch)."""

    def __init__(self, producer: Producer, replay_id: str, dead_letter_topic: str) -> None:
        super().__init__(producer)
        self._header = (REPLAY_ID_HEADER, replay_id.encode())
        self._dead_letter_topic = dead_letter_topic
        self.results = 0
        self.dead_letters = 0

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        queued = super().send(tracker, topic, value, key, [*(headers or ()), self._header])
        if queued:
            if topic == self._dead_letter_topic:
                self.dead_letters += 1
            else:
                self.results += 1
        return queued


# --- the loop ---------------------------------------------------------------------------


class ReplayConsumer(OffsetConsumer, Protocol):
    """The part of ``confluent_kafka.Consumer`` a replay uses (a fake in unit tests)."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int, timeout: float) -> list[Message]: ...


class BatchHandler(Protocol):
    """``worker.pipeline.Pipeline``: publish a batch, return its tracker and next offsets."""

    def handle(
        self, batch: Sequence[Message], sink: Sink
    ) -> tuple[DeliveryTracker, dict[PartitionKey, int]]: ...


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
    model: dict[str, str | None]
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


@dataclass(slots=True)
class _Batch:
    tracker: DeliveryTracker
    records: int
    results: int
    dead_letters: int


class Replay:
    """Reads the plan's ranges from ``positions`` on, publishes through ``handler`` and
    checkpoints the delivered prefix. Single-threaded; ``stop`` is safe from signal
    handlers. ``run`` blocks until every partition reached its end or ``stop``; it raises
    the ``StreamferError`` that ended it (``SinkError`` for a refused delivery,
    ``FeatureStoreError`` after retries, ``CommitError``), leaving the checkpoint at the
    last delivered batch."""

    def __init__(
        self,
        *,
        plan: ReplayPlan,
        positions: dict[PartitionKey, int],
        consumer: ReplayConsumer,
        sink: ReplaySink,
        handler: BatchHandler,
        batch: BatchPolicy,
        max_in_flight_batches: int = 4,
        poll_timeout_s: float = 0.1,
        checkpoint_interval_s: float = 1.0,
        shutdown_timeout_s: float = 30.0,
        limiter: RateLimiter | None = None,
        progress: Progress | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.plan = plan
        self._positions = dict(positions)
        self._ends = {r.key: r.end for r in plan.ranges}
        self._consumer = consumer
        self._sink = sink
        self._handler = handler
        self._policy = batch
        self._bound = max_in_flight_batches
        self._poll_s = poll_timeout_s
        self._interval = checkpoint_interval_s
        self._shutdown_s = shutdown_timeout_s
        self._limiter = limiter
        self._progress = progress
        self._clock = clock
        self._committer = Committer(consumer)
        self._batches: deque[_Batch] = deque()
        self._stop = threading.Event()
        self.records = 0
        self.checkpointed = 0
        self.results = 0
        self.dead_letters = 0
        self.per_partition: dict[PartitionKey, int] = dict.fromkeys(self._ends, 0)
        self.finished: set[PartitionKey] = {k for k, e in self._ends.items() if positions[k] >= e}
        self.checkpoints: dict[PartitionKey, int] = dict(positions)

    def stop(self) -> None:
        """Finish the batches already read, checkpoint them and return from ``run``."""
        self._stop.set()

    @property
    def complete(self) -> bool:
        return len(self.finished) == len(self._ends) and not self._batches

    def run(self) -> None:
        active = sorted(set(self._ends) - self.finished)
        if active:
            self._consumer.assign(
                [TopicPartition(t, p, self._positions[(t, p)]) for t, p in active]
            )
        batcher: Batcher[Message] = Batcher(self._policy, self._clock)
        try:
            self._loop(set(active), batcher)
        except BaseException:
            self._salvage()
            raise
        self._drain(batcher)

    def _loop(self, active: set[PartitionKey], batcher: Batcher[Message]) -> None:
        consumer, sink, clock, limiter = self._consumer, self._sink, self._clock, self._limiter
        ends, counts = self._ends, self.per_partition
        max_messages = self._policy.max_batch_size
        next_checkpoint = clock() + self._interval
        while active and not self._stop.is_set():
            fetch_started = clock()
            deadline = batcher.deadline()
            timeout = self._poll_s if deadline is None else max(0.0, deadline - fetch_started)
            timeout = min(timeout, self._poll_s)
            wanted = max_messages
            if limiter is not None:
                wanted = limiter.allowance(max_messages)
            if wanted > 0:
                messages = consumer.consume(wanted, timeout)
            else:
                messages = []
                assert limiter is not None
                sink.poll(min(timeout, limiter.wait_s()))
            keep: list[Message] = []
            for msg in messages:
                err = msg.error()
                key = (cast(str, msg.topic()), cast(int, msg.partition()))
                offset = cast(int, msg.offset())
                if err is not None:
                    if end_of_partition(err, log) and key in active and offset >= ends[key]:
                        self._finish(key, active)
                    continue
                if key not in active or offset >= ends[key]:
                    if key in active:
                        self._finish(key, active)
                    continue
                keep.append(msg)
                counts[key] += 1
                if offset + 1 >= ends[key]:
                    self._finish(key, active)
            if limiter is not None:
                limiter.take(len(keep))
            self.records += len(keep)
            for batch in batcher.add(keep, fetch_started):
                self._process(batch)
            expired = batcher.expired()
            if expired is not None:
                self._process(expired)
            sink.poll(0)
            while self._in_flight() >= self._bound and not self._stop.is_set():
                sink.poll(0.005)
            if clock() >= next_checkpoint:
                self._checkpoint()
                next_checkpoint = clock() + self._interval
            if self._progress is not None:
                self._progress.update(self.records)

    def _finish(self, key: PartitionKey, active: set[PartitionKey]) -> None:
        active.discard(key)
        self.finished.add(key)
        self._consumer.pause([TopicPartition(key[0], key[1])])

    def _process(self, batch: list[Message]) -> None:
        sink = self._sink
        results, dead = sink.results, sink.dead_letters
        tracker, offsets = self._handler.handle(batch, sink)
        self._committer.track(Job(self.plan.pipeline, list(batch), tracker, offsets))
        self._batches.append(
            _Batch(tracker, len(batch), sink.results - results, sink.dead_letters - dead)
        )

    def _in_flight(self) -> int:
        """Batches whose deliveries are not all reported yet."""
        return sum(1 for b in self._batches if not b.tracker.done)

    def _checkpoint(self) -> None:
        """Commit every leading batch whose deliveries all succeeded (synchronously)."""
        self._committer.commit_ready(asynchronous=False)
        batches = self._batches
        while batches and batches[0].tracker.done and not batches[0].tracker.errors:
            done = batches.popleft()
            self.checkpointed += done.records
            self.results += done.results
            self.dead_letters += done.dead_letters
        self.checkpoints.update(self._committer.committed())

    def _drain(self, batcher: Batcher[Message]) -> None:
        rest = batcher.flush()
        if rest:
            self._process(rest)
        left = self._sink.flush(self._shutdown_s)
        self._checkpoint()
        if left:
            raise SinkError(f"{left} deliveries unconfirmed after {self._shutdown_s:.0f}s")
        if self._progress is not None:
            self._progress.finish(self.records)
        # Partitions whose range is done are checkpointed at their end, past any
        # transaction markers after their last record, so a resume knows they are done.
        final = {
            k: self._ends[k]
            for k in self.finished
            if not self._batches and self.checkpoints.get(k, -1) < self._ends[k]
        }
        if final:
            parts = [TopicPartition(t, p, o) for (t, p), o in sorted(final.items())]
            self._consumer.commit(offsets=parts, asynchronous=False)
            self.checkpoints.update(final)

    def _salvage(self) -> None:
        """After a failure: checkpoint what was delivered, so a resume repeats less."""
        with contextlib.suppress(StreamferError, KafkaException):
            self._sink.flush(min(5.0, self._shutdown_s))
            self._checkpoint()


# --- composition ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    """The command line of ``streamfer replay``."""

    pipeline: str | None = None
    bounds: Bounds = field(default_factory=Bounds)
    output_topic: str | None = None
    dead_letter_topic: str | None = None
    model_path: Path | None = None
    model_version: str | None = None
    max_rate: float | None = None
    nice: int = 10
    state_dir: Path = Path(".streamfer/replays")
    replay_id: str | None = None
    resume: str | None = None
    dry_run: bool = False
    progress: bool = True
    checkpoint_interval_s: float = 1.0


def _pick_pipeline(config: WorkerConfig, name: str | None) -> PipelineConfig:
    if name is None:
        if len(config.pipelines) == 1:
            return config.pipelines[0]
        raise ConfigError(
            f"--pipeline is required; the config has {[p.name for p in config.pipelines]}"
        )
    return config.pipeline(name)


def _new_plan(
    config: WorkerConfig, opts: ReplayOptions, lookup: OffsetLookup, replay_id: str
) -> ReplayPlan:
    p = _pick_pipeline(config, opts.pipeline)
    if opts.model_path is not None and opts.model_version is None:
        raise ConfigError("--model needs --model-version, so its results can be told apart")
    version = opts.model_version or p.model.version
    model_path = (
        opts.model_path.expanduser().resolve() if opts.model_path is not None else p.model.path
    )
    if not model_path.is_file():
        raise ConfigError(f"model file not found: {model_path}")
    output = opts.output_topic or default_output_topic(p.result_topic, version)
    dead = opts.dead_letter_topic or default_output_topic(p.dead_letter_topic, version)
    if output == dead:
        raise ConfigError(f"results and dead letters need two topics, both are {output!r}")
    requests = {t for q in config.pipelines for t in q.request_topics}
    for name in (output, dead):
        if not _TOPIC.match(name):
            raise ConfigError(f"{name!r} is not a legal topic name")
        if name in requests:
            raise ConfigError(f"output topic {name!r} is a request topic: a replay would feed it")
    ranges = resolve_ranges(lookup, p.request_topics, opts.bounds)
    return ReplayPlan(
        replay_id=replay_id,
        pipeline=p.name,
        output_topic=output,
        dead_letter_topic=dead,
        model_path=str(model_path),
        model_name=p.model.name,
        model_version=version,
        model_sha256=None,
        ranges=tuple(ranges),
        bounds=opts.bounds.describe(),
        created_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


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
        "model": {"path": plan.model_path, "name": plan.model_name, "version": plan.model_version},
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
    consumer = Consumer(
        {
            **lookup_consumer_config(config.kafka, replay_group(replay_id)),
            "enable.partition.eof": True,
        }
    )
    offsets = KafkaOffsets(consumer)
    try:
        plan = store.load(replay_id) if resuming else _new_plan(config, opts, offsets, replay_id)
        pipeline_cfg = _pick_pipeline(config, plan.pipeline)
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
    from worker.metrics import Metrics
    from worker.parts import open_parts
    from worker.pipeline import Pipeline

    if opts.nice:
        os.nice(opts.nice)
    model_path = Path(plan.model_path)
    pinned = plan.model_sha256
    if pinned is None and model_path == pipeline_cfg.model.path:
        pinned = pipeline_cfg.model.sha256
    model = pipeline_cfg.model.model_copy(
        update={"path": model_path, "version": plan.model_version, "sha256": pinned}
    )
    # the engine refuses a file whose hash differs from the pinned one
    engine, features = open_parts(pipeline_cfg, config.redis, model=model)
    try:
        if not resuming:
            plan = replace(plan, model_sha256=engine.model_hash)
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
    handler = Pipeline(
        pipeline_cfg.model_copy(
            update={
                "result_topic": plan.output_topic,
                "dead_letter_topic": plan.dead_letter_topic,
                "model": model,
            }
        ),
        store=features,
        engine=engine,
        metrics=Metrics().for_pipeline(plan.pipeline),
        retry_feature_store_s=30.0,
    )
    sink = ReplaySink(
        Producer(producer_config(config.kafka)), plan.replay_id, plan.dead_letter_topic
    )
    total = sum(max(0, r.end - positions[r.key]) for r in plan.ranges)
    replay = Replay(
        plan=plan,
        positions=positions,
        consumer=cast(ReplayConsumer, consumer),
        sink=sink,
        handler=handler,
        batch=pipeline_cfg.batch,
        max_in_flight_batches=config.max_in_flight_batches,
        poll_timeout_s=config.poll_timeout_ms / 1000.0,
        checkpoint_interval_s=opts.checkpoint_interval_s,
        shutdown_timeout_s=config.shutdown_timeout_s,
        limiter=RateLimiter(opts.max_rate) if opts.max_rate else None,
        progress=Progress(total, label=f"replay {plan.replay_id}") if opts.progress else None,
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
    return ReplaySummary(
        replay_id=plan.replay_id,
        pipeline=plan.pipeline,
        output_topic=plan.output_topic,
        dead_letter_topic=plan.dead_letter_topic,
        model={
            "name": plan.model_name,
            "version": plan.model_version,
            "sha256": engine.model_hash,
            "path": plan.model_path,
        },
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
