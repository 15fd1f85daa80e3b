"""A pipeline's canary and shadow models, loaded, checked and warmed like its own.

Each goes through ``worker.models.parts.load_model`` (its pinned sha256, the pipeline's feed
plan, every warm-up bucket) and must then fit the pipeline's model (``ModelFit``): fed
the same way, and for a canary, whose results join the pipeline's, giving the same
result fields. One that does not fit raises ``ModelMismatchError`` naming it, a
configuration error (exit 2), before the worker joins its group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from worker.config import CandidateSpec, PipelineConfig
from worker.errors import EngineError, ModelMismatchError
from worker.inference import LiveModel
from worker.models.fit import ModelFit
from worker.models.metrics import ModelFamilies
from worker.models.parts import LoadedModel, load_model

__all__ = ["Candidates", "load_candidates"]


class Candidates(NamedTuple):
    canary: LiveModel | None
    shadow: LiveModel | None


def load_candidates(
    config: PipelineConfig,
    serving: LoadedModel,
    *,
    warm_up: Iterable[int] | None = None,
    metrics: ModelFamilies | None = None,
) -> Candidates:
    """The canary and shadow of ``config`` (None where there is none), each checked
    against ``serving``, the pipeline's own model and feed plan. Blocks while they load
    and warm. Raises ModelMismatchError (it does not fit: exit 2) or EngineError (it
    cannot load or run), naming the candidate."""
    if config.canary is None and config.shadow is None:
        return Candidates(None, None)
    fit = ModelFit.of(serving)

    def load(role: str, spec: CandidateSpec, results: bool) -> LiveModel:
        model = spec.model_spec(config.model)
        served = model.triton
        source = model.path if served is None else f"{served.model or model.name}:{served.version}"
        where = f"pipelines.{config.name}.{role}: model {source}"
        try:
            loaded = load_model(config, model, warm_up=warm_up, metrics=metrics)
            fit.check(ModelFit.of(loaded), "the pipeline's model's", results=results)
        except (ModelMismatchError, EngineError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        return LiveModel.of(model, loaded.engine)

    return Candidates(
        load("canary", config.canary, True) if config.canary is not None else None,
        load("shadow", config.shadow, False) if config.shadow is not None else None,
    )
