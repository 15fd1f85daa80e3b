"""``streamfer check``: prove a pipeline can serve before it joins a group.

Loading the model and pinging Redis passed for models whose outputs could not be
published, so the first live batch was the first failure. ``check_pipeline`` instead runs
one batch through every stage a worker runs (decode, enrich with a real Redis round
trip, infer, encode the results and dead letters) into a sink that keeps what it is
handed instead of producing it. A request carrying every feature inline must come out as
a result; one naming a probe entity exercises the lookup (its result or dead letter
is fine, a Redis refusal is not).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from worker.config import PipelineConfig, RedisSettings
from worker.errors import EngineError
from worker.features import PROBE_ENTITY
from worker.limits import RecordLimits
from worker.metrics import Metrics
from worker.parts import open_parts
from worker.pipeline import Pipeline
from worker.sink import DeliveryTracker, Headers

__all__ = ["CheckedPipeline", "check_pipeline"]

INLINE_ID = "streamfer-check-inline"
LOOKUP_ID = "streamfer-check-lookup"


@dataclass(slots=True)
class KeepingSink:
    """Takes records as ``Sink.send`` would and keeps them; nothing reaches Kafka."""

    limit: RecordLimits = field(default_factory=RecordLimits.unread)
    records: list[tuple[str, bytes, bytes | None]] = field(default_factory=list)

    def send(
        self,
        tracker: DeliveryTracker,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> bool:
        tracker.sent += 1
        tracker.acked += 1
        self.records.append((topic, value, key))
        return True


@dataclass(frozen=True, slots=True)
class CheckedPipeline:
    """What one batch through the pipeline gave."""

    model_hash: str
    result_bytes: int
    lookup_outcome: str
    """``result``, or the dead-letter code of the request that named the probe entity."""


def check_pipeline(cfg: PipelineConfig, redis: RedisSettings) -> CheckedPipeline:
    """Run one batch through ``cfg``'s stages. Raises the ``StreamferError`` that would
    stop a worker: ConfigError (FeatureStoreConfigError among them), FeatureStoreError,
    or EngineError when the model loads but its outputs cannot be published."""
    engine, store = open_parts(cfg, redis, warm_up=[1])  # proves the outputs are publishable
    try:
        abort = threading.Event()
        abort.set()  # no waiting: the first refusal is the answer
        pipeline = Pipeline(
            cfg,
            store=store,
            engine=engine,
            metrics=Metrics(CollectorRegistry()).for_pipeline(cfg.name),
            retry_feature_store_s=None,
            abort=abort,
        )
        topic = cfg.request_topics[0]
        spec = cfg.features
        inline = {"id": INLINE_ID, "features": dict.fromkeys(spec.fields, spec.default_value)}
        lookup = {"id": LOOKUP_ID, "entity": PROBE_ENTITY}
        batch = [
            Message(topic=topic, partition=0, offset=i, key=b"check", value=orjson.dumps(doc))
            for i, doc in enumerate((inline, lookup))
        ]
        sink = KeepingSink()
        pipeline.handle(batch, sink)  # type: ignore[arg-type]
    finally:
        store.close()
    outcomes = {}
    for out_topic, value, _ in sink.records:
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
    return CheckedPipeline(engine.model_hash, result_bytes, outcomes[LOOKUP_ID][0])
