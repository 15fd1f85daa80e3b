"""One batch's steps: decode (codec, request shape), enrich and assemble feeds, hooks,
model calls, the canary and shadow, results and dead letters. ``Pipeline`` (steps) runs
them as three steps, one module each: prepare, infer and publish."""

from __future__ import annotations

from worker.pipeline.canary import Canary
from worker.pipeline.codec import decode_requests
from worker.pipeline.feeds import FeedPlan, InputFeed, assemble
from worker.pipeline.hooks import BatchHooks, load_hooks
from worker.pipeline.publish import Unserved
from worker.pipeline.request_shape import RequestShape
from worker.pipeline.result_format import result_encoder
from worker.pipeline.shadow import ShadowRunner
from worker.pipeline.steps import Pipeline

__all__ = [
    "BatchHooks",
    "Canary",
    "FeedPlan",
    "InputFeed",
    "Pipeline",
    "RequestShape",
    "ShadowRunner",
    "Unserved",
    "assemble",
    "decode_requests",
    "load_hooks",
    "result_encoder",
]
