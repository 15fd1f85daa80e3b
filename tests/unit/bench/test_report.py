"""The benchmark's latency targets come from figures of the same run."""

from __future__ import annotations

from benchmarks.report import format_table, latency_targets


def test_targets_from_passthrough_and_model_times() -> None:
    results = {
        "streamfer": {"p50_ms": 12.0, "p99_ms": 150.0},
        "passthrough": {"p50_ms": 6.0, "p99_ms": 80.0},
        "ort_alone": {"p50_ms": 4.0, "batch": 256},
    }
    by_batch = [{"batch": 1, "p50_ms": 0.5}, {"batch": 256, "p50_ms": 4.0}]
    targets = latency_targets(results, by_batch, max_wait_ms=20.0)
    assert targets is not None
    assert targets["p99_limit_ms"] == 80.0 + 20.0 + 3 * 4.0 + 10.0
    assert targets["p99_met"] is False
    assert targets["lone_p50_limit_ms"] == 6.0 + 0.5 + 5.0
    assert targets["lone_p50_met"] is False
    results["streamfer"] = {"p50_ms": 11.0, "p99_ms": 120.0}
    met = latency_targets(results, by_batch, max_wait_ms=20.0)
    assert met is not None and met["p99_met"] and met["lone_p50_met"]


def test_no_targets_without_the_figures_they_need() -> None:
    assert latency_targets({"streamfer": {"p50_ms": 1.0, "p99_ms": 2.0}}, [], 20.0) is None


def _report(**extra: object) -> dict[str, object]:
    return {
        "date": "2026-11-29 21:00 UTC",
        "commit": "abc1234",
        "worktree_dirty": False,
        "model": "light",
        "model_text": "16-tree random forest",
        "mode": "steady",
        "rate": 10_000.0,
        "records": 100_000,
        "partitions": 4,
        "layout": "packed",
        "batch_mode": "fixed",
        "max_batch_size": 256,
        "max_wait_ms": 20.0,
        "max_in_flight_batches": None,
        "source_headers": True,
        "broker": "Apache Kafka 4.1.1",
        "cpus": 2,
        "loadavg_1m": [0.5, 1.5],
        "warmup_s": 3.0,
        "results": {},
        "ratios": {},
        **extra,
    }


def test_header_says_whether_the_broker_was_warmed() -> None:
    warmed = format_table(_report(broker_warmup={"records": 20_000, "rps": 60_000.0, "lost": 0}))
    assert "Apache Kafka 4.1.1, warmed with 20,000 passthrough records;" in warmed
    cold = format_table(_report())
    assert "warmed" not in cold
    assert "Apache Kafka 4.1.1; 2 CPUs" in cold
    failed = format_table(
        _report(broker_warmup={"records": 20_000, "rps": 0.0, "lost": 20_000, "error": "stalled"})
    )
    assert "Apache Kafka 4.1.1, broker warm-up failed (stalled);" in failed


def test_ceiling_row_shows_both_timings() -> None:
    row = {
        "rps": 14_000.0,
        "p50_ms": 18.0,
        "p95_ms": 19.0,
        "p99_ms": 20.0,
        "lost": 0,
        "batch": 256,
        "rps_before": 12_000.0,
        "rps_after": 14_000.0,
    }
    table = format_table(_report(results={"ort_alone": row}))
    assert "the faster of 12,000/s before the Kafka contenders and 14,000/s after" in table


def test_two_processes_are_compared_with_one() -> None:
    from benchmarks.report import ratios

    got = ratios(
        {
            "streamfer": {"rps": 20_000.0},
            "streamfer_2w": {"rps": 25_000.0},
            "streamfer_2p": {"rps": 30_000.0},
        }
    )
    assert got["streamfer_2p_vs_streamfer"] == 1.5
    assert got["streamfer_2p_vs_streamfer_2w"] == 1.2
    assert ratios({"streamfer": {"rps": 20_000.0}})["streamfer_2p_vs_streamfer"] is None


def test_a_supervisor_log_tells_each_worker_assignment_apart() -> None:
    from benchmarks.contenders import _owned

    log = "\n".join(
        [
            "2026-12-01 20:14:03 INFO [100] worker.ops.supervisor: process 0 started: pid 101",
            "2026-12-01 20:14:10 INFO [101 process 0] worker.loop.membership: "
            "assigned t[0, 1, 2, 3]; owning 4 partitions",
            "2026-12-01 20:14:11 INFO [102 process 1] worker.loop.membership: assigned nothing;"
            " owning 0 partitions",
            "2026-12-01 20:14:11 INFO [101 process 0] worker.loop.membership: assigned nothing;"
            " owning 2 partitions",
        ]
    )
    assert _owned(log, 2) == [2, 0]
    later = "... INFO [102 process 1] x: assigned t[0, 1]; owning 2 partitions"
    assert _owned(f"{log}\n{later}", 2) == [2, 2]
    assert _owned("ready: owning 3 partitions\nready: owning 4 partitions", 1) == [4]


def test_the_baseline_is_compared_in_records_per_second_and_cpu() -> None:
    from benchmarks.report import ratios

    got = ratios(
        {
            "streamfer": {"rps": 18_000.0, "cpu_s_per_10k": 0.45},
            "streamfer_baseline": {"rps": 20_000.0, "cpu_s_per_10k": 0.5},
            "batch_loop": {"rps": 12_000.0, "cpu_s_per_10k": 0.6},
        }
    )
    assert got["streamfer_vs_baseline"] == 0.9
    assert got["cpu_per_10k_streamfer_over_baseline"] == 0.9
    assert got["streamfer_vs_batch_loop"] == 1.5
    assert got["cpu_per_10k_streamfer_over_batch_loop"] == 0.75


def test_long_contender_names_keep_the_columns_aligned() -> None:
    row = {"rps": 1_000.0, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "lost": 0}
    table = format_table(
        _report(results={"streamfer": row, "streamfer_baseline": row}, baseline="5c4ec1e")
    )
    assert "commit abc1234; streamfer_baseline is 5c4ec1e" in table
    rows = [ln for ln in table.splitlines() if "1,000" in ln]
    assert len(rows) == 2 and rows[0].index("1,000") == rows[1].index("1,000")
