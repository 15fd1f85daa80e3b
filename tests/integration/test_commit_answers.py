"""The broker's answers to a running worker's asynchronous commits reach its committer.

A commit left unanswered for long counts its records as in flight, so a worker whose
answers were lost would reach its in-flight bound after a few commits and pause for
good. Here one worker serves many times its bound in small batches: every request must
be answered, and its commits must end confirmed while it still runs (not only by the
synchronous commit of its shutdown)."""

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
from tests.integration.helpers import wait_committed_to_end

pytestmark = pytest.mark.integration


def test_a_worker_committing_far_past_its_bound_keeps_serving(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    # bound: 2 batches of 8 = 16 records; 1,500 requests are about 190 commits
    config = write_config(t, max_batch_size=8, max_wait_ms=5, top="max_in_flight_batches = 2")
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 2, timeout=60)
        requests, good, _ = make_requests(1_500, entities, 0.0, seed=21)
        produce_requests(kafka_bootstrap, t.requests, requests, rate=300)
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, timeout=60)
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests, timeout=30)
        assert worker.alive()
    finally:
        code = worker.terminate()
    log = worker.log_text()
    assert code == 0, log[-3000:]
    assert outcomes.lost(good) == [], log[-3000:]
    assert "rejected" not in log, log[-3000:]
