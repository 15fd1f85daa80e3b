"""The benchmark's summary of what its reader saw: the first seconds of a steady run, and
from which result a steady run's CPU is counted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import orjson

from benchmarks.measure import FIRST_SECONDS, Reading, _count, _past, summarize


def _steady(latencies: list[tuple[int, float]]) -> Reading:
    """A steady run's reading: (request time ms, latency ms) per request."""
    reading = Reading(expected=len(latencies))
    for i, (at, latency) in enumerate(latencies):
        reading.results[f"r{i}"] = 1
        reading.latencies_ms.append(latency)
        reading.request_ts_ms.append(at)
    reading.first_request_ms = latencies[0][0]
    reading.last_result_ms = latencies[-1][0] + latencies[-1][1]
    reading.results = Counter(reading.results)
    return reading


def test_the_first_seconds_p99_counts_only_requests_made_in_them() -> None:
    edge = int(FIRST_SECONDS * 1000)
    early = [(t, 900.0) for t in range(0, edge, 10)]  # a slow start
    late = [(t, 20.0) for t in range(edge, 4 * edge, 10)]
    row = summarize(_steady(early + late), backlog=False, rss_mb=None, warmup_s=FIRST_SECONDS)
    assert row["first_5s_p99_ms"] == 900.0
    assert row["p99_ms"] == 20.0  # the warm-up window skipped


def test_a_request_just_past_the_first_seconds_is_not_in_them() -> None:
    edge = int(FIRST_SECONDS * 1000)
    row = summarize(
        _steady([(0, 10.0), (edge - 1, 10.0), (edge, 5000.0)]), backlog=False, rss_mb=None
    )
    assert row["first_5s_p99_ms"] == 10.0


def test_backlog_runs_have_no_first_seconds_figure() -> None:
    reading = _steady([(0, 10.0), (1, 10.0)])
    reading.first_result_ms = 10.0
    assert summarize(reading, backlog=True, rss_mb=None)["first_5s_p99_ms"] is None


@dataclass
class _Result:
    """A result record as the reader sees it: its body and its CreateTime."""

    rid: str
    request_ts_ms: int

    def value(self) -> bytes:
        return orjson.dumps({"id": self.rid, "request_ts_ms": self.request_ts_ms})

    def timestamp(self) -> tuple[int, int]:
        return 1, self.request_ts_ms + 5

    def headers(self) -> None:
        return None


def test_a_steady_runs_cpu_counts_from_the_first_request_past_the_warm_up() -> None:
    """The start-up (the backlog a group join leaves, first connections) is left out of
    CPU per record as it is of latency: CPU is first sampled at the result of a request
    made ``warmup_s`` after the first request, not a millisecond sooner."""
    reading = Reading(expected=3)
    pending = {"r0", "r1", "r2"}
    start = 1_000_000
    _count(reading, _Result("r0", start), pending)
    assert _past(reading, 0.0), "without a warm-up, from the first result"
    assert not _past(reading, 3.0)
    _count(reading, _Result("r1", start + 2_999), pending)
    assert not _past(reading, 3.0), "just under the warm-up"
    _count(reading, _Result("r2", start + 3_000), pending)
    assert _past(reading, 3.0), "just past it"
    assert not pending
