"""Replay and backfill: run a bounded slice of history through a pipeline, resumably.

``plan``: the ranges, output topics and model a replay keeps across resumes, and the
state directory that holds them. ``model``: the model it runs (a file, or a version on a
Triton server), checked again on resume; ``steps``: every step's model, for a model
graph. ``run``: a replay on the live worker's engine, with its bounded source and
checkpoints. ``pace``: its rate limit and progress line.
``command``: ``streamfer replay`` itself.
"""

from worker.replay.command import PartitionReport, ReplaySummary, run_replay
from worker.replay.pace import Progress, RateLimiter, format_duration, format_progress
from worker.replay.plan import (
    ReplayOptions,
    ReplayPlan,
    StateStore,
    default_output_topic,
    replay_group,
    resume_positions,
)
from worker.replay.run import REPLAY_ID_HEADER, Replay, ReplayConsumer, ReplaySink

__all__ = [
    "REPLAY_ID_HEADER",
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
