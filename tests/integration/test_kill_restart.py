"""SIGKILL one of two workers mid-stream and restart it: every request still gets a result."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamfer_dev.demo import make_requests
from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end

pytestmark = pytest.mark.integration


def test_sigkill_mid_stream_then_restart_loses_nothing(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(t, max_batch_size=64, max_wait_ms=10, session_timeout_ms=6000)
    requests, good, _ = make_requests(20_000, entities, 0.0, seed=5)
    workers = [WorkerProcess(config, tmp_path / f"worker-{i}.log").start() for i in range(2)]
    positions: dict[str, str] = {}

    def produce() -> None:
        positions.update(produce_requests(kafka_bootstrap, t.requests, requests, rate=2500))

    producer = threading.Thread(target=produce)
    restarted: WorkerProcess | None = None
    try:
        wait_for_assignment(workers, 4, timeout=60)
        producer.start()
        # Let results flow, then kill one worker while it is in the middle of the stream.
        partial = collect_outcomes(
            kafka_bootstrap,
            t.results,
            t.dead_letters,
            {f"r{n}" for n in range(3000)},
            timeout=60,
        )
        assert len(partial.results) >= 3000
        workers[0].kill()
        killed_log = workers[0].log_text()
        time.sleep(1.0)
        restarted = WorkerProcess(config, tmp_path / "worker-restarted.log").start()
        producer.join(120)
        assert not producer.is_alive()
        outcomes = collect_outcomes(
            kafka_bootstrap, t.results, t.dead_letters, good, timeout=120, outcomes=Outcomes()
        )
    finally:
        producer.join(120)
        codes = [w.terminate() for w in [*workers[1:], *([restarted] if restarted else [])]]
        workers[0].kill()

    assert "stopped cleanly" not in killed_log
    assert codes == [0, 0]
    assert outcomes.lost(good) == []
    assert len(positions) == len(requests)
    # At-least-once: a kill may repeat what the killed worker had not committed, no more.
    # Bound: 4 batches in flight of 64 records each, plus the batches whose asynchronous
    # commit was still travelling when the process died (one commit per loop turn).
    assert outcomes.duplicates() <= 2 * 4 * 64, outcomes.duplicates()
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)
