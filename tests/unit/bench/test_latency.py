"""The latency curve's pure parts: percentiles, windows, the stopping rule, the SLO rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.latency import (
    Step,
    backpressure_pauses,
    draw_chart,
    format_curve,
    latency_figures,
    next_rates,
    slo_rate,
    stop_after,
    tail_split,
    window_p99s,
)


def step(rate: float, p99: float | None, *, rps: float | None = None, lost: int = 0) -> Step:
    return Step(
        rate=rate,
        rps=rate if rps is None else rps,
        p50_ms=None if p99 is None else p99 / 4,
        p99_ms=p99,
        p999_ms=p99,
        cpu_s_per_10k=0.5,
        window_p99_ms=[p99],
        pauses=0,
        lost=lost,
        duplicates=0,
    )


def test_rates_step_through_the_first_then_double() -> None:
    rate = next_rates((250, 500, 1000))
    assert [rate(i) for i in range(5)] == [250, 500, 1000, 2000, 4000]


def test_figures_are_p50_p99_and_p999() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert latency_figures(values) == (501.0, 990.0, 999.0)  # the harness's nearest rank
    assert latency_figures([]) == (None, None, None)


def test_a_stalled_window_stands_out_among_the_windows() -> None:
    ts = [1000 + 10 * i for i in range(2000)]  # 20 s of requests, 100/s
    lat = [5.0] * 2000
    for i in range(1000, 1100):  # one second of the third window stalls
        lat[i] = 2000.0
    assert window_p99s(lat, ts) == [5.0, 5.0, 2000.0, 5.0]


def test_the_tail_split_says_which_side_the_slowest_requests_lost_time_on() -> None:
    # 1,000 requests of 3 ms, 2 before the result was produced; the slowest 20 spent
    # 12 ms after it (a producer's linger, say)
    latencies = [3.0] * 980 + [14.0] * 20
    produced = [2.0] * 980 + [2.0] * 20
    assert tail_split(latencies, produced) == (2.0, 12.0)
    # the same tail spent in the worker instead
    assert tail_split(latencies, [2.0] * 980 + [13.0] * 20) == (13.0, 1.0)
    assert tail_split([], []) == (None, None)


def test_a_window_without_requests_is_none() -> None:
    assert window_p99s([1.0, 2.0], [0, 12_000]) == [1.0, None, 2.0]
    assert window_p99s([], []) == []


def test_pauses_are_counted_from_the_log() -> None:
    log = (
        "INFO worker.loop.pausing: backpressure: 1275 records in 0 batches in flight\n"
        "INFO worker.loop.pausing: backpressure over: 512 records in flight, resuming\n"
        "INFO worker.loop.pausing: backpressure: 1841 records in 0 batches in flight\n"
    )
    assert backpressure_pauses(log) == 2
    assert backpressure_pauses("") == 0


@pytest.mark.parametrize(
    ("s", "stops"),
    [
        (step(1000, 99.0), False),
        (step(1000, 100.0), False),
        (step(1000, 100.5), True),  # just over the bound
        (step(1000, 10.0, rps=899.0), True),  # behind: under 90 % of the rate
        (step(1000, 10.0, rps=900.0), False),
        (step(1000, 10.0, lost=1), True),
        (step(1000, None), True),
    ],
)
def test_the_curve_ends_past_the_bound_or_behind(s: Step, stops: bool) -> None:
    assert stop_after(s, 100.0) is stops


def test_slo_rate_is_the_highest_rate_within_it() -> None:
    steps = [step(250, 8.0), step(500, 20.0), step(1000, 20.01), step(2000, 15.0, rps=1500)]
    assert slo_rate(steps, 20.0) == 500
    assert slo_rate([step(250, 25.0)], 20.0) is None
    assert slo_rate([], 20.0) is None


def test_table_and_chart(tmp_path: Path) -> None:
    report = {
        "date": "2026-12-04 23:00 UTC",
        "commit": "abc1234",
        "slo_ms": 20.0,
        "curves": {"relay": [step(250, 8.0).as_dict(), step(500, None).as_dict()]},
        "slo_rate": {"relay": 250.0},
    }
    table = format_curve(report)
    assert "relay | 250 | 250 | 2.0 | 8.0 | 8.0 | 0.5 | 0 | 8 | -" in table
    assert "relay: highest rate with p99 <= 20 ms: 250/s" in table
    chart = tmp_path / "curve.png"
    draw_chart(report, chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
