"""The encoder of a pipeline's Avro results, from one row of its model's outputs (a
module of its own: it runs the model once at start-up, where the registry package, a
layer below, cannot)."""

from __future__ import annotations

from typing import Any

from worker.config import PipelineConfig
from worker.inference import ServingEngine, row_outputs
from worker.pipeline.feeds import FeedPlan
from worker.registry import AvroResults

__all__ = ["result_encoder"]


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
