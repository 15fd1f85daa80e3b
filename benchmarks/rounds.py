"""Several rounds of the same contenders in one run, their order alternating.

A steady run's CPU per record swings by 20-30% between identical runs on this machine
(another process waking, the broker compacting, a CPU's frequency), more than most
differences worth measuring. ``python -m benchmarks.run --rounds N`` runs the Kafka
contenders N times on one stack, in their order and then reversed, so that none always
goes first or last. Each contender's row is the median of its rounds (its losses and
duplicates the worst round's), and each ratio is given round by round, its two figures
measured minutes apart at most, with their median: a claim that holds in every round
holds against the spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MEDIAN_FIELDS", "median_row", "round_orders", "round_ratios", "rounds_text"]

MEDIAN_FIELDS = (
    "rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "first_5s_p99_ms",
    "cpu_s_per_10k",
    "rss_mb",
)
"""The figures a contender's row takes the median of; losses and duplicates take the
largest, so one round that lost a record shows."""


def round_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The contenders' order in each round: as given, then reversed, and so on."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def median_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One contender's row over its rounds."""
    if len(rows) == 1:
        return dict(rows[0])
    row = dict(rows[0])
    for key in MEDIAN_FIELDS:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        row[key] = round(statistics.median(values), 3) if values else None
    for key in ("lost", "duplicates"):
        values = [int(r[key]) for r in rows if r.get(key) is not None]
        row[key] = max(values) if values else None
    errors = [str(r["error"]) for r in rows if r.get("error")]
    if errors:
        row["error"] = "; ".join(errors)
    note = f"median of {len(rows)} rounds"
    row["note"] = f"{row['note']}; {note}" if row.get("note") else note
    return row


def round_ratios(
    rows_by_name: dict[str, list[dict[str, Any]]],
    ratios: Callable[[dict[str, dict[str, Any]]], dict[str, Any]],
) -> dict[str, list[float]]:
    """Each ratio ``ratios`` gives, computed round by round from that round's rows; only
    the ratios every round has."""
    rounds = min((len(rows) for rows in rows_by_name.values()), default=0)
    per_round = [
        ratios({name: rows[r] for name, rows in rows_by_name.items()}) for r in range(rounds)
    ]
    keys = [k for k, v in per_round[0].items() if isinstance(v, float)] if per_round else []
    return {
        key: [float(p[key]) for p in per_round]
        for key in keys
        if all(isinstance(p.get(key), float) for p in per_round)
    }


def rounds_text(per_round: dict[str, list[float]]) -> list[str]:
    """A line per ratio: its value in each round, and their median."""
    return [
        f"  {key}: {', '.join(f'{v:g}x' for v in values)} (median {statistics.median(values):g}x)"
        for key, values in per_round.items()
    ]
