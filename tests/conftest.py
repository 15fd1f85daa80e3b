"""Shared fixtures: real Apache Kafka and redis-server for the whole session.

They are started from the project's own code (``streamfer_dev.stack``) unless
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` point at existing ones. Each test gets
fresh topics and a fresh consumer group from the factory fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from streamfer_dev.harness import worker_config_toml
from streamfer_dev.kafka_cluster import KafkaCluster, start_kafka_cluster
from streamfer_dev.modelgen import DemoModel, make_classifier, seed_entities
from streamfer_dev.stack import local_kafka, local_redis
from worker.kafka.topics import ensure_topics


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with local_kafka() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with local_redis() as url:
        yield url


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three KRaft nodes (replication factor 3, min.insync.replicas 2), started once for
    the session by the first test that asks for them; no other test pays for them."""
    cluster = start_kafka_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return make_classifier(tmp_path_factory.mktemp("model") / "classifier.onnx")


@pytest.fixture(scope="session")
def entities(redis_url: str, model: DemoModel) -> list[str]:
    """Entity ids whose feature hashes are in Redis (``features:<id>``)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return seed_entities(client, model, prefix="it-")
    finally:
        client.close()


@dataclass(frozen=True)
class Topics:
    requests: str
    results: str
    dead_letters: str
    group: str


@pytest.fixture
def fresh_topics(kafka_bootstrap: str) -> Callable[..., Topics]:
    """Factory: new request/result/dead-letter topics and a new group name per call."""

    def make(partitions: int = 4) -> Topics:
        tag = uuid.uuid4().hex[:10]
        t = Topics(f"req-{tag}", f"res-{tag}", f"dlq-{tag}", f"group-{tag}")
        ensure_topics(
            kafka_bootstrap,
            [(t.requests, partitions), (t.results, partitions), (t.dead_letters, 1)],
        )
        return t

    return make


@pytest.fixture
def write_config(
    kafka_bootstrap: str, redis_url: str, model: DemoModel, tmp_path: Path
) -> Callable[..., Path]:
    """Factory: a one-pipeline worker config for ``topics``; keywords override defaults."""

    def write(topics: Topics, name: str = "worker.toml", **overrides: Any) -> Path:
        path = tmp_path / name
        path.write_text(
            worker_config_toml(
                bootstrap=kafka_bootstrap,
                redis_url=redis_url,
                group=topics.group,
                request_topic=topics.requests,
                result_topic=topics.results,
                dead_letter_topic=topics.dead_letters,
                model_path=model.path,
                fields=model.fields,
                **overrides,
            )
        )
        return path

    return write
