"""How far an optimized model's answers and speed are from its FP32 original.

``compare_models`` runs both engines on the same held-out rows and measures:

- label agreement: the share of rows whose label matches FP32's. The label is the
  model's ``label`` output (as the engine names a classifier's outputs), or else the
  argmax of its scores (the ``scores`` output, or its first float output), which needs at
  least two score columns. A row whose scores are not finite (an FP16 overflow, say)
  counts as disagreeing whatever its label, and so does a row the caller marks
  ``unsafe`` (inputs beyond float16's range, which the CPU provider cannot show);
- the max and mean absolute difference of the scores (ZipMap scores included: the
  engine turns them into a matrix in class order);
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

__all__ = ["SPEED_BATCH", "Comparison", "Speed", "compare_models", "labels_and_scores"]

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
    agreeing: int
    labels_from: str
    """The model output that gave the labels, or ``argmax(<output>)``."""
    scores_from: str | None
    """The model output compared as scores."""
    max_score_diff: float | None
    mean_score_diff: float | None
    nonfinite_rows: int
    """Rows whose optimized scores hold NaN or inf (FP32's are finite)."""
    unsafe_rows: int
    """Rows counted as disagreeing whatever the answers (see ``compare_models``)."""
    reference_speed: Speed
    candidate_speed: Speed

    @property
    def agreement(self) -> float:
        return self.agreeing / self.rows

    @property
    def drop(self) -> float:
        return 1.0 - self.agreement

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

    Raises ConfigError when the model gives nothing to take a label from (no label
    output and fewer than two score columns), EngineError when a model fails to run.
    """
    ref = _run(reference, rows)
    got = _run(candidate, rows)
    ref_labels, ref_scores, label_field, score_field = labels_and_scores(ref)
    labels, scores, _, _ = labels_and_scores(got)
    output_of = reference.outputs
    scores_from = None if score_field is None else output_of[score_field]
    labels_from = output_of[label_field] if label_field else f"argmax({scores_from})"
    same = ref_labels == labels
    if unsafe is not None:
        same &= ~unsafe
    max_diff = mean_diff = None
    nonfinite = 0
    if ref_scores is not None and scores is not None:
        a = ref_scores.reshape(rows.count, -1).astype(np.float64)
        b = scores.reshape(rows.count, -1).astype(np.float64)
        ref_ok, got_ok = np.isfinite(a).all(axis=1), np.isfinite(b).all(axis=1)
        nonfinite = int((ref_ok & ~got_ok).sum())
        same &= got_ok | ~ref_ok
        both = ref_ok & got_ok
        if both.any():
            diff = np.abs(a[both] - b[both])
            max_diff, mean_diff = float(diff.max()), float(diff.mean())
    ref_speed, cand_speed = _speeds(reference, candidate, rows.tiled(SPEED_BATCH), seconds)
    return Comparison(
        rows=rows.count,
        agreeing=int(same.sum()),
        labels_from=labels_from,
        scores_from=scores_from,
        max_score_diff=max_diff,
        mean_score_diff=mean_diff,
        nonfinite_rows=nonfinite,
        unsafe_rows=0 if unsafe is None else int(unsafe.sum()),
        reference_speed=ref_speed,
        candidate_speed=cand_speed,
    )


def labels_and_scores(
    outputs: Outputs,
) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None, str | None, str | None]:
    """(labels, scores or None, the label field or None for an argmax of the scores,
    the scores' field or None); fields are the engine's result fields."""
    floats = [k for k, v in outputs.items() if v.dtype.kind == "f"]
    field = "scores" if "scores" in outputs else floats[0] if floats else None
    scores = outputs[field] if field is not None else None
    if "label" in outputs:
        return outputs["label"], scores, "label", field
    if scores is None or scores.ndim != 2 or scores.shape[1] < 2:
        shape = None if scores is None else scores.shape
        raise ConfigError(
            f"the model has no label output and no output with two or more score columns "
            f"(outputs {sorted(outputs)}, scores {field!r} of shape {shape}): label agreement "
            "cannot be measured, and --max-drop guards label agreement"
        )
    return scores.argmax(axis=1), scores, None, field


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
