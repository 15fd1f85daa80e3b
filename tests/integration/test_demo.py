"""``streamfer demo`` runs the whole job on its own stack, on Tansu and on Apache Kafka."""

from __future__ import annotations

import os

import orjson
import pytest

from tests.integration.helpers import streamfer

pytestmark = pytest.mark.integration

KEYS = {
    "records",
    "results",
    "lost",
    "duplicates",
    "dead_letters",
    "throughput_rps",
    "p50_ms",
    "p99_ms",
    "broker",
    "share_group",
}


@pytest.mark.parametrize("broker", ["tansu", "kafka"])
def test_demo_streams_every_request_through_two_workers(broker: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS",)}
    proc = streamfer(
        "demo",
        "--broker",
        broker,
        "--records",
        "3000",
        "--workers",
        "2",
        "--json",
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == KEYS
    assert report["broker"] == broker
    assert report["records"] == 3000
    assert report["lost"] == 0
    assert report["duplicates"] == 0
    assert report["dead_letters"] == 30  # the demo's 1% of deliberately bad requests
    assert report["results"] == 3000 - 30
    assert report["throughput_rps"] > 0
    assert 0 < report["p50_ms"] <= report["p99_ms"]
