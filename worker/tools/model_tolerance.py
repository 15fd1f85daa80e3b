"""What an optimized copy's answers must meet before ``model optimize`` writes it.

- A classifier (a label output, or scores of two or more columns to take the argmax of)
  is held to ``max_drop``: the share of rows whose label may differ from FP32's. Rows
  whose outputs are not finite, or whose inputs lie beyond float16's range in an FP16
  copy, count as differing.
- A model with no label (a regressor, a single output column) is held to the max and
  mean absolute difference of its float outputs from FP32's, by default 0.01 and 0.001:
  FP16's rounding (2**-11 of each weight) on outputs of order one, with room. Outputs
  of another scale need tolerances in their own units, and INT8 usually needs looser
  ones. Any row with non-finite outputs or inputs beyond float16 refuses the copy.
- A classifier is held to the output tolerances too, when they are given.

A difference equal to its tolerance passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.errors import ConfigError
from worker.tools.model_compare import Comparison

__all__ = [
    "DEFAULT_MAX_ABS_DIFF",
    "DEFAULT_MAX_MEAN_ABS_DIFF",
    "Verdict",
    "check_tolerances",
    "judge",
]

DEFAULT_MAX_ABS_DIFF = 0.01
DEFAULT_MAX_MEAN_ABS_DIFF = 0.001


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed_rows: int | None
    """Rows whose label may differ: ``floor(max_drop * rows)``; None without labels."""
    max_abs_diff: float | None
    max_mean_abs_diff: float | None
    """The output tolerances applied; None when not checked (a classifier's default)."""
    refusals: tuple[str, ...]
    """Why the copy is not written, one phrase each; empty when it is."""


def check_tolerances(
    max_drop: float, max_abs_diff: float | None, max_mean_abs_diff: float | None
) -> None:
    """Raises ConfigError for a share outside [0, 1] or a negative or infinite tolerance."""
    if not 0.0 <= max_drop <= 1.0:
        raise ConfigError(f"--max-drop must be between 0 and 1, not {max_drop}")
    tolerances = (("--max-abs-diff", max_abs_diff), ("--max-mean-abs-diff", max_mean_abs_diff))
    for flag, value in tolerances:
        if value is not None and not (value >= 0.0 and math.isfinite(value)):
            raise ConfigError(f"{flag} must be a finite number of at least 0, not {value}")


def judge(
    c: Comparison, max_drop: float, max_abs_diff: float | None, max_mean_abs_diff: float | None
) -> Verdict:
    """Hold ``c`` to the bounds its kind of model answers to (see the module)."""
    refusals: list[str] = []
    allowed = None
    if c.agreeing is not None:
        allowed = math.floor(max_drop * c.rows + 1e-9)
        if c.rows - c.agreeing > allowed:
            beyond = f", {c.unsafe_rows} of them for inputs beyond float16" if c.unsafe_rows else ""
            refusals.append(
                f"{c.rows - c.agreeing} of {c.rows} labels differ from FP32's{beyond} (drop "
                f"{c.drop:.4f}), more than --max-drop {max_drop:g} allows ({allowed} rows)"
            )
    else:
        max_abs_diff = DEFAULT_MAX_ABS_DIFF if max_abs_diff is None else max_abs_diff
        max_mean_abs_diff = (
            DEFAULT_MAX_MEAN_ABS_DIFF if max_mean_abs_diff is None else max_mean_abs_diff
        )
        if c.nonfinite_rows:
            refusals.append(f"{c.nonfinite_rows} of {c.rows} rows' outputs are NaN or inf")
        if c.unsafe_rows:
            refusals.append(
                f"{c.unsafe_rows} of {c.rows} rows have inputs beyond float16's +-65504 "
                "(inf on a device that computes in float16)"
            )
    if max_abs_diff is not None or max_mean_abs_diff is not None:
        refusals += _diff_refusals(c, max_abs_diff, max_mean_abs_diff)
    return Verdict(allowed, max_abs_diff, max_mean_abs_diff, tuple(refusals))


def _diff_refusals(
    c: Comparison, max_abs_diff: float | None, max_mean_abs_diff: float | None
) -> list[str]:
    if c.max_score_diff is None or c.mean_score_diff is None:
        return ["no row has finite outputs in both models, so their differences are unknown"]
    found = []
    if max_abs_diff is not None and c.max_score_diff > max_abs_diff:
        found.append(
            f"outputs differ from FP32's by up to {c.max_score_diff:.4g}, more than "
            f"--max-abs-diff {max_abs_diff:g} allows"
        )
    if max_mean_abs_diff is not None and c.mean_score_diff > max_mean_abs_diff:
        found.append(
            f"outputs differ from FP32's by {c.mean_score_diff:.4g} on average, more than "
            f"--max-mean-abs-diff {max_mean_abs_diff:g} allows"
        )
    if found:  # the scale says whether an absolute tolerance fits these outputs
        found[-1] += f" (FP32's outputs reach {c.max_abs_output:.4g})"
    return found
