"""The soak's bookkeeping: rows per minute, lost and duplicates, the drift verdict, the
fault plan."""

from __future__ import annotations

from typing import Any

from benchmarks.soak import schedule
from benchmarks.soak_minutes import Tally, drift, totals, windows


def test_a_minute_row_counts_what_was_sent_answered_and_dead_lettered() -> None:
    tally = Tally(grace_s=30.0)
    for n in range(4):
        tally.sent_one(n, at=100.0 + n)
    tally.answered([(0, (0, 0), 10.0), (1, (1, 0), 30.0)], dead=[2])
    row = tally.close_minute(0, now=110.0)
    assert row["produced"] == 4
    assert row["results"] == 2
    assert row["dead_letters"] == 1
    assert row["lost_so_far"] == 0, "request 3 is still within its grace"
    assert (row["p50_ms"], row["p99_ms"]) == (10.0, 30.0)
    nothing = tally.close_minute(1, now=120.0)
    assert (nothing["produced"], nothing["results"], nothing["p99_ms"]) == (0, 0, None)


def test_a_request_past_its_grace_counts_as_lost_until_its_result_comes() -> None:
    tally = Tally(grace_s=30.0)
    tally.sent_one(0, at=100.0)
    tally.sent_one(1, at=125.0)
    assert tally.close_minute(0, now=140.0)["lost_so_far"] == 1
    tally.answered([(0, (0, 0), 41_000.0)], dead=[])
    assert tally.close_minute(1, now=150.0)["lost_so_far"] == 0
    assert tally.overdue(float("inf")) == 1, "request 1 still has no outcome"


def test_a_second_result_of_one_source_record_is_a_duplicate() -> None:
    tally = Tally(grace_s=30.0)
    tally.sent_one(0, at=100.0)
    tally.sent_one(1, at=100.0)
    tally.answered([(0, (0, 5), 10.0), (0, (0, 5), 12.0)], dead=[])
    # the producer wrote request 1 twice: two source records, each answered once
    tally.answered([(1, (1, 7), 10.0), (1, (2, 3), 11.0)], dead=[])
    row = tally.close_minute(0, now=110.0)
    assert (row["results"], row["duplicates"]) == (3, 1)
    assert totals([row], tally, lost=0)["duplicates"] == 1


def _rows(rss: list[float], p99: list[float], cpu: float = 6.0) -> list[dict[str, Any]]:
    return [
        {
            "minute": i,
            "results": 12_000,
            "p99_ms": p,
            "rss_mb": {"worker1": r, "worker2": r},
            "cpu_s": {"worker1": cpu, "worker2": cpu},
        }
        for i, (r, p) in enumerate(zip(rss, p99, strict=True))
    ]


def test_the_windows_of_an_hour_are_minutes_5_to_15_and_the_last_ten() -> None:
    assert windows(60) == (range(5, 15), range(50, 60))
    early, last = windows(4)
    assert early.stop <= last.start and last.stop == 4


def test_a_steady_hour_holds_with_a_restart_spike_every_ten_minutes() -> None:
    p99 = [80.0 if i % 10 else 2_000.0 for i in range(60)]
    report = drift(_rows([200.0 + (i % 3) for i in range(60)], p99), ["worker1", "worker2"])
    assert report["held"]
    assert report["p99"]["early"] == 80.0


def test_memory_that_keeps_growing_fails_the_verdict() -> None:
    report = drift(_rows([200.0 + 2 * i for i in range(60)], [80.0] * 60), ["worker1", "worker2"])
    assert not report["held"]
    assert not report["rss_mb_worker1"]["held"]
    assert report["p99"]["held"]


def test_latency_that_creeps_up_fails_the_verdict() -> None:
    report = drift(_rows([200.0] * 60, [80.0 + 3 * i for i in range(60)]), ["worker1"])
    assert not report["p99"]["held"]
    assert report["rss_mb_worker1"]["held"]


def test_the_plan_rotates_restarts_over_the_brokers_and_fails_redis_over_at_half_time() -> None:
    plan = schedule(60, 10)
    restarts = [what for _, what in plan if what.startswith("restart")]
    assert restarts == [f"restart broker {n}" for n in (1, 2, 3, 1, 2)]
    failover = [at for at, what in plan if what == "redis failover"]
    assert failover == [2100.0], "half time falls on a restart: half an interval later"
    assert [at for at, _ in plan] == sorted(at for at, _ in plan)
