"""Batch windows against real Kafka: adaptive mode answers a lone request at once (its
fast path polls for the first record instead of waiting for a full fetch), fixed mode
holds it for the window; at a steady light rate, where adaptive mode makes nearly every
record its own batch, its commits follow the clock, not the batches, and it never
pauses."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamfer_dev.demo import make_requests
from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import scrape_metrics, wait_committed_to_end

pytestmark = pytest.mark.integration

WINDOW_MS = 8000  # far longer than any request takes, so the two modes cannot be confused


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
def test_lone_requests_wait_for_the_window_only_in_fixed_mode(
    mode: str,
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    # a poll timeout as long as the window: without the fast path a lone request would
    # wait in consume() for a full batch or all of it
    config = write_config(t, max_wait_ms=WINDOW_MS, top=f"poll_timeout_ms = {WINDOW_MS}")
    env = {"STREAMFER_PIPELINES__0__BATCH__MODE": mode}
    worker = WorkerProcess(config, tmp_path / "worker.log", env).start()
    try:
        wait_for_assignment([worker], 2, timeout=60)
        requests, good, _ = make_requests(5, entities, 0.0, seed=11)
        produce_requests(kafka_bootstrap, t.requests, requests, rate=3)  # one every 0.33 s
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, timeout=60)
    finally:
        code = worker.terminate()

    assert code == 0
    assert outcomes.lost(good) == []
    latencies = outcomes.latencies_ms
    assert len(latencies) == len(good)
    if mode == "adaptive":
        # fetched and handed to the idle model at once: nowhere near the window
        assert max(latencies) < 2000, latencies
    else:
        # all five joined the batch the first one opened, which closed after the window
        assert min(latencies) > WINDOW_MS - 2000, latencies


def test_adaptive_mode_at_a_steady_rate_commits_on_the_clock_and_never_pauses(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """One commit per tiny batch once sent hundreds a second; their answers fell behind
    and the worker paused every partition for seconds with nothing in flight."""
    t = fresh_topics(4)
    port = free_port()
    config = write_config(t, top="commit_interval_ms = 100")
    env = {
        "STREAMFER_PIPELINES__0__BATCH__MODE": "adaptive",
        "STREAMFER_METRICS__PORT": str(port),
    }
    worker = WorkerProcess(config, tmp_path / "worker.log", env).start()
    try:
        wait_for_assignment([worker], 4, timeout=60)
        before = _totals(port)
        started = time.monotonic()
        requests, good, _ = make_requests(2_400, entities, 0.0, seed=36)
        produce_requests(kafka_bootstrap, t.requests, requests, rate=400)  # 6 s
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, timeout=60)
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests, timeout=30)
        after = _totals(port)
        elapsed = time.monotonic() - started
        assert worker.alive()
    finally:
        code = worker.terminate()
    log = worker.log_text()
    assert code == 0, log[-3000:]
    assert outcomes.lost(good) == [], log[-3000:]
    assert "backpressure:" not in log, log[-3000:]
    commits = after["streamfer_commits_total"] - before["streamfer_commits_total"]
    batches = after["streamfer_batches_total"] - before["streamfer_batches_total"]
    assert 0 < commits <= elapsed * 10 + 2, (commits, batches, elapsed)


def _totals(port: int) -> dict[str, float]:
    """Each counter summed over its labels."""
    totals: dict[str, float] = {"streamfer_commits_total": 0.0, "streamfer_batches_total": 0.0}
    for (name, _labels), value in scrape_metrics(port).items():
        if name in totals:
            totals[name] += value
    return totals
