"""Two worker processes on a 4-partition topic serve 20,000 requests, some of them bad."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streamfer_dev.demo import make_requests
from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from tests.conftest import Topics
from tests.integration.helpers import EXTRA_BAD, assert_committed_to_end, assert_valid, validator

pytestmark = pytest.mark.integration


def test_two_workers_serve_every_request_and_dead_letter_every_bad_one(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(t, max_batch_size=128, max_wait_ms=10)
    requests, good, bad_tags = make_requests(20_000, entities, 0.01, seed=3)
    extra_codes = {}
    for name, (value, code) in EXTRA_BAD.items():
        requests.append((f"extra-{name}", b"k", value))
        extra_codes[f"extra-{name}"] = code
    bad_tags |= set(extra_codes)

    workers = [WorkerProcess(config, tmp_path / f"worker-{i}.log").start() for i in range(2)]
    try:
        wait_for_assignment(workers, 4, timeout=60)
        positions = produce_requests(kafka_bootstrap, t.requests, requests)
        bad_positions = {positions[tag] for tag in bad_tags}
        outcomes = collect_outcomes(
            kafka_bootstrap,
            t.results,
            t.dead_letters,
            good,
            bad_positions,
            timeout=120,
            keep_docs=True,
        )
    finally:
        codes = [w.terminate() for w in workers]
    logs = "\n".join(w.log_text()[-2000:] for w in workers)
    assert codes == [0, 0], logs

    assert outcomes.lost(good, bad_positions) == []
    assert outcomes.duplicates() == 0
    assert set(outcomes.results) == good
    assert set(outcomes.dead_letters) == bad_positions

    by_position = {
        f"{d['source']['topic']}/{d['source']['partition']}/{d['source']['offset']}": d
        for d in outcomes.dead_letter_docs
    }
    for tag, code in extra_codes.items():
        doc = by_position[positions[tag]]
        assert doc["code"] == code, doc
        assert doc["reason"]
    oversized = by_position[positions["extra-oversized"]]
    assert oversized["value_b64"] is None and oversized["value_bytes"] > 65_536
    truncated = by_position[positions[sorted(bad_tags - set(extra_codes))[0]]]
    assert truncated["value_b64"] is not None or truncated["value_bytes"] == 0

    result_schema, dead_schema = validator("result"), validator("dead-letter")
    for doc in outcomes.result_docs[::7]:
        assert_valid(result_schema, doc)
        assert doc["model"] == {"name": "breast-cancer-rf", "version": "1"}  # no details asked
        assert "timings_ms" not in doc and doc["pipeline"] == "demo" and doc["request_ts_ms"] > 0
        assert doc["outputs"]["label"] in (0, 1)
        assert abs(sum(doc["outputs"]["scores"]) - 1.0) < 1e-4
    for doc in outcomes.dead_letter_docs:
        assert_valid(dead_schema, doc)

    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)
    _assert_result_headers(kafka_bootstrap, t.results, t.requests)


def _assert_result_headers(bootstrap: str, results: str, requests: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "headers-check"})
    try:
        consumer.assign([TopicPartition(results, 0, OFFSET_BEGINNING)])
        msgs = consumer.consume(5, 10)
        assert msgs
        for msg in msgs:
            headers = dict(msg.headers() or [])
            assert headers["streamfer.source_topic"] == requests.encode()
            assert int(headers["streamfer.source_offset"]) >= 0
            assert headers["streamfer.request_id"].startswith(b"r")
            assert msg.key() is not None
    finally:
        consumer.close()
