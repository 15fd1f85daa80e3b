"""A replay's plan and its saved state: what a resume must reuse unchanged.

Bounds (times through ``offsets_for_times``, offsets, partitions, or the whole topic)
resolve into one offset range per partition (``worker.tools.ranges``), every end fixed when
the replay is planned, so live traffic arriving meanwhile does not extend it. The plan
(ranges, output topics, and the model: its file and hash, or its Triton server, name,
version and signature; for a model graph each step's, ``worker.replay.steps``) is a
small JSON file in the state directory, written before the first record is read: the
ranges must not change on resume, and a file is readable by an operator, whereas commit
metadata would scatter it over partitions and cap it at the broker's metadata limit.
Progress itself is the committed offsets of the replay's own group (``replay_group``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from worker.config import ModelSpec, PipelineConfig, WorkerConfig
from worker.core import PartitionKey
from worker.errors import ConfigError
from worker.replay.steps import StepModel, plan_steps
from worker.tools import Bounds, OffsetLookup, PartitionRange, resolve_ranges

__all__ = [
    "ReplayOptions",
    "ReplayPlan",
    "StateStore",
    "default_output_topic",
    "new_plan",
    "pick_pipeline",
    "replay_group",
    "resume_positions",
]

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
STATE_VERSION = 1


def replay_group(replay_id: str) -> str:
    """The consumer group whose committed offsets are a replay's checkpoint."""
    return f"streamfer-replay-{replay_id}"


def default_output_topic(topic: str, model_version: str) -> str:
    """``<topic>.replay.<model_version>`` (a graph's ``1+2`` as ``1_2``); raises
    ``ConfigError`` if not a legal name."""
    name = f"{topic}.replay.{model_version.replace('+', '_')}"
    if not _TOPIC.match(name):
        raise ConfigError(
            f"{name!r} is not a legal topic name (model version {model_version!r}); "
            "pass --output-topic"
        )
    return name


def resume_positions(
    ranges: Sequence[PartitionRange], committed: dict[PartitionKey, int | None]
) -> dict[PartitionKey, int]:
    """Where each partition continues: its checkpoint, kept inside its range."""
    out: dict[PartitionKey, int] = {}
    for r in ranges:
        c = committed.get(r.key)
        out[r.key] = r.start if c is None else min(max(c, r.start), r.end)
    return out


@dataclass(frozen=True)
class ReplayOptions:
    """The command line of ``streamfer replay``."""

    pipeline: str | None = None
    bounds: Bounds = field(default_factory=Bounds)
    output_topic: str | None = None
    dead_letter_topic: str | None = None
    model_path: Path | None = None
    model_version: str | None = None
    current_model: bool = False
    max_rate: float | None = None
    nice: int = 10
    state_dir: Path = Path(".streamfer/replays")
    replay_id: str | None = None
    resume: str | None = None
    dry_run: bool = False
    progress: bool = True
    checkpoint_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Everything a resume must reuse: written once, before the first record is read."""

    replay_id: str
    pipeline: str
    output_topic: str
    dead_letter_topic: str
    model_path: str | None
    """The ONNX file it runs; None for a model on a Triton server."""
    model_name: str
    model_version: str
    model_sha256: str | None
    ranges: tuple[PartitionRange, ...]
    bounds: dict[str, Any]
    created_at: str
    server: str | None = None
    """The Triton server that runs its model (host:port), or None for a file."""
    server_model: str | None = None
    """The model's name on that server."""
    model_signature: str | None = None
    """``TritonEngine.signature`` of the version it runs, checked on resume."""
    steps: tuple[StepModel, ...] = ()
    """A model graph's steps, each one's model; empty for a single model."""

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
        doc["steps"] = tuple(StepModel(**s) for s in doc.get("steps", ()))
        return cls(**doc)


def pick_pipeline(config: WorkerConfig, name: str | None) -> PipelineConfig:
    if name is None:
        if len(config.pipelines) == 1:
            return config.pipelines[0]
        raise ConfigError(
            f"--pipeline is required; the config has {[p.name for p in config.pipelines]}"
        )
    return config.pipeline(name)


def new_plan(
    config: WorkerConfig,
    opts: ReplayOptions,
    lookup: OffsetLookup,
    replay_id: str,
    served: Callable[[ModelSpec], str] | None = None,
) -> ReplayPlan:
    """Check the options and resolve the bounds into fixed ranges; raises ``ConfigError``.

    A pipeline on a Triton server replays on it (unless ``--model`` gives a file): the
    version ``--model-version`` pins, the config's, or else the one ``served`` says the
    server serves now. A model graph records every step's model (``plan_steps``)."""
    p = pick_pipeline(config, opts.pipeline)
    if opts.model_path is not None and opts.model_version is None:
        raise ConfigError("--model needs --model-version, so its results can be told apart")
    if p.steps and (opts.model_path is not None or opts.model_version is not None):
        raise ConfigError(
            f"pipeline {p.name!r} runs a model graph, whose plan pins every step's model: "
            "--model and --model-version name one model"
        )
    triton = p.model.triton if opts.model_path is None and not p.steps else None
    server_model, model_path = None, None
    steps: tuple[StepModel, ...] = ()
    version: str | None
    if p.steps:
        steps = plan_steps(p, served)
        version = "+".join(s.version for s in steps)
    elif triton is not None:
        server_model = triton.model or p.model.name
        version = opts.model_version or triton.version
        if version is None:
            if served is None:
                raise ConfigError(f"pipeline {p.name!r}: which version of {server_model}?")
            version = served(p.model)
    else:
        version = opts.model_version or p.model.version
        model_path = (
            opts.model_path.expanduser().resolve() if opts.model_path is not None else p.model.file
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
        model_path=None if model_path is None else str(model_path),
        model_name=p.model.name,
        model_version=version,
        model_sha256=None,
        ranges=tuple(ranges),
        bounds=opts.bounds.describe(),
        created_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        server=None if triton is None else triton.url,
        server_model=server_model,
        steps=steps,
    )


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
