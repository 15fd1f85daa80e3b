"""Models run beside a pipeline's own on the same features: a canary that scores a share
of the records instead, and a shadow that scores a copy of every batch. Each is a
``ModelSpec`` of the pipeline's model with another file (``CandidateSpec.model_spec``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from worker.config.base import Frozen
from worker.config.model_spec import ModelSpec

__all__ = ["CanarySpec", "CandidateSpec", "ShadowSpec"]


class CandidateSpec(Frozen):
    """Another model run beside a pipeline's own, on the same features: a file, or a
    directory of versions (its highest, or ``version``). It is loaded, checked and warmed
    like the pipeline's model, whose other settings (providers, inputs, outputs ...) it
    shares, and must feed exactly like it. Its results name ``name`` (default: the
    pipeline model's) and ``version`` (for a file, required)."""

    model: Path
    version: str | None = None
    name: str | None = Field(default=None, min_length=1)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")

    def model_spec(self, primary: ModelSpec) -> ModelSpec:
        """The candidate as a ``ModelSpec`` (once the config is loaded: ``model`` names a
        file and ``version`` is set)."""
        return primary.model_copy(
            update={
                "path": self.model,
                "version": self.version or primary.version,
                "name": self.name or primary.name,
                "sha256": self.sha256,
                "version_dir": None,
                "watch": False,
            }
        )


class CanarySpec(CandidateSpec):
    """``[pipelines.canary]``: the records whose key hashes into the first ``percent`` of
    10,000 buckets (``worker.pipeline.canary``) are scored by this model instead, and their
    results, published like the others, name it."""

    percent: float = Field(gt=0, le=100)


class ShadowSpec(CandidateSpec):
    """``[pipelines.shadow]``: this model also scores a copy of every batch, after the
    pipeline's model, on a thread of its own (``worker.pipeline.shadow``); its results go to
    ``topic``. The pipeline's publish waits at most ``max_delay_ms`` for room among the
    ``queue_batches`` waiting for it; a batch that finds none is dropped for the shadow
    and counted. Agreement with the pipeline's model is measured over about the last
    ``agreement_rows`` rows."""

    topic: str = Field(min_length=1)
    queue_batches: int = Field(default=8, ge=1, le=1024)
    max_delay_ms: float = Field(default=0.0, ge=0, le=10_000)
    agreement_rows: int = Field(default=10_000, ge=1, le=100_000_000)
