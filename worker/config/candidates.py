"""Models run beside a pipeline's own on the same features: a canary that scores a share
of the records instead, and a shadow that scores a copy of every batch. Each is a
``ModelSpec`` of the pipeline's model with another file, or another model or version on
the Triton server that runs it (``CandidateSpec.model_spec``)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from worker.config.base import Frozen
from worker.config.model_spec import ModelSpec

__all__ = ["CANARY_BUCKETS", "CanarySpec", "CandidateSpec", "ShadowSpec", "canary_buckets"]

CANARY_BUCKETS = 10_000
"""Record keys hash into this many buckets; a canary takes a whole number of them, so
its smallest share is one bucket: 0.01 percent."""
_SMALLEST_PERCENT = 100 / CANARY_BUCKETS


def canary_buckets(percent: float) -> int:
    """The buckets a canary of ``percent`` takes: ``percent`` x 100, rounded to the
    nearest whole bucket (half up), so 12.345 takes 1,235 of 10,000; the float product's
    last bits are rounded away first (12.345 x 100 is 1234.4999999999998)."""
    return math.floor(round(percent * CANARY_BUCKETS / 100, 6) + 0.5)


class CandidateSpec(Frozen):
    """Another model run beside a pipeline's own, on the same features: a file, or a
    directory of versions (its highest, or ``version``). It is loaded, checked and warmed
    like the pipeline's model, whose other settings (providers, inputs, outputs ...) it
    shares, and must feed exactly like it. Its results name ``name`` (default: the
    pipeline model's) and ``version`` (for a file, required)."""

    model: Path | None = Field(
        default=None,
        description=(
            "The candidate model: an ONNX file, or a directory of numbered versions"
            " (its highest is taken). None where the pipeline's model is on a Triton"
            " server: the candidate is another version of it there (``version``), or"
            " another model there (``server_model``)."
        ),
    )
    server_model: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Where the pipeline's model is on a Triton server: the candidate's model name"
            " on that server (A/B by name); None: the pipeline's model, another version."
        ),
    )
    version: str | None = Field(
        default=None,
        description=(
            "The candidate's version: required for a file, pins one version of a directory;"
            " for a model on a Triton server, the version of it the server serves."
        ),
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "The model name the candidate's results carry; None: its server_model, else"
            " the pipeline model's name."
        ),
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Refuse to start if the candidate's file has another SHA-256.",
    )

    def model_spec(self, primary: ModelSpec) -> ModelSpec:
        """The candidate as a ``ModelSpec`` (once the config is loaded: ``model`` names a
        file, or the primary is on a server, and ``version`` is set)."""
        if primary.triton is not None:  # another version or model on the same server
            served = {"version": self.version}
            if self.server_model is not None:
                served["model"] = self.server_model
            return primary.model_copy(
                update={
                    "triton": primary.triton.model_copy(update=served),
                    "name": self.name or self.server_model or primary.name,
                    "watch": False,
                }
            )
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
    results, published like the others, name it. ``percent`` is honoured to the nearest
    bucket (0.01); a percent below one bucket would score no record and is refused."""

    percent: float = Field(
        gt=0,
        le=100,
        description=(
            "The share of records the canary scores, 0.01 to 100, honoured to the "
            "nearest 0.01; a record's Kafka key (or request id) decides, so one key"
            " always goes the same way."
        ),
    )

    @field_validator("percent")
    @classmethod
    def _takes_a_bucket(cls, percent: float) -> float:
        if percent < _SMALLEST_PERCENT:
            raise ValueError(
                f"{percent:g} is below {_SMALLEST_PERCENT:g}, the smallest share a canary "
                f"can take (one of {CANARY_BUCKETS:,} key buckets): it would score no record"
            )
        return percent


class ShadowSpec(CandidateSpec):
    """``[pipelines.shadow]``: this model also scores a copy of every batch, after the
    pipeline's model, on a thread of its own (``worker.pipeline.shadow``); its results go to
    ``topic``. The pipeline's publish waits at most ``max_delay_ms`` for room among the
    ``queue_batches`` waiting for it; a batch that finds none is dropped for the shadow
    and counted. Agreement with the pipeline's model is measured over about the last
    ``agreement_rows`` rows."""

    topic: str = Field(
        min_length=1,
        description=(
            "Where the shadow's results go; neither the pipeline's result topic nor"
            " its dead-letter topic."
        ),
    )
    queue_batches: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=(
            "Batches that may wait for the shadow model; a full queue drops the "
            "batch for the shadow (counted), never slowing the pipeline."
        ),
    )
    max_delay_ms: float = Field(
        default=0.0,
        ge=0,
        le=10_000,
        description=(
            "How long a publish may wait for room in the shadow's queue before the "
            "batch is dropped for the shadow."
        ),
    )
    agreement_rows: int = Field(
        default=10_000,
        ge=1,
        le=100_000_000,
        description="Rows the shadow's agreement metrics look back over.",
    )
