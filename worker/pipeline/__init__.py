"""One batch's steps: decode (codec, request shape), enrich and assemble feeds, hooks,
model calls, the canary and shadow, results and dead letters, and the metrics they
update. ``Pipeline`` (steps) runs them as three steps, one module each: prepare, infer
and publish; the composition root builds those steps and what they wait with from a
pipeline's parts."""

from __future__ import annotations

from worker.pipeline.canary import Canary
from worker.pipeline.codec import decode_requests
from worker.pipeline.dead_letters import DeadLetters
from worker.pipeline.feeds import BatchFetcher, FeedPlan, InputFeed, assemble
from worker.pipeline.hooks import BatchHooks, load_hooks
from worker.pipeline.infer import InferStep
from worker.pipeline.metrics import PipelineFamilies, PipelineMetrics, ShadowMetrics
from worker.pipeline.model_faults import ModelFaults, ModelFaultWait
from worker.pipeline.prepare import PrepareStep
from worker.pipeline.publish import PublishStep
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.result_format import result_encoder
from worker.pipeline.server_outage import ServerOutage
from worker.pipeline.shadow import ShadowRunner
from worker.pipeline.steps import Pipeline, Steps

__all__ = [
    "BatchFetcher",
    "BatchHooks",
    "Canary",
    "DeadLetters",
    "FeedPlan",
    "InferStep",
    "InputFeed",
    "ModelFaultWait",
    "ModelFaults",
    "Pipeline",
    "PipelineFamilies",
    "PipelineMetrics",
    "PrepareStep",
    "PublishStep",
    "RequestShape",
    "ServerOutage",
    "ShadowMetrics",
    "ShadowRunner",
    "Steps",
    "assemble",
    "decode_requests",
    "load_hooks",
    "result_encoder",
]
