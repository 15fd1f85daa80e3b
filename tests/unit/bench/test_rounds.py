"""Several rounds of the benchmark's contenders: their order, the medians, the ratios
round by round."""

from __future__ import annotations

from typing import Any

from benchmarks.report import ratios
from benchmarks.rounds import median_row, round_orders, round_ratios, rounds_text


def _row(rps: float, cpu: float, p99: float, lost: int = 0) -> dict[str, Any]:
    return {
        "records": 40_000,
        "rps": rps,
        "p50_ms": 10.0,
        "p95_ms": 15.0,
        "p99_ms": p99,
        "first_5s_p99_ms": None,
        "cpu_s_per_10k": cpu,
        "rss_mb": 100.0,
        "lost": lost,
        "duplicates": 0,
    }


def test_no_contender_always_goes_first() -> None:
    orders = round_orders(["streamfer", "batch_loop"], 3)
    assert orders == [
        ["streamfer", "batch_loop"],
        ["batch_loop", "streamfer"],
        ["streamfer", "batch_loop"],
    ]
    assert round_orders(["streamfer"], 1) == [["streamfer"]]


def test_a_row_is_the_median_of_its_rounds_and_shows_any_loss() -> None:
    row = median_row([_row(2000, 0.50, 18), _row(1990, 0.70, 30, lost=2), _row(2001, 0.52, 19)])
    assert row["cpu_s_per_10k"] == 0.52
    assert row["p99_ms"] == 19.0
    assert row["rps"] == 2000.0
    assert row["first_5s_p99_ms"] is None
    assert row["lost"] == 2, "one round that lost records is not hidden by the median"
    assert row["note"] == "median of 3 rounds"


def test_one_round_is_its_own_row() -> None:
    only = _row(2000, 0.5, 18)
    assert median_row([only]) == only


def test_ratios_are_taken_within_each_round() -> None:
    """Round by round, each ratio's two figures come from the same round: the spread
    between rounds does not leak into it."""
    rows = {
        "streamfer": [_row(2000, 0.48, 18), _row(2000, 0.60, 18)],
        "batch_loop": [_row(2000, 0.50, 20), _row(2000, 0.66, 20)],
    }
    per_round = round_ratios(rows, ratios)
    assert per_round["cpu_per_10k_streamfer_over_batch_loop"] == [0.96, 0.91]
    assert "streamfer_vs_faust" not in per_round, "only ratios every round has"
    (line,) = [t for t in rounds_text(per_round) if "cpu_per_10k_streamfer_over_batch_loop" in t]
    assert line.endswith("0.96x, 0.91x (median 0.935x)")
