"""A share worker that holds a poll longer than ``max.poll.interval.ms`` (each batch
takes 1.5 s in a hook, as a model fault hold or a Redis wait would) leaves the group
in librdkafka's eyes after every poll; it goes on serving, answers every request once
and the broker serves none of its finished records again."""

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
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import scrape_metrics
from tests.integration.share_hooks import SLOW_S_ENV

pytestmark = pytest.mark.integration


def test_a_worker_holding_polls_past_the_poll_interval_serves_each_request_once(
    entities: list[str],
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    hooks = '[pipelines.hooks]\nprepare = "tests.integration.share_hooks:slow_prepare"'
    config = write_config(
        t,
        max_batch_size=16,
        max_wait_ms=10,
        share_group=True,
        top="statistics_interval_ms = 1000\nmax_in_flight_batches = 2",
        kafka_extra="max_poll_interval_ms = 1000",
        extra=hooks,
    )
    port = free_port()
    requests, good, _ = make_requests(96, entities, 0.0, seed=53)
    worker = WorkerProcess(
        config,
        tmp_path / "worker.log",
        env={"STREAMFER_METRICS__PORT": str(port), SLOW_S_ENV: "1.5"},
    ).start()
    try:
        wait_for_assignment([worker], 1, timeout=60, shared=True)
        produce_requests(kafka_bootstrap, t.requests, requests, rate=200)
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, timeout=90)
        redelivered = sum(
            value
            for (name, _labels), value in scrape_metrics(port).items()
            if name == "streamfer_share_redeliveries_total"
        )
    finally:
        code = worker.terminate()
    log = worker.log_text()
    assert "max_poll_interval_ms" in log, "no poll outlived the interval: proves nothing"
    assert code == 0, log[-3000:]
    assert outcomes.lost(good) == [], log[-3000:]
    assert outcomes.duplicates() == 0
    assert not outcomes.dead_letters
    assert redelivered == 0
