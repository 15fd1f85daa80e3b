"""The soak's bookkeeping, free of Kafka and clocks: what was sent, answered and
dead-lettered, closed into one row per minute, and the drift verdict over the rows.

``Tally`` is fed by the soak's producer and reader threads (one call per record sent,
one per batch read) and closed by its main thread once a minute; every time it takes is
given by the caller, so a test drives it with plain numbers.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

from streamfer_dev.harness import percentile

__all__ = ["DRIFT_LIMITS", "Answer", "Tally", "drift", "totals", "windows"]

Answer = tuple[int, tuple[int, int], float]
"""One result read: (request number, its source partition and offset, latency in ms)."""


@dataclass
class Tally:
    """Requests sent, results and dead letters read, per minute and in all."""

    grace_s: float
    """A request with no result this long after it was sent counts as lost (so far)."""
    pending: dict[int, float] = field(default_factory=dict)
    """Request number -> when it was sent, for every request with no outcome yet; in
    sending order, so the overdue ones are at the front."""
    sources: set[tuple[int, int]] = field(default_factory=set)
    sent: int = 0
    results: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    _minute_sent: int = 0
    _minute_results: int = 0
    _minute_duplicates: int = 0
    _minute_dead: int = 0
    _latencies: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sent_one(self, number: int, at: float) -> None:
        with self._lock:
            self.pending[number] = at
            self.sent += 1
            self._minute_sent += 1

    def answered(self, answers: list[Answer], dead: list[int]) -> None:
        """One batch read: results, and the request numbers of dead letters. A second
        result of one source record is a duplicate (a request the producer wrote twice
        is two source records, each answered once)."""
        with self._lock:
            for number, source, latency_ms in answers:
                self.pending.pop(number, None)
                if source in self.sources:
                    self.duplicates += 1
                    self._minute_duplicates += 1
                    continue
                self.sources.add(source)
                self.results += 1
                self._minute_results += 1
                self._latencies.append(latency_ms)
            for number in dead:
                self.pending.pop(number, None)
            self.dead_letters += len(dead)
            self._minute_dead += len(dead)

    def overdue(self, now: float) -> int:
        """Requests sent more than ``grace_s`` before ``now`` with no outcome yet."""
        cutoff = now - self.grace_s
        count = 0
        with self._lock:
            for at in self.pending.values():
                if at >= cutoff:
                    break
                count += 1
        return count

    def close_minute(self, minute: int, now: float) -> dict[str, Any]:
        """The row of the minute that ends at ``now``; the next minute starts empty."""
        lost = self.overdue(now)
        with self._lock:
            latencies, self._latencies = self._latencies, []
            row: dict[str, Any] = {
                "minute": minute,
                "produced": self._minute_sent,
                "results": self._minute_results,
                "lost_so_far": lost,
                "duplicates": self._minute_duplicates,
                "dead_letters": self._minute_dead,
                "p50_ms": _rounded(percentile(latencies, 50)),
                "p99_ms": _rounded(percentile(latencies, 99)),
            }
            self._minute_sent = self._minute_results = 0
            self._minute_duplicates = self._minute_dead = 0
        return row


def _rounded(value: float) -> float | None:
    return None if value != value else round(value, 1)  # NaN: no result that minute


DRIFT_LIMITS = {"rss_growth": 0.10, "rss_growth_mb": 32.0, "p99_ratio": 1.5, "cpu_ratio": 1.2}
"""What "nothing drifts" means: over the last window against the early one (``windows``),
each worker's median RSS grows by at most 10 % or 32 MiB, whichever is larger (a heap
settles in steps of arenas); the median per-minute p99 is at most 1.5 times the early
one; and the workers' median CPU seconds per thousand results at most 1.2 times. Medians,
so that the minute of a broker restart, one in ten, moves no verdict on its own."""


def windows(minutes: int) -> tuple[range, range]:
    """The early window (minutes 5-15 of an hour, after warm-up) and the last one (the
    last 10 minutes), scaled to a run of ``minutes``."""
    early_start = max(1, minutes // 12) if minutes >= 4 else 0
    early = range(early_start, max(early_start + 1, minutes // 4))
    last = range(max(early.stop, minutes - max(1, minutes // 6)), minutes)
    return early, last


def drift(rows: list[dict[str, Any]], workers: list[str]) -> dict[str, Any]:
    """Compare the last window with the early one; ``held`` when every figure stays
    within ``DRIFT_LIMITS``. Rows carry ``rss_mb`` and ``cpu_s`` per worker name."""
    early, last = windows(len(rows))
    before = [rows[i] for i in early]
    after = [rows[i] for i in last]
    checks: dict[str, Any] = {"early_minutes": [early.start, early.stop - 1]}
    checks["last_minutes"] = [last.start, last.stop - 1]
    verdicts: list[bool] = []
    for name in workers:
        a = _median([r["rss_mb"].get(name) for r in before])
        b = _median([r["rss_mb"].get(name) for r in after])
        limit = (
            None
            if a is None
            else max(a * DRIFT_LIMITS["rss_growth"], DRIFT_LIMITS["rss_growth_mb"])
        )
        ok = a is not None and b is not None and limit is not None and b - a <= limit
        checks[f"rss_mb_{name}"] = {"early": a, "last": b, "held": ok}
        verdicts.append(ok)
    for key, figure in (("p99_ratio", _p99), ("cpu_ratio", _cpu_per_k)):
        a = _median([figure(r) for r in before])
        b = _median([figure(r) for r in after])
        ok = a is not None and b is not None and b <= a * DRIFT_LIMITS[key]
        checks[key.removesuffix("_ratio")] = {"early": a, "last": b, "held": ok}
        verdicts.append(ok)
    checks["held"] = all(verdicts)
    return checks


def _p99(row: dict[str, Any]) -> float | None:
    value: float | None = row["p99_ms"]
    return value


def _cpu_per_k(row: dict[str, Any]) -> float | None:
    if not row["results"]:
        return None
    return round(sum(row["cpu_s"].values()) / row["results"] * 1000, 3)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def totals(rows: list[dict[str, Any]], tally: Tally, lost: int) -> dict[str, Any]:
    """The run's totals; ``lost`` counts the requests still without an outcome after the
    final drain."""
    return {
        "produced": tally.sent,
        "results": tally.results,
        "lost": lost,
        "duplicates": tally.duplicates,
        "dead_letters": tally.dead_letters,
        "minutes": len(rows),
        "worst_p99_ms": max((r["p99_ms"] for r in rows if r["p99_ms"] is not None), default=None),
    }
