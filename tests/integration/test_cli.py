"""The command line as an operator meets it: bad config, ``check`` and burst mode."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, streamfer

pytestmark = pytest.mark.integration


def test_bad_config_exits_2_naming_the_field(tmp_path: Path, model: DemoModel) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"""
[kafka]
auto_offset_reset = "sometimes"
[[pipelines]]
name = "p"
request_topics = ["a"]
result_topic = "b"
dead_letter_topic = "c"
[pipelines.features]
fields = ["f0"]
[pipelines.model]
path = "{model.path}"
name = "m"
""")
    proc = streamfer("run", "--config", str(path))
    assert proc.returncode == 2
    assert "kafka.auto_offset_reset" in proc.stderr
    assert "'earliest'" in proc.stderr


def test_missing_model_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("""
[[pipelines]]
name = "p"
request_topics = ["a"]
result_topic = "b"
dead_letter_topic = "c"
[pipelines.features]
fields = ["f0"]
[pipelines.model]
path = "no/such/model.onnx"
name = "m"
""")
    proc = streamfer("check", "--config", str(path))
    assert proc.returncode == 2
    assert "pipelines[0].model.path" in proc.stderr
    assert "model.onnx" in proc.stderr


def test_check_then_burst_run_serves_backlog_and_commits(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    path = write_config(t)
    check = streamfer("check", "--config", str(path))
    assert check.returncode == 0, check.stderr
    assert "ok: pipeline demo" in check.stdout
    assert "one batch through decode, enrich, infer and encode" in check.stdout
    # the demo config dead-letters an unknown entity, and the probe entity is unknown
    assert "the lookup of a probe entity gave dead letter unknown_entity" in check.stdout

    ids = {f"b{i}" for i in range(500)}
    produce_requests(
        kafka_bootstrap,
        t.requests,
        [
            (i, None, f'{{"id": "{i}", "entity": "{entities[n % 50]}"}}'.encode())
            for n, i in enumerate(sorted(ids))
        ],
    )
    run = streamfer("run", "--config", str(path), "--burst-idle-s", "3", timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=30)
    assert outcomes.lost(ids) == []
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_metrics_endpoint_counts_records_results_and_dead_letters(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    port = free_port()
    path = write_config(
        t,
        top="statistics_interval_ms = 500",
        extra=f'[metrics]\nhost = "127.0.0.1"\nport = {port}\n',
    )
    worker = WorkerProcess(path, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 2, timeout=60)
        good = [
            (f"m{i}", None, f'{{"id": "m{i}", "entity": "{entities[i]}"}}'.encode())
            for i in range(200)
        ]
        positions = produce_requests(kafka_bootstrap, t.requests, [*good, ("bad", None, b"{")])
        outcomes = collect_outcomes(
            kafka_bootstrap,
            t.results,
            t.dead_letters,
            {g[0] for g in good},
            {positions["bad"]},
            timeout=60,
        )
        assert len(outcomes.results) == 200
        # lag is reported from librdkafka statistics and falls to zero once drained
        deadline = time.monotonic() + 30
        while True:
            samples = _scrape(port)
            lags = [v for (name, _), v in samples.items() if name == "streamfer_consumer_lag"]
            if lags and not any(lags):  # an empty partition reports no lag at all
                break
            assert time.monotonic() < deadline, f"lag never reached zero: {lags}"
            time.sleep(0.5)
    finally:
        assert worker.terminate() == 0, worker.log_text()[-2000:]
    for stage in ("queue", "decode", "enrich", "infer", "publish", "commit"):
        key = ("streamfer_stage_seconds_count", (("pipeline", "demo"), ("stage", stage)))
        assert samples[key] > 0, stage
    assert samples[("streamfer_end_to_end_seconds_count", (("pipeline", "demo"),))] > 0
    assert samples[("streamfer_seconds_to_drain", ())] == 0
    assert samples[("streamfer_ready", ())] in (0.0, 1.0)
    assert samples[("streamfer_records_total", (("pipeline", "demo"),))] == 201
    assert samples[("streamfer_results_total", (("pipeline", "demo"),))] == 200
    key = ("streamfer_dead_letters_total", (("code", "invalid_json"), ("pipeline", "demo")))
    assert samples[key] == 1
