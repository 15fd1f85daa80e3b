"""What a pipeline's results say besides each request's own fields, and the encoder of
its Avro results (a module of its own: the encoder runs the model once at start-up,
where the registry package, a layer below, cannot).

A result names its pipeline and its model's name and version; the batch's per-stage
timings and the model's digest come only with ``result_details`` (or Avro, whose schema
requires them): they are the same for every result of a batch, cost bytes on every
record, and the stage histograms hold the timings anyway.
"""

from __future__ import annotations

from typing import Any

from worker.config import PipelineConfig
from worker.core import StageTimings
from worker.inference import ModelIdentity, ServingEngine, row_outputs
from worker.pipeline.feeds import FeedPlan
from worker.registry import AvroResults

__all__ = ["ResultFields", "result_encoder"]


class ResultFields:
    """The fields every result of one pipeline's batch shares, as the config asks."""

    __slots__ = ("_details", "_pipeline")

    def __init__(self, p: PipelineConfig) -> None:
        self._pipeline = p.name
        self._details = p.result_details or p.result_format == "avro"

    def shared(self, timings: StageTimings) -> dict[str, Any]:
        """The batch's part: the pipeline, and its stage timings with details."""
        if self._details:
            return {"pipeline": self._pipeline, "timings_ms": timings.as_dict()}
        return {"pipeline": self._pipeline}

    def model(self, identity: ModelIdentity) -> dict[str, str]:
        """The result's ``model`` object: name and version, and the digest with details."""
        if self._details:
            return identity.meta
        return {"name": identity.name, "version": identity.version}


def result_encoder(
    p: PipelineConfig, client: Any | None, engine: ServingEngine, plan: FeedPlan
) -> AvroResults | None:
    """None for JSON results; else the encoder, its schema registered or found (raises
    ConfigError naming what is missing, SchemaRegistryError while the registry is down)."""
    if p.result_format != "avro":
        return None
    outputs = engine.infer(engine.example(plan.widths())(1))
    sample = next(iter(row_outputs(outputs, 1)))
    return AvroResults(p, client, sample)
