"""``streamfer check``: prove a pipeline can serve before it joins a group.

Loading the model and pinging Redis passed for models whose outputs could not be
published, so the first live batch was the first failure. ``check_pipeline`` instead runs
one batch through every stage a worker runs (decode, enrich with a real Redis round
trip, infer, encode the results and dead letters) into a sink that keeps what it is
handed instead of producing it. A request carrying every feature inline (strings a
model's encoders accept, see ``OnnxEngine.example``) must come out as a result; one
naming a probe entity in every lookup exercises the lookups (its result or dead letter
is fine, a Redis refusal is not). Requests are written in the pipeline's own request
shape. ``CheckedPipeline.signature`` says how each model input is fed, and that the
canary and shadow models load and fit (``worker.models.candidates``); for a model on a
Triton server, that the server is live and the model ready, and its ``max_batch_size``
(its metadata was read and checked against the feeds by ``open_parts``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from confluent_kafka import Message, Producer
from prometheus_client import CollectorRegistry

from worker.config import PipelineConfig, RedisSettings
from worker.errors import EngineError
from worker.features import PROBE_ENTITY
from worker.inference import ModelGraph, ServingEngine, TritonEngine
from worker.kafka import Headers, Sink
from worker.models import LoadedModel, build_pipeline, load_candidates, open_parts
from worker.pipeline import PipelineFamilies

__all__ = ["CheckedPipeline", "check_pipeline"]

INLINE_ID = "streamfer-check-inline"
LOOKUP_ID = "streamfer-check-lookup"


@dataclass(slots=True)
class KeepingProducer:
    """Takes records as the producer would, keeps them and reports each delivered at
    once: what ``Sink`` sends through for ``check``, so nothing reaches Kafka."""

    records: list[tuple[str, bytes, bytes | None]] = field(default_factory=list)

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        *,
        headers: Headers | None,
        on_delivery: Callable[[None, Message], None],
    ) -> None:
        self.records.append((topic, value, key))
        on_delivery(None, Message(topic=topic, value=value, key=key))

    def poll(self, timeout: float = 0.0) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class CheckedPipeline:
    """What one batch through the pipeline gave."""

    model_hash: str
    result_bytes: int
    lookup_outcome: str
    """``result``, or the dead-letter code of the request that named the probe entity."""
    signature: list[str] = field(default_factory=list)
    """The model's inputs, how each is fed, and its outputs: a line each."""


def check_pipeline(cfg: PipelineConfig, redis: RedisSettings) -> CheckedPipeline:
    """Run one batch through ``cfg``'s stages. Raises the ``StreamferError`` that would
    stop a worker: ConfigError (FeatureStoreConfigError among them), FeatureStoreError,
    or EngineError when the model loads but its outputs cannot be published."""
    engine, plan, store, hooks = open_parts(cfg, redis, warm_up=[1])  # outputs are publishable
    try:
        abort = threading.Event()
        abort.set()  # no waiting: the first refusal is the answer
        pipeline = build_pipeline(
            cfg,
            store=store,
            engine=engine,
            plan=plan,
            metrics=PipelineFamilies(CollectorRegistry()).for_pipeline(cfg.name),
            retry_feature_store_s=None,
            abort=abort,
            hooks=hooks,
        )
        candidates = load_candidates(cfg, LoadedModel(engine, plan), warm_up=[1])
        example = engine.example(plan.widths())(1)
        values: dict[str, Any] = {}
        for feed in plan.inputs:
            row = example[feed.name][0]
            cells = [row] if feed.rank == 1 else list(row)
            for name, cell in zip(feed.columns, cells, strict=True):
                values[name] = cell if isinstance(cell, str) else float(cell)
        request = cfg.request
        if request.features_array is not None:
            inline_features: Any = [
                values.get(n, request.default_value) for n in request.features_array
            ]
        else:
            inline_features = values
        inline: dict[str, Any] = {}
        _put(inline, request.id, INLINE_ID)
        _put(inline, request.features, inline_features)
        lookup: dict[str, Any] = {}
        _put(lookup, request.id, LOOKUP_ID)
        for lk in cfg.lookups:
            _put(lookup, cfg.entity_path(lk.name), PROBE_ENTITY)
        if plan.request_only:
            only = {n: values[n] for n in plan.request_only}
            carried: Any = (
                [only.get(n, values.get(n, 0.0)) for n in request.features_array]
                if request.features_array is not None
                else only
            )
            _put(lookup, request.features, carried)
        topic = cfg.request_topics[0]
        batch = [
            Message(topic=topic, partition=0, offset=i, key=b"check", value=orjson.dumps(doc))
            for i, doc in enumerate((inline, lookup))
        ]
        kept = KeepingProducer()
        pipeline.handle(batch, Sink(cast(Producer, kept)))  # produce and poll are all it calls
    finally:
        store.close()
    signature = [f"input {line}" for line in plan.describe()]
    signature += [
        f"output {name} <- {out} {engine.output_types[out]}" for name, out in engine.outputs.items()
    ]
    signature.append(f"provider {engine.provider} (requested {', '.join(engine.requested)})")
    for step, server in _servers(engine):
        signature += [f"{step}{what}: {detail}" for what, _ok, detail in server.health()]
        signature.append(
            f"{step}triton max_batch_size {server.max_batch_size} (batches split at it)"
        )
    if candidates.canary is not None and cfg.canary is not None:
        model = candidates.canary.identity
        signature.append(
            f"canary {model.tag} ({model.sha256[:12]}) fits; scores {cfg.canary.percent:g}% of keys"
        )
    if candidates.shadow is not None and cfg.shadow is not None:
        model = candidates.shadow.identity
        signature.append(
            f"shadow {model.tag} ({model.sha256[:12]}) fits; results to {cfg.shadow.topic}"
        )
    outcomes = {}
    for out_topic, value, _ in kept.records:
        doc = orjson.loads(value)
        if out_topic == cfg.result_topic:
            outcomes[doc["id"]] = ("result", len(value))
        else:
            outcomes[doc["request_id"]] = (f"dead letter {doc['code']}: {doc['reason']}", 0)
    inline_outcome, result_bytes = outcomes.get(INLINE_ID, ("nothing", 0))
    if inline_outcome != "result":
        raise EngineError(
            f"pipeline {cfg.name}: a request with every feature inline gave {inline_outcome}"
        )
    return CheckedPipeline(engine.model_hash, result_bytes, outcomes[LOOKUP_ID][0], signature)


def _put(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``value`` at a dotted path, making the objects on the way."""
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def _servers(engine: ServingEngine) -> list[tuple[str, TritonEngine]]:
    """The Triton models ``engine`` calls, each with the prefix of its lines: the model
    itself, or each step of a graph that runs on a server (``step NAME ``)."""
    if isinstance(engine, TritonEngine):
        return [("", engine)]
    if isinstance(engine, ModelGraph):
        return [
            (f"step {step.name} ", step.engine)
            for step in engine.steps
            if isinstance(step.engine, TritonEngine)
        ]
    return []
