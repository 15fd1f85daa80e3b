"""``streamfer check`` asks the cluster too: metadata, every topic, the group, and the
producer (transactions in exactly-once mode), one line per check, against real Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import streamfer

pytestmark = pytest.mark.integration


def test_check_names_every_kafka_check_it_passed(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    t = fresh_topics(3)
    path = write_config(t)
    proc = streamfer("check", "--config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ok: pipeline demo" in out
    assert "ok: pipeline demo model: input X tensor(float)[batch, 30] <- f0 (lookup entity" in out
    assert "ok: pipeline demo model: output scores <- probabilities" in out
    assert "ok: kafka: " in out and "1 brokers" in out
    assert f"ok: topic {t.requests}: request topic of demo, 3 partitions" in out
    assert f"ok: topic {t.results}: result topic of demo" in out
    assert f"ok: topic {t.dead_letters}: dead-letter topic of demo" in out
    assert f"ok: group {t.group}: " in out
    assert "ok: producer: connects with the producer settings" in out

    as_json = streamfer("check", "--config", str(path), "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = orjson.loads(as_json.stdout)
    assert doc["ok"] is True
    assert [c["name"] for c in doc["checks"]] == [
        "pipeline demo",
        # its input, its label and scores outputs, and the provider that serves it
        *["pipeline demo model"] * 4,
        "kafka",
        f"topic {t.requests}",
        f"topic {t.results}",
        f"topic {t.dead_letters}",
        f"group {t.group}",
        "producer",
    ]


def test_check_fails_naming_kafka_when_nothing_answers(
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    port = free_port()  # nothing listens there
    path = write_config(t)
    path.write_text(path.read_text().replace(kafka_bootstrap, f"127.0.0.1:{port}"))
    started = time.monotonic()
    proc = streamfer("check", "--config", str(path), "--kafka-timeout", "2")
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ok: pipeline demo" in proc.stdout  # the model and Redis were fine
    assert f"FAIL: kafka: 127.0.0.1:{port} did not answer within 2s" in proc.stdout
    assert "ok: topic" not in proc.stdout
    assert "streamfer check: failed: kafka" in proc.stderr
    assert proc.stderr.count("Connection refused") <= 1, proc.stderr  # no librdkafka spam
    assert took < 30

    skipped = streamfer("check", "--config", str(path), "--skip-kafka")
    assert skipped.returncode == 0, skipped.stderr
    assert "kafka" not in skipped.stdout


def test_check_fails_naming_a_missing_topic(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    t = fresh_topics(1)
    missing = replace(t, dead_letters=f"{t.dead_letters}-missing")
    path = write_config(missing)
    proc = streamfer("check", "--config", str(path), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc["ok"] is False
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert failed == [
        {
            "name": f"topic {missing.dead_letters}",
            "ok": False,
            "detail": "dead-letter topic of demo: does not exist",
        }
    ]
    assert f"failed: topic {missing.dead_letters}" in proc.stderr


def test_check_initialises_transactions_in_exactly_once_mode(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    t = fresh_topics(1)
    path = write_config(t, top='delivery = "exactly-once"\n')
    proc = streamfer("check", "--config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: producer: transactions initialise" in proc.stdout
