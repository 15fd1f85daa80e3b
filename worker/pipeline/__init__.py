"""One batch's steps: decode (codec, request shape), enrich and assemble feeds, hooks,
model calls, the canary and shadow, results and dead letters, and the metrics they
update. ``Pipeline`` (steps) runs them as three steps, one module each: prepare, infer
and publish."""

from __future__ import annotations

from worker.pipeline.canary import Canary
from worker.pipeline.feeds import FeedPlan, InputFeed
from worker.pipeline.hooks import BatchHooks, load_hooks
from worker.pipeline.metrics import PipelineFamilies, PipelineMetrics, ShadowMetrics
from worker.pipeline.publish import Unserved
from worker.pipeline.result_format import result_encoder
from worker.pipeline.shadow import ShadowRunner
from worker.pipeline.steps import Pipeline

__all__ = [
    "BatchHooks",
    "Canary",
    "FeedPlan",
    "InputFeed",
    "Pipeline",
    "PipelineFamilies",
    "PipelineMetrics",
    "ShadowMetrics",
    "ShadowRunner",
    "Unserved",
    "load_hooks",
    "result_encoder",
]
