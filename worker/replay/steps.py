"""The models of a graph a replay runs: every step's, pinned in its plan.

A graph's result depends on every step, so the plan records each one (``StepModel``):
a file by its path, version and SHA-256, a model on a Triton server by its server, name,
version and signature, as a single model's plan does. ``plan_steps`` takes them as the
config has them when the replay is planned (a directory's highest version, the server's
served version unless the step pins one); ``pinned_config`` opens exactly those on every
run of the replay (or, with ``--current-model``, each step as it is now); ``opened_steps``
records what opened and refuses, on a resume, a server step whose tensors changed;
``moved_step`` says which server step serves another version than planned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.config import ModelSpec, PipelineConfig, graph_model
from worker.errors import ConfigError, InferenceServerError
from worker.inference import ModelGraph
from worker.models import step_candidates

__all__ = ["StepModel", "moved_step", "opened_steps", "pinned_config", "plan_steps"]


@dataclass(frozen=True, slots=True)
class StepModel:
    """One step's model as a replay runs it."""

    step: str
    name: str
    version: str
    path: str | None = None
    """Its ONNX file; None for a model on a Triton server."""
    sha256: str | None = None
    """The file's SHA-256 (pinned on every run), or the server model's digest."""
    server: str | None = None
    server_model: str | None = None
    signature: str | None = None
    """``TritonEngine.signature`` of a server model's version, checked on resume."""


def plan_steps(
    config: PipelineConfig, served: Callable[[ModelSpec], str] | None
) -> tuple[StepModel, ...]:
    """Each step's model now: a file's newest version, a server model's pinned version or
    the one ``served`` says the server serves. Raises ``ConfigError`` for a step with no
    model file now, or a server step whose version nobody can say."""
    found = step_candidates(config)
    if found is None:
        raise ConfigError(f"pipeline {config.name!r}: a step of its graph has no model file now")
    out = []
    for step in found[0].steps or ():
        spec = step.model
        if spec.triton is None:
            out.append(StepModel(step.name, spec.name, spec.version, path=str(spec.file)))
            continue
        version = spec.triton.version
        if version is None:
            if served is None:
                raise ConfigError(f"step {step.name}: which version of {spec.where}?")
            version = served(spec)
        model = spec.triton.model or spec.name
        out.append(
            StepModel(step.name, spec.name, version, server=spec.triton.url, server_model=model)
        )
    return tuple(out)


def pinned_config(
    config: PipelineConfig, steps: Sequence[StepModel], current: bool
) -> PipelineConfig:
    """``config`` running ``steps`` (``current``: each step's newest file and its
    server's served version), none watched. Raises ``ConfigError`` when the pipeline's
    steps are not the planned ones."""
    now = [step.name for step in config.steps or ()]
    if now != [s.step for s in steps]:
        raise ConfigError(
            f"pipeline {config.name!r} has steps {', '.join(now) or 'none'} now; the replay "
            f"was planned on steps {', '.join(s.step for s in steps)}"
        )
    if current:
        found = step_candidates(config)
        if found is None:
            raise ConfigError(
                f"pipeline {config.name!r}: a step of its graph has no model file now"
            )
        config = found[0]
    pinned = [
        step.model_copy(update={"model": _pinned(step.model, planned, current)})
        for step, planned in zip(config.steps or (), steps, strict=True)
    ]
    return config.model_copy(update={"steps": pinned, "model": graph_model(pinned)})


def _pinned(spec: ModelSpec, planned: StepModel, current: bool) -> ModelSpec:
    if spec.triton is not None:
        version = None if current else planned.version
        triton = spec.triton.model_copy(update={"version": version})
        return spec.model_copy(update={"triton": triton, "watch": False})
    if current:
        return spec.model_copy(update={"watch": False, "version_dir": None})
    return spec.model_copy(
        update={
            "path": Path(planned.path or ""),
            "version": planned.version,
            "sha256": planned.sha256 or spec.sha256,
            "watch": False,
            "version_dir": None,
        }
    )


def opened_steps(
    planned: Sequence[StepModel], config: PipelineConfig, graph: ModelGraph, *, check: bool
) -> tuple[StepModel, ...]:
    """The steps as ``graph`` opened them from ``config`` (``pinned_config``'s): file,
    version, digest, signature; with ``check``
    (a resume that did not ask for ``--current-model``), ``ConfigError`` for a server
    step whose version takes or gives other tensors than planned."""
    out = []
    specs = [step.model for step in config.steps or ()]
    for was, spec, step in zip(planned, specs, graph.steps, strict=True):
        signature = getattr(step.engine, "signature", None)
        if check and was.signature not in (None, signature):
            raise ConfigError(
                f"step {was.step}: model {was.server_model} version {step.version} on "
                f"{was.server} takes or gives other tensors than when the replay was "
                "planned (its metadata changed); resume with --current-model to go on "
                "with it as it is"
            )
        path = None if spec.triton is not None else str(spec.file)
        out.append(
            StepModel(
                was.step,
                was.name,
                step.version,
                path=path,
                sha256=step.engine.model_hash,
                server=was.server,
                server_model=was.server_model,
                signature=signature,
            )
        )
    return tuple(out)


def moved_step(
    config: PipelineConfig, steps: Sequence[StepModel], served: Callable[[ModelSpec], str]
) -> ConfigError | None:
    """Why the planned steps did not open, when a server step's server answers with
    another version than planned (``served``: the version it serves now); None when no
    server answers so (an outage, said as such)."""
    for step, planned in zip(config.steps or (), steps, strict=True):
        triton = step.model.triton
        if triton is None:
            continue
        latest = step.model.model_copy(
            update={"triton": triton.model_copy(update={"version": None})}
        )
        try:
            now = served(latest)
        except InferenceServerError:
            continue
        if now != planned.version:
            return ConfigError(
                f"step {planned.step}: the Triton server at {planned.server} has no version "
                f"{planned.version} of model {planned.server_model} ready; it serves version "
                f"{now} now: resume with --current-model to go on with it, or serve version "
                f"{planned.version} there again"
            )
    return None
