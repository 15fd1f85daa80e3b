"""The disruption scenarios' figures: steady p99, recovery, drain rate, its table and chart."""

from __future__ import annotations

from pathlib import Path

from benchmarks import latency
from benchmarks.disruptions import (
    DisruptionOptions,
    draw_disruption,
    format_disruption,
    recovery,
    second_p99s,
)


def run_with_stall(catch_up_ms: float) -> tuple[list[float], list[int]]:
    """A request a millisecond for 40 s, answered in 5 ms, except that the broker stops
    from 10 s to 15 s: each request made until the backlog is gone (``catch_up_ms``
    after the resume) is answered only then."""
    latencies: list[float] = []
    request_ts: list[int] = []
    drained = 15_000 + catch_up_ms
    for t in range(40_000):
        request_ts.append(t)
        latencies.append(drained - t if 10_000 <= t < drained else 5.0)
    return latencies, request_ts


def test_a_contender_that_drains_in_3_s_has_recovered_within_the_next_window() -> None:
    latencies, request_ts = run_with_stall(3_000.0)
    figures = recovery(latencies, request_ts, 10_000.0, 15_000.0, warmup_s=3.0)
    assert figures["steady_p99_ms"] == 5.0
    # windows from the resume, by 1 s: the first clear of every slow request starts at 3 s
    assert figures["recovered_s"] == 3.0
    assert figures["drained_s"] == 3.0
    # everything made up to 18 s was answered in those 3 s: 8,000 requests
    assert figures["drain_rps"] == round(8_000 / 3.0)


def test_a_contender_that_never_drains_never_recovers() -> None:
    latencies, request_ts = run_with_stall(60_000.0)
    figures = recovery(latencies, request_ts, 10_000.0, 15_000.0, warmup_s=3.0)
    assert figures["recovered_s"] is None


def test_table_and_chart(tmp_path: Path) -> None:
    latencies, request_ts = run_with_stall(2_000.0)
    figures = recovery(latencies, request_ts, 10_000.0, 15_000.0, warmup_s=3.0)
    figures["lost"] = 0
    figures["event_s"] = 5.0
    figures["seconds"] = second_p99s(latencies, request_ts, 15_000.0)
    assert figures["seconds"][0] == (-15.0, 5.0)
    report = {
        "date": "today",
        "scenario": "catch-up",
        "rate": 1000.0,
        "pause_s": 5.0,
        "loadavg_1m": 1.0,
        "contenders": {"streamfer": [figures]},
    }
    table = format_disruption(report)
    assert "streamfer | 5.0 | 1950.0 | 2 s | 2.0 s" in table
    draw_disruption(report, tmp_path / "cu.png")
    assert (tmp_path / "cu.png").stat().st_size > 0


def test_consumer_options_reach_the_streamfer_workers_and_the_table() -> None:
    args = latency._parser().parse_args(
        ["--scenario", "join", "--consumer-option", "partition.assignment.strategy=roundrobin"]
    )
    opts = DisruptionOptions.from_args(args, ("streamfer",))
    assert opts.consumer_options == (("partition.assignment.strategy", "roundrobin"),)
    report = {
        "scenario": "join",
        "rate": 2000.0,
        "pause_s": 0.0,
        "loadavg_1m": 1.0,
        "consumer_options": dict(opts.consumer_options),
        "contenders": {},
    }
    assert "streamfer's consumer: partition.assignment.strategy=roundrobin" in (
        format_disruption(report)
    )
    assert latency.main(["--scenario", "join", "--consumer-option", "no-value"]) == 2
