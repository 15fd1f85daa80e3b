"""Batch windows against real Kafka: adaptive mode answers a lone request at once (its
fast path polls for the first record instead of waiting for a full fetch), fixed mode
holds it for the window."""

from __future__ import annotations

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
from tests.conftest import Topics

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
