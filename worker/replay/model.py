"""The model a replay runs, and the check that a resume runs the same one.

A file is pinned by its SHA-256: the engine refuses another. A model on a Triton server
is pinned by its server, name and version, and by its signature (``TritonEngine.signature``:
platform, inputs and outputs as the server's metadata lists them; not the whole config,
which a server may rewrite on every start or with its instance count). A resume that
finds the server serving another version, or that version with another signature, is
refused with what the server serves now, unless ``--current-model`` asks for the model
as it is now: the plan then records it, and its results name it. A model graph pins
every step so (``worker.replay.steps``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from worker.config import ModelSpec, PipelineConfig, RedisSettings
from worker.errors import ConfigError, InferenceServerError
from worker.inference import ModelGraph, ServingEngine, TritonEngine
from worker.models import Parts, open_parts
from worker.replay.plan import ReplayPlan
from worker.replay.steps import moved_step, opened_steps, pinned_config

__all__ = ["open_model", "replay_spec", "served_version"]

log = logging.getLogger(__name__)


def served_version(spec: ModelSpec) -> str:
    """The version of ``spec``'s model its server serves now: the pinned one, or the
    highest ready. Raises ``InferenceServerError`` when the server cannot answer or
    serves no ready version."""
    return TritonEngine(spec).served_version


def replay_spec(pipeline_cfg: PipelineConfig, plan: ReplayPlan, current: bool) -> ModelSpec:
    """The pipeline's model as ``plan`` pinned it (``current``: as it is now), never
    watched for new versions. Raises ``ConfigError`` for a plan on a Triton server whose
    pipeline names none now."""
    live = pipeline_cfg.model
    if plan.server is not None:
        if live.triton is None:
            raise ConfigError(
                f"replay {plan.replay_id} runs model {plan.server_model} on the Triton server "
                f"at {plan.server}; pipeline {plan.pipeline} names no Triton server now"
            )
        triton = live.triton.model_copy(
            update={
                "url": plan.server,
                "model": plan.server_model,
                "version": None if current else plan.model_version,
            }
        )
        return live.model_copy(update={"triton": triton, "watch": False})
    path = Path(plan.model_path or "")
    pinned = plan.model_sha256
    if pinned is None and path == live.path:
        pinned = live.sha256
    return live.model_copy(
        update={
            "path": path,
            "version": plan.model_version,
            "sha256": None if current else pinned,
            "watch": False,
            "engine": "onnxruntime",  # a file given for a model a server runs live
            "triton": None,
        }
    )


def open_model(
    pipeline_cfg: PipelineConfig,
    redis: RedisSettings,
    plan: ReplayPlan,
    *,
    resuming: bool,
    current: bool,
) -> tuple[Parts, PipelineConfig, ReplayPlan]:
    """The replay's parts (``open_parts``), the pipeline's config on the model it serves,
    and the plan with the model as opened (version, hash, signature) recorded. Raises
    ``ConfigError`` when a resume finds another model than the plan's (and not
    ``current``), and what ``open_parts`` raises."""
    if plan.steps:
        return _open_graph(pipeline_cfg, redis, plan, resuming=resuming, current=current)
    spec = replay_spec(pipeline_cfg, plan, current)
    try:
        parts = open_parts(pipeline_cfg, redis, model=spec)
    except InferenceServerError as exc:
        moved = _moved_on(spec, plan, resuming) if plan.server is not None and not current else None
        if moved is None:
            raise
        raise moved from exc
    try:
        plan = _opened(plan, parts.engine, resuming=resuming, current=current)
    except BaseException:
        parts.store.close()
        raise
    if plan.server is not None:  # the version opened, so the pipeline names it
        assert spec.triton is not None
        pinned = spec.triton.model_copy(update={"version": plan.model_version})
        spec = spec.model_copy(update={"triton": pinned})
    return parts, pipeline_cfg.model_copy(update={"model": spec}), plan


def _open_graph(
    pipeline_cfg: PipelineConfig,
    redis: RedisSettings,
    plan: ReplayPlan,
    *,
    resuming: bool,
    current: bool,
) -> tuple[Parts, PipelineConfig, ReplayPlan]:
    """``open_model`` of a graph: every step as the plan pinned it, recorded as opened."""
    served = pinned_config(pipeline_cfg, plan.steps, current)
    try:
        parts = open_parts(served, redis)
    except InferenceServerError as exc:
        moved = None if current else moved_step(pipeline_cfg, plan.steps, served_version)
        if moved is None:
            raise
        raise moved from exc
    try:
        assert isinstance(parts.engine, ModelGraph)
        steps = opened_steps(plan.steps, served, parts.engine, check=resuming and not current)
    except BaseException:
        parts.store.close()
        raise
    version = "+".join(step.version for step in steps)
    if resuming and version != plan.model_version:
        log.warning(
            "replay %s goes on with the graph's versions %s (planned on %s): --current-model",
            plan.replay_id,
            version,
            plan.model_version,
        )
    served = served.model_copy(
        update={"model": served.model.model_copy(update={"version": version})}
    )
    return parts, served, replace(plan, model_version=version, steps=steps)


def _opened(
    plan: ReplayPlan, engine: ServingEngine, *, resuming: bool, current: bool
) -> ReplayPlan:
    """``plan`` with the model ``engine`` serves; refuses another signature on resume."""
    if plan.server is None:
        return replace(plan, model_sha256=engine.model_hash)
    version = str(getattr(engine, "served_version", plan.model_version))
    signature = getattr(engine, "signature", None)
    if resuming and not current and plan.model_signature not in (None, signature):
        raise ConfigError(
            f"replay {plan.replay_id}: model {plan.server_model} version {version} on "
            f"{plan.server} takes or gives other tensors than when the replay was planned "
            "(its metadata changed); resume with --current-model to go on with it as it is"
        )
    if resuming and version != plan.model_version:
        log.warning(
            "replay %s goes on with %s version %s (planned on version %s): --current-model",
            plan.replay_id,
            plan.server_model,
            version,
            plan.model_version,
        )
    return replace(
        plan, model_version=version, model_sha256=engine.model_hash, model_signature=signature
    )


def _moved_on(spec: ModelSpec, plan: ReplayPlan, resuming: bool) -> ConfigError | None:
    """Why the planned version did not open, when the server answers with another one;
    None when the server cannot answer at all (an outage, said as such)."""
    assert spec.triton is not None
    latest = spec.model_copy(update={"triton": spec.triton.model_copy(update={"version": None})})
    try:
        now = served_version(latest)
    except InferenceServerError:
        return None
    if not resuming:
        return ConfigError(
            f"the Triton server at {plan.server} has no version {plan.model_version} of model "
            f"{plan.server_model} ready; it serves version {now}"
        )
    return ConfigError(
        f"replay {plan.replay_id} runs model {plan.server_model} version {plan.model_version} "
        f"on the Triton server at {plan.server}, which serves version {now} now: resume with "
        f"--current-model to go on with version {now} (its results name it), or serve "
        f"version {plan.model_version} there again"
    )
