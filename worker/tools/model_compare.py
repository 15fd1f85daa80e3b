"""How far an optimized model's answers and speed are from its FP32 original.

``compare_models`` runs both engines on the same held-out rows and measures:

- label agreement: the share of rows whose label matches FP32's. The label is the
  model's ``label`` output (as the engine names a classifier's outputs), or else the
  argmax of its scores (the ``scores`` output, or its first float output) when they have
  at least two columns; a model with neither (a regressor, a single output column) has
  no label, and only its outputs are compared. A row whose outputs are not finite (an
  FP16 overflow, say) counts as disagreeing whatever its label, and so does a row the
  caller marks ``unsafe`` (inputs beyond float16's range, which the CPU provider cannot
  show);
- the max and mean absolute difference of the float outputs, over the rows where both
  models' are finite (ZipMap scores included: the engine turns them into a matrix in
  class order);
- speed on this machine: rows/s and p99 ms per batch at batch 256, each model on ONNX
  Runtime CPU with one intra-op thread, as a worker runs it. The two models take turns in
  short rounds, so a neighbour's load falls on both.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.errors import ConfigError
from worker.inference import Feeds, OnnxEngine
from worker.tools.model_rows import ModelRows

__all__ = ["SPEED_BATCH", "Comparison", "Speed", "compare_models", "labels_of"]

SPEED_BATCH = 256
_ROUNDS = 4

Outputs = dict[str, npt.NDArray[Any]]


@dataclass(frozen=True, slots=True)
class Speed:
    rows_per_s: float
    p99_ms: float
    batches: int


@dataclass(frozen=True, slots=True)
class Comparison:
    rows: int
    agreeing: int | None
    """Rows whose label agrees; None for a model with no label."""
    labels_from: str | None
    """The model output that gave the labels, ``argmax(<output>)``, or None."""
    scores_from: str | None
    """The model outputs whose differences were measured, comma-separated."""
    max_score_diff: float | None
    mean_score_diff: float | None
    """None when no row has finite outputs in both models."""
    max_abs_output: float | None
    """The largest absolute FP32 output among those rows: the scale of the differences."""
    nonfinite_rows: int
    """Rows whose optimized outputs hold NaN or inf (FP32's are finite)."""
    unsafe_rows: int
    """Rows counted as disagreeing whatever the answers (see ``compare_models``)."""
    reference_speed: Speed
    candidate_speed: Speed

    @property
    def agreement(self) -> float | None:
        return None if self.agreeing is None else self.agreeing / self.rows

    @property
    def drop(self) -> float | None:
        return None if self.agreeing is None else 1.0 - self.agreeing / self.rows

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "agreement": self.agreement, "drop": self.drop}


def compare_models(
    reference: OnnxEngine,
    candidate: OnnxEngine,
    rows: ModelRows,
    *,
    seconds: float,
    unsafe: npt.NDArray[np.bool_] | None = None,
) -> Comparison:
    """Answers of both engines on ``rows``, and ``seconds`` of timing each; rows marked
    in ``unsafe`` count as disagreeing.

    Raises ConfigError when the model has neither a label nor a float output to compare,
    EngineError when a model fails to run.
    """
    ref = _run(reference, rows)
    got = _run(candidate, rows)
    ref_labels, labels_from = labels_of(ref, reference.outputs)
    labels, _ = labels_of(got, reference.outputs)
    floats = [k for k, v in ref.items() if v.dtype.kind == "f"]
    scores_from = ", ".join(reference.outputs[k] for k in floats) or None
    same = np.ones(rows.count, dtype=bool)
    if ref_labels is not None and labels is not None:
        same &= ref_labels == labels
    if unsafe is not None:
        same &= ~unsafe
    max_diff = mean_diff = scale = None
    nonfinite = 0
    if floats:
        a = np.hstack([ref[k].reshape(rows.count, -1) for k in floats]).astype(np.float64)
        b = np.hstack([got[k].reshape(rows.count, -1) for k in floats]).astype(np.float64)
        ref_ok, got_ok = np.isfinite(a).all(axis=1), np.isfinite(b).all(axis=1)
        nonfinite = int((ref_ok & ~got_ok).sum())
        same &= got_ok | ~ref_ok
        both = ref_ok & got_ok
        if both.any():
            diff = np.abs(a[both] - b[both])
            max_diff, mean_diff = float(diff.max()), float(diff.mean())
            scale = float(np.abs(a[both]).max())
    ref_speed, cand_speed = _speeds(reference, candidate, rows.tiled(SPEED_BATCH), seconds)
    return Comparison(
        rows=rows.count,
        agreeing=None if labels_from is None else int(same.sum()),
        labels_from=labels_from,
        scores_from=scores_from,
        max_score_diff=max_diff,
        mean_score_diff=mean_diff,
        max_abs_output=scale,
        nonfinite_rows=nonfinite,
        unsafe_rows=0 if unsafe is None else int(unsafe.sum()),
        reference_speed=ref_speed,
        candidate_speed=cand_speed,
    )


def labels_of(
    outputs: Outputs, output_of: dict[str, str]
) -> tuple[npt.NDArray[Any] | None, str | None]:
    """(labels, where they come from: a model output or ``argmax(<output>)``), or
    (None, None) when the model has no ``label`` and no float output of two or more
    columns; ``output_of`` maps the engine's result fields to model outputs.

    Raises ConfigError when the model has no label and no float output at all.
    """
    if "label" in outputs:
        return outputs["label"], output_of["label"]
    floats = [k for k, v in outputs.items() if v.dtype.kind == "f"]
    if not floats:
        raise ConfigError(
            f"the model has no label output and no float output (outputs {sorted(outputs)}): "
            "there is nothing to compare"
        )
    field = "scores" if "scores" in outputs else floats[0]
    scores = outputs[field]
    if scores.ndim != 2 or scores.shape[1] < 2:
        return None, None
    return scores.argmax(axis=1), f"argmax({output_of[field]})"


def _run(engine: OnnxEngine, rows: ModelRows) -> Outputs:
    parts = [engine.infer(batch) for batch in rows.batches(SPEED_BATCH)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _speeds(a: OnnxEngine, b: OnnxEngine, feeds: Feeds, seconds: float) -> tuple[Speed, Speed]:
    """Both engines timed in alternating rounds, ``seconds`` in all for each."""
    times: tuple[list[float], list[float]] = ([], [])
    for engine in (a, b):
        engine.infer(feeds)  # first-run allocations are not timed
    for _ in range(_ROUNDS):
        for engine, spent in zip((a, b), times, strict=True):
            deadline = time.perf_counter() + seconds / _ROUNDS
            while True:
                started = time.perf_counter()
                engine.infer(feeds)
                ended = time.perf_counter()
                spent.append(ended - started)
                if ended >= deadline:
                    break
    return _speed(times[0]), _speed(times[1])


def _speed(batch_seconds: list[float]) -> Speed:
    spent = np.asarray(batch_seconds)
    return Speed(
        rows_per_s=SPEED_BATCH * len(spent) / float(spent.sum()),
        p99_ms=1000.0 * float(np.percentile(spent, 99)),
        batches=len(spent),
    )
